"""A Delta Lake table as the target (``deltalake``, delta-rs).

Written with ``write_deltalake(mode="overwrite", predicate=<the partition>)`` on a handle
loaded at the version the partition was read at. delta-rs refuses rows outside the
predicate, and fails the commit (``CommitFailedError``) when another writer changed the same
partition since that version. The predicate is built here from typed, validated values only,
and compared with the one the table's history records for our version. See
core.lake.tables for what every lake table promises.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.dataset as pads

from backfill_assets.core.errors import SpecError, TransientDatabaseError, VerificationError
from backfill_assets.core.lake.delta_log import check_commit, check_files_commit, windowed
from backfill_assets.core.lake.engine import LakeEngine
from backfill_assets.core.lake.parts import Part, Span, arrow_filter, part_label
from backfill_assets.core.lake.tables import (
    LakeTable,
    TableShape,
    WrittenFile,
    among,
    commit_failed,
    key_bounds,
    local_path,
    signature,
)
from backfill_assets.core.spec import DeltaTargetSpec
from backfill_assets.core.vocabulary import PartitionValue, partition_label
from backfill_assets.core.windows import Windowing


class DeltaEngine(LakeEngine):
    """A ``format: delta`` target (core.context.TargetEngine)."""

    def table(self, conn: psycopg.Connection) -> LakeTable:
        target = self.spec.target
        assert isinstance(target, DeltaTargetSpec)
        return DeltaLakeTable(target.location)

    def window_partitioning(self, windowing: Windowing, shape: TableShape | None) -> list[str]:
        """Any: a window is a range of the column, overwritten by a predicate, whose files the
        log's statistics find. apply creates the table unpartitioned (a partition per time
        stamp value would be a folder per row)."""
        return [] if shape is None else list(shape.partitioned_by)

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """Every partition value must be one a Delta predicate can carry (built, never run here;
        a window's bounds always can).

        Raises:
            SpecError: naming the value.
        """
        if self.spec.partition_window is not None:
            return
        for value in partitions:
            delta_predicate(self.spec.partition_key, [value])


def _sql_literal(value: PartitionValue) -> str:
    """A partition value as a literal of the predicate delta-rs parses (DataFusion SQL). The
    values are typed by the spec's parser (a date, an int, or text without NUL); quotes in
    text are doubled."""
    if isinstance(value, bool):  # a bool is an int to Python; never a partition value
        raise TypeError("a boolean is not a partition value")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.date):
        return f"'{value.isoformat()}'"
    if value == "":
        raise SpecError(
            "the empty text partition cannot be written to a Delta table, which stores '' as a NULL "
            "partition value; give those rows a non-empty partition value"
        )
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
        raise SpecError(
            f"partition {value!r} contains a control character, which a Delta predicate cannot "
            "carry safely; rename the partition value"
        )
    return "'" + value.replace("'", "''") + "'"


def _bound_literal(bound: dt.date) -> str:
    """A window's bound as a literal DataFusion casts to the column's type: an instant in UTC
    (``'2024-11-03T05:00:00Z'``), a clock's reading (``'2024-11-03T01:00:00'``) or a date."""
    if isinstance(bound, dt.datetime):
        if bound.tzinfo is not None:
            return f"'{bound.astimezone(dt.timezone.utc).replace(tzinfo=None).isoformat()}Z'"
        return f"'{bound.isoformat()}'"
    return f"'{bound.isoformat()}'"


def delta_predicate(column: str, values: Sequence[Part]) -> str:
    """``"col" = v`` (one partition), ``"col" IN (v1, v2)``, or for windows ``("col" >= start
    AND "col" < end) OR ...``, from validated values only."""
    ident = '"' + column.replace('"', '""') + '"'
    spans = [v for v in values if isinstance(v, Span)]
    if spans:
        if len(spans) < len(values):
            raise TypeError("a predicate is over windows or values, not both")
        return " OR ".join(f"({ident} >= {_bound_literal(s.start)} AND {ident} < {_bound_literal(s.end)})"
                           for s in spans)
    plain = [v for v in values if not isinstance(v, Span)]
    if len(plain) == 1:
        return f"{ident} = {_sql_literal(plain[0])}"
    return f"{ident} IN ({', '.join(_sql_literal(v) for v in plain)})"


class DeltaLakeTable:
    """A Delta table on local disk.

    A partition is read from its own files only: the dataset is built from the log's file
    list pruned by the partition's predicate (delta-rs filters the list in Rust), not from a
    fragment per file of the whole table, so reading one partition does not cost the table's
    size. A version read back is loaded once and kept for the next partition of that version,
    and :meth:`open` hands out the table it loaded last while the log has no newer commit
    (a listing of the log's file names instead of loading the log again).
    """

    def __init__(self, location: str) -> None:
        self.path = local_path(location)
        self.name = f"delta table {location}"
        self._version_read: tuple[int, Any] | None = None  # the last version loaded by read_version
        # The table as open() last loaded it (a write through it moves it on), and the
        # identity of the log's newest commit file when it was handed out.
        self._latest: Any = None
        self._latest_commit: tuple[int, int, int] | None = None

    def _newest_commit(self) -> tuple[int, int, int] | None:
        """The newest version whose commit file is in the log, with that file's inode and
        modification time (a table deleted and made again up to the same version has other
        files); None: no log."""
        log = Path(self.path) / "_delta_log"
        try:
            names = os.listdir(log)
        except FileNotFoundError:
            return None
        versions = [int(name[:20]) for name in names if len(name) == 25 and name.endswith(".json") and name[:20].isdigit()]
        if not versions:
            return None
        newest = max(versions)
        try:
            found = (log / f"{newest:020d}.json").stat()
        except FileNotFoundError:  # the log moved on while it was listed: load the table
            return None
        return newest, found.st_ino, found.st_mtime_ns

    def _load(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
        try:
            return DeltaTable(self.path, version=version)
        except TableNotFoundError:
            return None

    def shape(self) -> TableShape | None:
        table = self._load()
        return None if table is None else self._shape_of(table)

    @staticmethod
    def _shape_of(table: Any) -> TableShape:
        schema = table.schema().to_arrow()
        schema = pa.schema(schema) if not isinstance(schema, pa.Schema) else schema
        metadata = table.metadata()
        constraints = [f"{k.removeprefix('delta.constraints.')} CHECK ({v})"
                       for k, v in (metadata.configuration or {}).items() if k.startswith("delta.constraints.")]
        constraints += [f"generated column {f.name}" for f in schema
                        if f.metadata and b"delta.generationExpression" in f.metadata]
        constraints += [f"invariant on column {f.name}" for f in schema
                        if f.metadata and b"delta.invariants" in f.metadata]
        return TableShape([(f.name, f.type) for f in schema], list(metadata.partition_columns),
                          [f.name for f in schema if not f.nullable], constraints)

    def open(self) -> Any:
        newest = self._newest_commit()
        if self._latest is not None and newest is not None and self._latest.version() == newest[0]:
            seen = self._latest_commit
            # The same newest commit as when it was loaded, or one it made itself since (a
            # write through it moved it on; no other writer can make the same version).
            if seen is None or seen[0] < newest[0] or seen == newest:
                self._latest_commit = newest
                return self._latest
        self._latest = self._load()
        self._latest_commit = None if self._latest is None else self._newest_commit()
        return self._latest

    def version(self, handle: Any) -> str | None:
        return None if handle is None else str(handle.version())

    def read(self, handle: Any, column: str, values: Sequence[Part]) -> pa.Table:
        # The files of these partitions only (a window's: those whose statistics of the column
        # overlap it); the row filter stays, so a file the pruning kept for any reason still
        # gives only their rows.
        dataset = handle.to_pyarrow_dataset(file_pruning_predicate=delta_predicate(column, values))
        return dataset.to_table(filter=arrow_filter(column, values))

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        return handle.to_pyarrow_dataset().to_table(columns=list(columns))

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[Part],
                       keys: pa.Table) -> pa.Table | None:
        if handle is None:
            return None
        # Rows with a NULL partition value are outside our partitions too.
        where = ~arrow_filter(column, values) | pads.field(column).is_null()
        for name, least, greatest in key_bounds(keys):
            where = where & (pads.field(name) >= least) & (pads.field(name) <= greatest)
        found = handle.to_pyarrow_dataset().to_table(columns=[column, *keys.column_names], filter=where)
        return among(found, keys)

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        # The version after ``base`` is ours (check_commit read it from the log): nothing
        # can lie between them.
        return handle is not None and base is not None and handle.version() == int(base) + 1

    def read_version(self, version: str | None, column: str, values: Sequence[Part]) -> pa.Table:
        # A version never changes: the one loaded for the last partition serves the next.
        if version is not None and self._version_read is not None and self._version_read[0] == int(version):
            return self.read(self._version_read[1], column, values)
        handle = self._load(None if version is None else int(version))
        if handle is not None and version is not None:
            self._version_read = (int(version), handle)
        if handle is None:
            raise VerificationError(", ".join(part_label(v) for v in values), "read of the committed version",
                                    f"{self.name} at version {version}", "no table")
        return self.read(handle, column, values)

    def close(self) -> None:
        pass

    def create(self, schema: pa.Schema, partition_key: str, windowing: Windowing | None = None) -> str | None:
        """Partitioned by the key's values; with time windows, not partitioned: a window is a
        range of the column, whose files the log's statistics find (a Delta table has no hidden
        partitioning, and a partition per time stamp would be a folder per row)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError
        Path(self.path).mkdir(parents=True, exist_ok=True)
        try:
            created = DeltaTable.create(self.path, schema, mode="error",
                                        partition_by=None if windowing is not None else [partition_key])
        except DeltaError as err:
            if "already exists" not in str(err):
                raise
            problem = f"creating {self.name}: another writer created it first"
        else:
            return str(created.version())
        raise TransientDatabaseError(problem)

    def overwrite(self, handle: Any, column: str, values: Sequence[Part], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str:
        from deltalake import CommitProperties, write_deltalake
        from deltalake.exceptions import CommitFailedError
        predicate = delta_predicate(column, values)
        base = handle.version()
        # Windows: the files that can hold their rows, and how many rows of each lie outside
        # them, which the commit must keep (see check_commit).
        kept = self._rows_outside(handle, column, values, predicate) if windowed(values) else None
        # Without retries delta-rs commits exactly the next version after the handle's, or
        # fails: it neither rebases over a newer version nor retries after losing the race
        # for the next one.
        properties = CommitProperties(custom_metadata=dict(metadata), max_commit_retries=0 if exclusive else None)
        try:
            write_deltalake(handle, data, mode="overwrite", predicate=predicate, commit_properties=properties)
        except CommitFailedError as err:
            raise TransientDatabaseError(
                commit_failed(self.name, values, base, exclusive, " ".join(str(err).split())[:200])
            ) from err
        version = handle.version()
        check_commit(self.path, self.name, version, column, values, predicate, metadata, kept, data.num_rows)
        return str(version)

    @staticmethod
    def _rows_outside(handle: Any, column: str, values: Sequence[Part], predicate: str) -> dict[str, int]:
        """Of the files whose statistics of ``column`` overlap the windows (those an overwrite
        where ``predicate`` may rewrite), each one's rows outside the windows, by its path in
        the log."""
        inside = arrow_filter(column, values)
        return {fragment.path: fragment.count_rows() - fragment.count_rows(filter=inside)
                for fragment in handle.to_pyarrow_dataset(file_pruning_predicate=predicate).get_fragments()}

    # -- files a build engine writes (core.lake.tables.FileLakeTable) --------------------------
    carries_partition = False  # the log carries a file's partition value

    def partition_files(self, handle: Any, column: str, values: Sequence[PartitionValue],
                        version: str | None = None) -> dict[str, list[str]] | None:
        if version is not None and handle.version() != int(version):
            handle = self._at_version(version)
        if self._unplain(handle) or list(handle.metadata().partition_columns) != [column]:
            return None
        # delta-rs prunes the log's file list by the partition's value in Rust.
        return {partition_label(v): [local_path(uri) for uri in
                                     handle.file_uris(file_pruning_predicate=delta_predicate(column, [v]))]
                for v in values}

    SIGNAL = "log files"

    def partition_signatures(self, handle: Any, column: str, values: Sequence[Part],
                             version: str | None = None) -> dict[str, str | None] | None:
        """Each partition's data files in the log (a file of a Delta table is never written
        again) and the table's schema, at the handle's version or at ``version``. A window's
        files are those whose statistics of the column overlap it, in a table not partitioned
        (a file added with rows in the window has statistics that say so, or none, and is
        listed either way)."""
        if version is not None and (handle is None or handle.version() != int(version)):
            handle = self._at_version(version)
        if handle is None:
            return dict.fromkeys((part_label(v) for v in values), None)
        protocol = handle.protocol()
        config = {k.lower(): str(v).lower() for k, v in (handle.metadata().configuration or {}).items()}
        by = [] if windowed(values) else [column]
        if ("deletionVectors" in set(protocol.reader_features or []) or config.get("delta.columnmapping.mode", "none") != "none"
                or list(handle.metadata().partition_columns) != by):
            return None  # rows hidden by deletion vectors, columns renamed, or files not by partition
        schema = handle.schema().to_json()
        return {part_label(v): signature(schema, sorted(
            local_path(uri) for uri in handle.file_uris(file_pruning_predicate=delta_predicate(column, [v]))))
            for v in values}

    def versions_after(self, handle: Any, version: str) -> list[str] | None:
        if handle is None or int(version) > handle.version():
            return None
        return [str(v) for v in range(int(version) + 1, handle.version() + 1)]

    def writable_as_files(self, handle: Any) -> bool:
        return handle is None or not self._unplain(handle)

    def _unplain(self, handle: Any) -> bool:
        """Whether a version's files are not simply its rows (deletion vectors hide rows, column
        mapping renames columns), or the table asks of a writer what delta-rs's own writer
        would do and plain files would not (constraints, generated columns, a change feed,
        append only). Such a table is read and written through delta-rs instead."""
        protocol = handle.protocol()
        writer = set(protocol.writer_features or [])
        plain_protocol = protocol.min_reader_version == 1 and (
            protocol.min_writer_version <= 2 or (protocol.min_writer_version == 7 and writer <= {"invariants"}))
        config = {k: str(v).lower() for k, v in (handle.metadata().configuration or {}).items()}
        flags = config.get("delta.enablechangedatafeed") == "true" or config.get("delta.appendonly") == "true"
        shape = self._shape_of(handle)
        return not plain_protocol or flags or bool(shape.constraints or shape.required)

    def _at_version(self, version: str) -> Any:
        """The table loaded at exactly ``version`` (kept for the next partition of it)."""
        if self._version_read is not None and self._version_read[0] == int(version):
            return self._version_read[1]
        handle = self._load(int(version))
        if handle is None:
            raise VerificationError("", "read of the committed version", f"{self.name} at version {version}", "no table")
        self._version_read = (int(version), handle)
        return handle

    def new_file(self, handle: Any, column: str, label: str, tag: str) -> tuple[str, str]:
        # A partition's folder as Hive names it, the name and value escaped (a '/' or '..' in
        # a value stays inside one folder name). delta-rs encodes the path for the log.
        folder = f"{urllib.parse.quote(column, safe='')}={urllib.parse.quote(label, safe='')}"
        name = f"part-00000-{tag}-{uuid.uuid4()}.c000.parquet"
        Path(self.path, folder).mkdir(parents=True, exist_ok=True)
        return str(Path(self.path, folder, name)), f"{folder}/{name}"

    def commit_files(self, handle: Any, column: str, values: Sequence[PartitionValue], files: Sequence[WrittenFile],
                     schema: pa.Schema, metadata: Mapping[str, str], exclusive: bool = False) -> str:
        from deltalake import CommitProperties
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction
        base = handle.version()
        now = int(time.time() * 1000)
        adds = [AddAction(f.logged, f.size, {column: f.label}, now, True, json.dumps({"numRecords": f.rows}))
                for f in files]
        properties = CommitProperties(custom_metadata=dict(metadata), max_commit_retries=0 if exclusive else None)
        try:
            handle.create_write_transaction(
                adds, "overwrite", schema, partition_by=[column],
                partition_filters=[(column, "in", [partition_label(v) for v in values])], commit_properties=properties,
            )
        except CommitFailedError as err:
            for f in files:
                Path(f.path).unlink(missing_ok=True)
            raise TransientDatabaseError(
                commit_failed(self.name, values, base, exclusive, " ".join(str(err).split())[:200])
            ) from err
        handle.update_incremental()
        version = handle.version()
        check_files_commit(self.path, self.name, version, column, values, files, metadata)
        return str(version)

# --- Apache Iceberg ---------------------------------------------------------------------------


