"""Apply's target on DuckDB (:class:`DuckLakeTarget`), and its write into a Delta table as
files (core.lake.tables.FileLakeTable): no row of the partition passes through Python, and
everything that holds rows runs inside DuckDB's ``memory_limit``.

- The partition of stage A is written by DuckDB as one Parquet file in the table's folder, in
  business-key order, without the partition column (the log carries its value).
- That file is fingerprinted by DuckDB (format 3): these are the readings of the rows about to
  be committed, compared with the approval before the commit; then its bytes are hashed.
- The table commits exactly those files in one overwrite of the partition.
- The committed version's files of the partition, read from its log, are proved by their
  bytes: the same names, sizes and SHA-256 as the files fingerprinted before the commit hold
  the same rows (core.lake.lake_files.proved_by_bytes). Files that differ in any way are
  fingerprinted by DuckDB again. This is the verification after the commit.

A table that cannot be read or written as plain files (deletion vectors, column mapping,
constraints, a change feed) goes through delta-rs and Arrow instead (core.lake.target), as
does an Iceberg table (pyiceberg's overwrite takes a whole Arrow table).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa

from backfill_assets.core.context import Checkpoint, Context, no_checkpoint
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.engines.duckdb.database import cursor
from backfill_assets.core.engines.duckdb.stages import partition_column, readings_of, stage_name
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.lake.engine import lake_engine_for
from backfill_assets.core.lake.lake_files import Proven, digests, proved_by_bytes, sha256_files
from backfill_assets.core.lake.tables import META_PREFIX, FileLakeTable, WrittenFile
from backfill_assets.core.lake.target import LakeTarget, LakeWrite
from backfill_assets.core.vocabulary import PartitionValue

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

_FILES, _VALUE, _ROWS = "partition_files", "partition_value", "partition_rows"


@contextlib.contextmanager
def _partition_rows(duck: DuckDBPyConnection, ctx: Context, schema: pa.Schema, label: str,
                    files: Sequence[str], carried: bool) -> Iterator[str]:
    """The relation of one partition's rows read from ``files`` by DuckDB's Parquet reader (an
    empty one for no files), on ``duck``: with the partition value of ``label`` (the log's), or
    where the files carry the partition column (``carried``), their rows of that value."""
    spec = ctx.spec
    columns = list(spec.columns)
    key = spec.partition_key
    if files:
        duck.register(_FILES, duck.read_parquet(list(files), union_by_name=True))
    else:
        duck.register(_FILES, schema.empty_table())
    duck.register(_VALUE, pa.table({key: pa.array([ctx.value_of(label)], schema.field(key).type)}))
    duck.register(_ROWS, duck.sql(statements.partition_files(_FILES, _VALUE, columns, key, carried)))
    try:
        yield _ROWS
    finally:
        for name in (_ROWS, _VALUE, _FILES):
            duck.unregister(name)


def files_readings(db: DuckDBPyConnection, ctx: Context, schema: pa.Schema,
                   files: Mapping[str, Sequence[str]], carried: bool) -> dict[str, Reading]:
    """The readings of each partition held by its files (label -> full paths), by DuckDB."""
    spec = ctx.spec
    out: dict[str, Reading] = {}
    with contextlib.closing(cursor(db)) as duck:
        for label, paths in files.items():
            with _partition_rows(duck, ctx, schema, label, paths, carried) as rows:
                found = readings_of(duck, rows, ctx.target_columns, spec.partition_key, spec.business_key,
                                    spec.total, [ctx.value_of(label)])
            out[label] = found[0].as_dict()
    return out


def write_partition(db: DuckDBPyConnection, ctx: Context, table: FileLakeTable, handle: Any, label: str,
                    tag: str) -> WrittenFile | None:
    """Stage A's partition ``label`` written by DuckDB as a Parquet file in the table's folder
    (None: the partition has no rows, and the overwrite leaves it empty)."""
    spec = ctx.spec
    columns = [c for c in spec.columns if table.carries_partition or c != spec.partition_key]
    path, logged = table.new_file(handle, spec.partition_key, label, tag)
    query = statements.stage_rows(stage_name(spec, "a"), columns, spec.partition_key, spec.business_key)
    with contextlib.closing(cursor(db)) as duck:
        duck.sql(query, params={"partition": ctx.value_of(label)}).write_parquet(path, compression="snappy")
        rows = duck.execute(statements.FILE_ROWS, {"path": path}).fetchone()
    count = int(rows[0]) if rows else 0
    if count == 0:
        Path(path).unlink(missing_ok=True)
        return None
    return WrittenFile(label, path, logged, os.stat(path).st_size, count)


class DuckLakeTarget(LakeTarget):
    """A lake target whose approved rows come from stage A in DuckDB, rechecked by reading them
    (core.lake.target.LakeTarget.recheck). A Delta table that can be read and written as plain
    files is read, written and fingerprinted by DuckDB (:class:`FilesWrite`, the module
    docstring); any other lake table through its library and Arrow."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, db: DuckDBPyConnection,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        super().__init__(conn, control, ctx, lake_engine_for(ctx.spec).table(control), checkpoint)
        self.db = db
        self.writes_files = False  # whether the current write goes by files (FilesWrite)
        self.committed_handle: Any = None  # the table at the version our last files commit made
        self.switched: dict[str, Proven] = {}  # label -> the files our last files commit was proved by

    def read_stage(self, label: str) -> pa.Table:
        spec = self.ctx.spec
        query = statements.stage_rows(stage_name(spec, "a"), spec.columns, partition_column(self.ctx), spec.business_key)
        with contextlib.closing(cursor(self.db)) as duck:
            data = duck.sql(query, params={"partition": self.ctx.value_of(label)}).to_arrow_table()
        return data.cast(lake_schema(self.ctx.target_columns))

    def fingerprint(self, data: pa.Table) -> Reading:
        return super().fingerprint(data if data.num_rows else self.schema.empty_table())

    def _files(self, handle: Any, labels: list[str]) -> dict[str, list[str]] | None:
        """Each partition's data files at the handle's version, if they can be read as plain files
        (a time window is read by its range, through the table's library)."""
        if not isinstance(self.table, FileLakeTable) or self.ctx.windowing is not None:
            return None
        if handle is None:
            return {label: [] for label in labels}
        return self.table.partition_files(handle, self.ctx.spec.partition_key, [self.ctx.value_of(x) for x in labels])

    def _read(self, handle: Any, labels: list[str]) -> dict[str, Reading]:
        files = self._files(handle, labels)
        if files is None:
            return super()._read(handle, labels)
        return self.files_readings(files)

    def files_readings(self, files: Mapping[str, Sequence[str]]) -> dict[str, Reading]:
        assert isinstance(self.table, FileLakeTable)
        return files_readings(self.db, self.ctx, self.schema, files, self.table.carries_partition)

    def new_write(self, handle: Any) -> LakeWrite:
        # A time window is overwritten by its range through the table's library (a file of
        # ours per window would still be committed as a partition value's).
        self.writes_files = (isinstance(self.table, FileLakeTable) and self.ctx.windowing is None
                             and self.table.writable_as_files(handle))
        if self.writes_files:
            assert isinstance(self.table, FileLakeTable)
            return FilesWrite(self, self.table, handle)
        return super().new_write(handle)

    def committed_readings(self, labels: list[str]) -> dict[str, Reading]:
        version = self.committed_version(labels)
        if isinstance(self.table, FileLakeTable) and version is not None and self.ctx.windowing is None:
            # The table as our commit left it (the library read our commit back), or loaded
            # afresh; its files at exactly that version either way.
            handle = self.committed_handle if self.committed_handle is not None else self.table.open()
            files = self.table.partition_files(handle, self.ctx.spec.partition_key,
                                               [self.ctx.value_of(label) for label in labels], version)
            if files is not None:
                by_bytes, _ = proved_by_bytes(files, self.switched, sha256_files)
                rest = {label: paths for label, paths in files.items() if label not in by_bytes}
                return {**by_bytes, **(self.files_readings(rest) if rest else {})}
        return super().committed_readings(labels)


class FilesWrite(LakeWrite):
    """The write of a group of partitions as Parquet files DuckDB writes from stage A, committed
    by the table in one overwrite (the module docstring). Files not committed are deleted."""

    def __init__(self, target: DuckLakeTarget, table: FileLakeTable, handle: Any) -> None:
        super().__init__(target, handle)
        self.duck_target, self.files_table = target, table
        self.written: dict[str, WrittenFile | None] = {}
        self.proven: dict[str, Proven] = {}  # label -> the files written, fingerprinted and hashed
        self.committing = False

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        if self.pending is None:
            return super().readings(labels)
        files = {label: self._paths(label) for label in labels}
        found = self.duck_target.files_readings(files)
        hashed = digests(files, sha256_files)  # after the fingerprint: the bytes the commit is then proved by
        self.proven.update({label: Proven(hashed[label], found[label]) for label in labels})
        return found

    def _paths(self, label: str) -> list[str]:
        written = self.written[label]
        return [] if written is None else [written.path]

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        t = self.duck_target
        tag = (note or {}).get("plan_id", "")[:16]
        handle = self.created()  # the files go into the table's folder: a missing table is created first
        for label in labels:
            self.written[label] = write_partition(t.db, t.ctx, self.files_table, handle, label, tag)
        self.pending = {}  # the rows are in the files written
        self.note = dict(note or {})
        self.metadata = {META_PREFIX + k: v for k, v in self.note.items()}
        t.checkpoint("inserted", labels)

    def keys(self, labels: list[str]) -> pa.Table:
        t = self.duck_target
        names = list(t.ctx.spec.business_key)
        paths = [p for label in labels for p in self._paths(label)]
        if not paths:
            return t.schema.empty_table().select(names)
        with contextlib.closing(cursor(t.db)) as duck:
            duck.register(_FILES, duck.read_parquet(paths, union_by_name=True))
            try:
                keys = duck.sql(statements.columns_of(_FILES, names)).to_arrow_table()
            finally:
                duck.unregister(_FILES)
        return keys.cast(pa.schema([t.schema.field(n) for n in names]))

    def overwrite(self, handle: Any, labels: list[str], values: list[PartitionValue], exclusive: bool) -> str | None:
        t = self.duck_target
        files = [f for label in labels if (f := self.written[label]) is not None]
        self.committing = True
        t.switched = {label: self.proven[label] for label in labels if label in self.proven}
        version = self.files_table.commit_files(handle, t.ctx.spec.partition_key, values, files, t.schema,
                                                self.metadata, exclusive=exclusive)
        t.committed_handle = handle
        return version

    def discard(self) -> None:
        """Delete the files written, unless a commit of them was tried (then the table's log says
        whether they are its data; a failed commit deletes them itself)."""
        if self.committing:
            return
        for written in self.written.values():
            if written is not None:
                Path(written.path).unlink(missing_ok=True)
