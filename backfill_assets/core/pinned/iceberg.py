"""An Iceberg table as a pinned source: the pin is the snapshot id (core.pinned.source)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from backfill_assets.core.duck import copy_batches
from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.iceberg import IcebergLakeTable
from backfill_assets.core.lake.iceberg_partitions import iceberg_filter
from backfill_assets.core.lake.lake_files import files_digest, plain_iceberg_files, task_files
from backfill_assets.core.lake.parts import Part, part_label
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import SOURCE_ROWS, LakeSource, in_windows, plan_again, quoted, spans_in
from backfill_assets.core.spec import IcebergSourceSpec
from backfill_assets.core.vocabulary import PartitionValue

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


class IcebergSource(LakeSource):
    def __init__(self, spec: IcebergSourceSpec, catalog_url: Any) -> None:
        self.table = IcebergLakeTable(spec.table, spec.catalog.name, spec.catalog.warehouse, catalog_url,
                                      "the spec's database" if spec.catalog.uri_env is None else spec.catalog.uri_env)
        self.name = f"iceberg:{spec.catalog.name}:{spec.table}"

    def _handle(self) -> Any:
        handle = self.table.open()
        if handle is None:
            raise SpecError(f"source {self.name} does not exist in its catalog; check source.table and source.catalog")
        return handle

    def _filter(self, partition_key: str, values: Sequence[Part]) -> Any:
        if spans_in(values):  # windows: ranges of the column
            return iceberg_filter(partition_key, values)
        from pyiceberg.expressions import In
        return In(partition_key, list(values))

    def latest(self, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        snapshot = self._handle().current_snapshot()
        return Pin("none" if snapshot is None else str(snapshot.snapshot_id))

    def _tasks(self, handle: Any, pin: Pin, partition_key: str, values: Sequence[Part]) -> list[Any]:
        if pin.version == "none":
            return []
        return list(handle.scan(snapshot_id=int(pin.version), row_filter=self._filter(partition_key, values)).plan_files())

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            return "the snapshot was expired"
        try:
            tasks = self._tasks(handle, pin, partition_key, values)
        except Exception as err:  # noqa: BLE001 - a manifest that cannot be read is the answer
            return f"its manifests cannot be read: {err.__class__.__name__}"
        for path in (p for task in tasks for p in task_files(task)):
            if not Path(local_path(path)).exists():
                return f"file {path} is gone"
        return None

    def _pinned(self, duck: DuckDBPyConnection, pin: Pin) -> Any | None:
        """The table's handle, its pinned snapshot still there; None for a pin of a table without
        a snapshot, whose empty rows are then registered as :data:`SOURCE_ROWS`."""
        # The step checked the pin's files (unreadable); only an expiry since then is looked for here.
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            raise plan_again(self.name, pin, "the snapshot was expired")
        if pin.version == "none":
            duck.register(SOURCE_ROWS, handle.schema().as_arrow().empty_table())
            return None
        return handle

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[Part]) -> None:
        handle = self._pinned(duck, pin)
        if handle is not None:
            scan = handle.scan(snapshot_id=int(pin.version), row_filter=self._filter(partition_key, values))
            self._register(duck, handle, scan, (partition_key, values))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        duck.register(SOURCE_ROWS, self._handle().schema().as_arrow().empty_table())

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        handle = self._pinned(duck, pin)
        if handle is not None:
            self._register(duck, handle, handle.scan(snapshot_id=int(pin.version)), None)

    def _register(self, duck: DuckDBPyConnection, handle: Any, scan: Any,
                  wanted: tuple[str, Sequence[Part]] | None) -> None:
        """The scan's rows (of the partitions ``wanted``, where given) as :data:`SOURCE_ROWS`,
        within DuckDB's memory_limit: its files read by DuckDB where they are the rows as they
        stand (:func:`plain_iceberg_files`), else pyiceberg's batches copied in. Either way with
        the table's current column names, which inspection described (not the snapshot's)."""
        from pyiceberg.io.pyarrow import ArrowScan
        schema = handle.schema().as_arrow()
        tasks = list(scan.plan_files())
        files = plain_iceberg_files(handle.schema(), schema, tasks)
        if files is None:  # streamed into DuckDB, a batch at a time
            read = ArrowScan(handle.metadata, handle.io, handle.schema(), scan.row_filter, scan.case_sensitive)
            duck.register(SOURCE_ROWS, copy_batches(duck, f"{SOURCE_ROWS}_copy", read.to_record_batches(tasks), schema))
            return
        if not files:
            duck.register(SOURCE_ROWS, schema.empty_table())
            return
        columns = ", ".join(quoted(c) for c in schema.names)
        relation = duck.read_parquet(files, union_by_name=True).select(columns)
        if wanted is not None and spans_in(wanted[1]):  # the planned files may hold other windows' rows too
            relation = in_windows(duck, relation, wanted[0], spans_in(wanted[1]))
        elif wanted is not None:  # the planned files may hold other partitions' rows too
            key, values = wanted
            duck.register(f"{SOURCE_ROWS}_values", pa.table({"v": pa.array(list(values))}))
            relation = relation.filter(f"{quoted(key)} IN (SELECT v FROM {SOURCE_ROWS}_values)")
        duck.register(SOURCE_ROWS, relation)

    def signature(self, partition_key: str, values: Sequence[Part]) -> tuple[str, dict[str, str]]:
        pin = self.latest(partition_key, values)
        return pin.version, self.signature_at(pin, partition_key, values)

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            return {part_label(v): "unreadable" for v in values}
        # One planning per partition: its files are pruned by its value (a window: its range).
        return {part_label(v): files_digest([(p,) for t in self._tasks(handle, pin, partition_key, [v])
                                                    for p in task_files(t)])
                for v in values}

    def close(self) -> None:
        self.table.close()

