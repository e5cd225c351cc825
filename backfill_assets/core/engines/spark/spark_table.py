"""A table of the Spark session's catalog as the target (``target: {format: spark_table}``,
engine spark): a partition is replaced by writing it in full at a new location under the
table's ``_backfill_versions/`` and moving the partition there in one catalog update
(core.engines.spark.catalog). Readers that resolve the table through the catalog see the old files or
the new ones, never an empty or half-written partition, on any file system; the old location is
kept for REPLACED_GRACE and then deleted by a later write.

A write that finds the partition's location or files changed since it read them is refused
before anything is switched (TransientDatabaseError, safe to retry); the verification after the
switch reads the partition afresh through the catalog. The table must exist, partitioned by the
partition key, with its partitions in the catalog (a table created with ``PARTITIONED BY``).

With time windows (``partition_window``) the table is partitioned by each window's label, a
STRING column named after the key and the grain (``created_at_hour``,
core.engines.spark.windows.key_column) beside the spec's columns: a partition per window, its
files keeping the time stamp itself, as a Parquet folder target's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.engines.spark.parquet import _fsync_dir, partition_dir, place_arrow
from backfill_assets.core.engines.spark.windows import key_column
from backfill_assets.core.errors import SpecError, TransientDatabaseError
from backfill_assets.core.fingerprint.kinds import lake_type
from backfill_assets.core.lake.engine import LakeEngine
from backfill_assets.core.lake.parts import Part, Span, part_label
from backfill_assets.core.lake.tables import LakeTable, TableShape, signature
from backfill_assets.core.vocabulary import PartitionValue, partition_label
from backfill_assets.core.windows import Windowing

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

VERSIONS = "_backfill_versions"  # new partitions, each at a location of its own
REPLACED = "_backfill_replaced"  # notes of replaced locations, deleted after the grace
REPLACED_GRACE = 600.0


def _files(location: Path | None) -> tuple[tuple[str, int, int], ...]:
    if location is None or not location.is_dir():
        return ()
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(location.iterdir())
                 if p.is_file() and not p.name.startswith(("_", ".")))


@dataclass
class Seen:
    """The partitions a write read, each as (location, its files), loaded when first asked."""

    table: Any
    partitions: dict[str, tuple[Path | None, tuple]] = field(default_factory=dict)

    def of(self, value: Part) -> tuple[Path | None, tuple]:
        """(A window is asked for by its label, the value of the table's label column.)"""
        label = part_label(value)
        if label not in self.partitions:
            location = self.table.catalog.locations([label if isinstance(value, Span) else value])[label]
            self.partitions[label] = (location, _files(location))
        return self.partitions[label]

    @property
    def version(self) -> str:
        text = "\n".join(f"{k}\t{v[0]}\t{v[1]}" for k, v in sorted(self.partitions.items()))
        return hashlib.sha256(text.encode()).hexdigest()


def _as_spark_reads(data: pa.Table) -> pa.Table:
    """A file's rows as Spark reads them for a ``timestamp`` column: a time stamp without a zone
    in the file (INT96, Spark's default for years) is an instant in UTC."""
    for i, f in enumerate(data.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz is None:
            data = data.set_column(i, f.name, data.column(i).cast(pa.timestamp("us", tz="UTC")))
    return data


class SparkCatalogTable(LakeTable):
    """One catalog table (see the module docstring). A handle is a :class:`Seen`."""

    def __init__(self, session: SparkSession, name: str, partition_key: str, carried: bool = False) -> None:
        from backfill_assets.core.engines.spark.catalog import CatalogTable
        self.catalog = CatalogTable(session, name, partition_key)
        self.partition_key = partition_key  # what the partitions are keyed by: a value, or a window's label
        self.carried = carried  # the files keep every column (time windows); else the partition carries the key
        self.name = f"spark_table:{name}"

    def shape(self) -> TableShape | None:
        from backfill_assets.core.engines.spark.session import column_info
        if not self.catalog.exists():
            return None
        if self.catalog.provider() != "parquet":
            raise SpecError(f"{self.name} is a {self.catalog.provider() or 'non-file'} table; a spark_table target is a "
                            "Parquet table (USING parquet)")
        columns, required = [], []
        for f in self.catalog.schema().fields:
            if self.carried and f.name == self.partition_key:
                if f.dataType.simpleString() != "string":
                    raise SpecError(f"{self.name} column {f.name} is {f.dataType.simpleString()}; it holds each time "
                                    f"window's label, so declare it STRING")
                continue
            info = column_info(f.name, f.dataType.simpleString())
            if info is None:
                raise SpecError(f"{self.name} column {f.name} has Spark type {f.dataType.simpleString()}, which has "
                                "no exact counterpart in the fingerprint")
            columns.append((f.name, lake_type(info)))
            if not f.nullable:
                required.append(f.name)
        self.catalog.listed()  # refuses a table whose partitions the catalog does not keep
        return TableShape(columns, self.catalog.partitioned_by(), required, [])

    def open(self) -> Seen | None:
        return Seen(self) if self.catalog.exists() else None

    def version(self, handle: Any) -> str | None:
        return None if handle is None else handle.version

    def read(self, handle: Any, column: str, values: Sequence[Part]) -> pa.Table:
        parts = []
        for value in values:
            location, files = (None, ()) if handle is None else handle.of(value)
            tables = [_as_spark_reads(pq.read_table(location / name, coerce_int96_timestamp_unit="us"))
                      for name, _, _ in files if name.endswith(".parquet")] if location is not None else []
            if tables and self.carried:  # a window's files hold its rows whole
                parts.append(pa.concat_tables(tables, promote_options="permissive"))
            elif tables:
                data = pa.concat_tables(tables, promote_options="permissive")
                if column in data.column_names:
                    data = data.drop_columns([column])
                parts.append(data.append_column(column, pa.array([value] * data.num_rows)))
        return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})

    def read_version(self, version: str | None, column: str, values: Sequence[Part]) -> pa.Table:
        """The partitions as the catalog points at them now, read afresh."""
        return self.read(self.open(), column, values)

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        raise SpecError("records_can_move is not supported on a spark_table target")

    def create(self, schema: pa.Schema, partition_key: str, windowing: Windowing | None = None) -> str | None:
        raise SpecError(f"{self.name} does not exist; {create_first(partition_key, self.partition_key)}, so that "
                        "its location and format are yours")

    def close(self) -> None:
        pass

    def _purge(self, base: Path) -> None:
        notes = base / REPLACED
        if not notes.is_dir():
            return
        live: set[Path] | None = None
        for note in notes.glob("*.json"):
            if time.time() - note.stat().st_mtime > REPLACED_GRACE:
                old = Path(json.loads(note.read_text())["location"])
                if live is None:  # what the catalog points at now is never deleted
                    # (a label as text: Spark casts it to the partition column's type)
                    live = {p for p in self.catalog.locations(sorted(self.catalog.listed())).values() if p is not None}
                if old.is_dir() and old != base and old.is_relative_to(base) and old not in live:
                    shutil.rmtree(old, ignore_errors=True)
                note.unlink(missing_ok=True)

    SIGNAL = "catalog location and files"

    def partition_signatures(self, handle: Any, column: str, values: Sequence[Part],
                             version: str | None = None) -> dict[str, str | None] | None:
        """Each partition's location in the catalog and its files with their sizes and
        modification times (a catalog table keeps no versions: None with ``version``)."""
        if version is not None:
            return None
        return {part_label(v): signature(*((None, ()) if handle is None else handle.of(v))) for v in values}

    def versions_after(self, handle: Any, version: str) -> list[str] | None:
        return None  # a catalog table keeps no versions

    def partition_paths(self, handle: Any, value: PartitionValue) -> list[str]:
        """The data files of one partition as ``handle`` saw them (full paths)."""
        location, files = (None, ()) if handle is None else handle.of(value)
        return [] if location is None else [str(location / name) for name, _, _ in files if name.endswith(".parquet")]

    def place(self, run: str, value: PartitionValue) -> Path:
        """Where one run writes one partition in full: a new location of its own (not created)."""
        return self.catalog.location() / VERSIONS / partition_dir(self.partition_key, value) / run

    def discard(self, run: str, values: Sequence[PartitionValue], placed: Mapping[str, Path]) -> None:
        """Remove the locations a run wrote that the catalog does not point at."""
        if not placed:
            return
        live = self.catalog.locations([v for v in values if partition_label(v) in placed])
        for label, path in placed.items():
            if live.get(label) != path:
                shutil.rmtree(path, ignore_errors=True)

    def overwrite(self, handle: Any, column: str, values: Sequence[PartitionValue], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """Write each partition's rows of ``data`` from Arrow at a new location and switch them
        in (:meth:`switch_in`)."""
        run = uuid.uuid4().hex
        placed: dict[str, Path] = {}
        try:
            place_arrow(lambda value: self.place(run, value), column, values, data, placed)
            return self.switch_in(handle, column, values, placed)
        except BaseException:
            self.discard(run, values, placed)
            raise

    def switch_in(self, handle: Any, column: str, values: Sequence[PartitionValue], placed: Mapping[str, Path]) -> str | None:
        """Make each partition's new location (``placed``: label -> a location under
        ``_backfill_versions``; no data file: the partition leaves the catalog) durable and
        point the catalog at it; a partition whose location or files changed since ``handle``
        saw them is refused before anything is switched (TransientDatabaseError, safe to retry)."""
        assert handle is not None
        now = Seen(self)
        moved = [partition_label(v) for v in values if now.of(v) != handle.of(v)]
        if moved:
            raise TransientDatabaseError(f"another writer changed partition(s) {', '.join(moved)} of {self.name} since "
                                         "this run read them; nothing of ours was switched in")
        base = self.catalog.location()
        self._purge(base)
        for value in values:
            new = placed[partition_label(value)]
            old, _ = handle.of(value)
            data = [p for p in new.iterdir() if not p.name.startswith(("_", "."))] if new.is_dir() else []
            if not data:
                shutil.rmtree(new, ignore_errors=True)
                if old is not None:
                    self.catalog.drop(value)  # an emptied partition leaves the catalog
                    self._note(base, old)
                handle.partitions.pop(partition_label(value), None)
                continue
            for path in list(new.iterdir()):  # what a writer left beside the data (Spark's _SUCCESS, .crc)
                if path.name.startswith(("_", ".")) and path.is_file():
                    path.unlink()
            for path in data:
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
            _fsync_dir(new)
            self.catalog.set_location(value, new, exists=old is not None)
            if old is not None:
                self._note(base, old)
            handle.partitions.pop(partition_label(value), None)  # the handle now reads our version
        for value in values:
            handle.of(value)
        return handle.version

    def _note(self, base: Path, old: Path) -> None:
        """Keep a replaced location for REPLACED_GRACE (readers that resolved it may still read)."""
        notes = base / REPLACED
        notes.mkdir(exist_ok=True)
        (notes / f"{uuid.uuid4().hex}.json").write_text(json.dumps({"location": str(old)}))

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[PartitionValue],
                       keys: pa.Table) -> pa.Table | None:
        raise SpecError("records_can_move is not supported on a spark_table target")

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        return True


