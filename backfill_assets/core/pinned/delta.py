"""A Delta table as a pinned source: the pin is the table version (core.pinned.source)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset as pads

from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.lake_files import delta_dataset, files_digest
from backfill_assets.core.lake.parts import Part, part_label
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import SOURCE_ROWS, LakeSource, in_windows, plan_again, quoted, spans_in
from backfill_assets.core.spec import DeltaSourceSpec
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


class DeltaSource(LakeSource):
    def __init__(self, spec: DeltaSourceSpec) -> None:
        self.path = local_path(spec.location)
        self.name = spec.display_name

    def _table(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
        try:
            return DeltaTable(self.path, version=version)
        except TableNotFoundError:
            if version is None:
                raise SpecError(f"source {self.name} is not a Delta table (no _delta_log there); check "
                                "source.location") from None
            raise
        except Exception as err:  # noqa: BLE001 - delta-rs raises several kinds for a version it cannot load
            if version is None:
                raise SpecError(f"source {self.name} cannot be read: {err.__class__.__name__}: "
                                f"{' '.join(str(err).split())[:300]}") from None
            raise

    def latest(self, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        return Pin(str(self._table().version()))

    def _at(self, pin: Pin) -> tuple[Any, str | None]:
        try:
            return self._table(int(pin.version)), None
        except Exception as err:  # noqa: BLE001 - any failure to load the version is the answer
            return None, f"{err.__class__.__name__}: {' '.join(str(err).split())[:200]}"

    def _files(self, table: Any, partition_key: str, values: Sequence[Part]) -> dict[str, list[str]]:
        """Per partition label, the data files that may hold its rows at the table's version
        (all files, where the table is not partitioned by the partition key; for a time window,
        those whose statistics of the column overlap it, or that have none)."""
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
        paths = actions.get("path", [])
        spans = spans_in(values)
        if spans:
            least = actions.get(f"min.{partition_key}") or [None] * len(paths)
            most = actions.get(f"max.{partition_key}") or [None] * len(paths)
            return {s.label: [p for p, lo, hi in zip(paths, least, most)
                              if lo is None or hi is None or (lo < s.end and hi >= s.start)] for s in spans}
        column = f"partition.{partition_key}"
        labels = [partition_label(v) for v in values]
        if column not in actions:
            return {label: list(paths) for label in labels}
        by_value = {label: [] for label in labels}
        for path, value in zip(paths, actions[column]):
            label = None if value is None else partition_label(value)
            if label in by_value:
                by_value[label].append(path)
        return by_value

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        table, why = self._at(pin)
        if table is None:
            return f"its log cannot be loaded at that version: {why}"
        for files in self._files(table, partition_key, values).values():
            for path in files:
                full = Path(self.path) / urllib.parse.unquote(path) if "://" not in path else Path(local_path(path))
                if not full.exists():
                    return f"data file {path} is gone (vacuumed?)"
        return None

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[Part]) -> None:
        table, why = self._at(pin)
        if table is None:
            raise plan_again(self.name, pin, why or "")
        self._register(duck, table, partition_key, values)

    def _register(self, duck: DuckDBPyConnection, table: Any, partition_key: str | None,
                  values: Sequence[Part] | None) -> None:
        """The version's rows (of the partitions ``values``, where given) as :data:`SOURCE_ROWS`,
        read by DuckDB's own Parquet reader, within its memory_limit (an Arrow dataset's scanner
        decodes whole row groups outside it, several at once). The partition columns' values
        come from the log, joined to each file by its name; a table with a reader feature that
        delta-rs cannot read as plain files is refused first (:func:`_dataset`)."""
        schema = delta_dataset(table, self.name).schema
        partitioned = list(table.metadata().partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True))
        files = [str(Path(self.path) / urllib.parse.unquote(p) if "://" not in p else Path(local_path(p)))
                 for p in actions.column("path").to_pylist()]
        meta = pa.table({"__file": pa.array(files, pa.string()),
                         **{c: actions.column(f"partition.{c}") for c in partitioned}})
        spans = spans_in(values or [])
        if partition_key is not None and spans:  # the files whose statistics can hold the windows
            kept = {p for found in self._files(table, partition_key, spans).values() for p in found}
            meta = meta.filter(pa.array([p in kept for p in actions.column("path").to_pylist()]))
        elif partition_key is not None and values is not None and partition_key in partitioned:
            meta = meta.filter(pads.field(partition_key).isin(list(values)))
        if meta.num_rows == 0:
            duck.register(SOURCE_ROWS, schema.empty_table())
            return
        name = f"{SOURCE_ROWS}_files"
        duck.register(name, meta)
        data = duck.read_parquet(meta.column("__file").to_pylist(), filename=True, union_by_name=True)
        columns = ", ".join(f"m.{quoted(c)}" if c in partitioned else f"f.{quoted(c)}" for c in schema.names)
        relation = data.set_alias("f").join(duck.table(name).set_alias("m"), "f.filename = m.__file").select(columns)
        if partition_key is not None and spans:
            relation = in_windows(duck, relation, partition_key, spans)
        elif partition_key is not None and values is not None and partition_key not in partitioned:
            wanted = f"{SOURCE_ROWS}_values"  # a table not partitioned by the key: its rows are filtered
            duck.register(wanted, pa.table({"v": pa.array(list(values))}))
            relation = relation.filter(f"{quoted(partition_key)} IN (SELECT v FROM {wanted})")
        duck.register(SOURCE_ROWS, relation)

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        duck.register(SOURCE_ROWS, delta_dataset(self._table(), self.name).schema.empty_table())

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        table, why = self._at(pin)
        if table is None:
            raise plan_again(self.name, pin, why or "")
        self._register(duck, table, None, None)

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        table, why = self._at(pin)
        if table is None:
            return {part_label(v): "unreadable" for v in values}
        return {label: files_digest([(f,) for f in found])
                for label, found in self._files(table, partition_key, values).items()}

    def signature(self, partition_key: str, values: Sequence[Part]) -> tuple[str, dict[str, str]]:
        table = self._table()
        files = self._files(table, partition_key, values)
        return str(table.version()), {label: files_digest([(f,) for f in found]) for label, found in files.items()}