class SparkTableEngine(LakeEngine):
    """A catalog table target (core.context.TargetEngine), written by the Spark engine."""

    def inspect_table(self, conn: psycopg.Connection, inspection: Any, described: dict[str, Any]) -> None:
        """As for every lake table; a missing table is a problem (apply does not create it)."""
        super().inspect_table(conn, inspection, described)
        state = inspection.target_table
        if state is not None and not state.exists:
            inspection.problems.append(
                f"{state.table} does not exist; {create_first(self.spec.partition_key, key_column(self.spec))}")

    def table(self, conn: psycopg.Connection | None) -> LakeTable:
        from backfill_assets.core.engines.spark.session import session_for
        target = self.spec.target
        return SparkCatalogTable(session_for(self.spec), target.table, key_column(self.spec),  # type: ignore[union-attr]
                                 carried=self.spec.partition_window is not None)

    def window_partitioning(self, windowing: Windowing, shape: TableShape | None) -> list[str]:
        """A partition per window, keyed by its label (``created_at_hour``)."""
        return [key_column(self.spec)]


def create_first(partition_key: str, key: str) -> str:
    """What to create: a table partitioned by the key, or by the windows' label column."""
    if key == partition_key:
        return (f"create it first, partitioned by {partition_key} "
                "(CREATE TABLE ... USING parquet PARTITIONED BY (...))")
    return (f"create it first with the spec's columns and {key} STRING, partitioned by {key} "
            f"(CREATE TABLE ... ({partition_key} TIMESTAMP, ..., {key} STRING) USING parquet PARTITIONED BY ({key})): "
            f"a partition per time window, named by its label")
