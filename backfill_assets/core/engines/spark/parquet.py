"""A folder of Parquet files as the target, Hive-partitioned by the partition key
(``<key>=<value>/part-....parquet``), as Spark, DuckDB and PyArrow read it: the target of
``engine: {type: spark}`` (core.engines.spark).

A folder has no commit log, so a partition is replaced by a switch the file system makes
atomic: the new partition is written in full under ``_backfill_staging/`` (a name every
reader skips, as it skips every name that starts with ``_`` or ``.``), made durable, and then
swapped with the old partition directory in one ``renameat2(RENAME_EXCHANGE)`` (a new
partition: one ``rename``). A reader therefore lists either the old files or the new ones,
never an empty or half-written partition; a process killed at any point leaves the old
partition or the new one, and what it left under ``_backfill_staging`` is removed by a later
write, a day later (:data:`STAGING_GRACE`). The old files are moved under
``_backfill_replaced/`` and deleted by a later write after :data:`REPLACED_GRACE`: a reader that
already opened one reads it to the end; one that listed the partition just before the switch
and opens a file after it gets "file not found" and must read again (never other rows). A
reader that skips names gone since its listing (PyArrow's dataset discovery on a local folder)
can read the partition as empty across the switch (docs/spark.md).

Local disks (ext4, XFS, tmpfs, Btrfs) swap directories atomically; HDFS renames atomically but
has no exchange, and object stores (S3, GCS, ADLS) do not rename at all: there a catalog table
or a table format is needed (docs/engines.md). A file system without ``RENAME_EXCHANGE`` is
refused, naming it.

Writers outside this tool cannot be locked out of a folder: our runs hold the control store's
partition locks; a write that finds the partition's files changed since it read them fails
(TransientDatabaseError, nothing switched); and the verification after the switch reads the
committed partition afresh and fails loudly if it differs from the approved stage.

The table's "version" (for plans and the ledger) is the SHA-256 of its file list with sizes
and modification times: metadata only, no data file read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from backfill_assets.core.engines.spark.windows import key_column
from backfill_assets.core.errors import SpecError, TransientDatabaseError
from backfill_assets.core.lake.engine import LakeEngine
from backfill_assets.core.lake.parts import Part, Span, part_label
from backfill_assets.core.lake.tables import LakeTable, TableShape, local_path, signature
from backfill_assets.core.vocabulary import PartitionValue, partition_label
from backfill_assets.core.windows import Windowing

STAGING = "_backfill_staging"  # new partitions being written, and what a killed run left
REPLACED = "_backfill_replaced"  # old partitions, kept for readers that listed them
REPLACED_GRACE = 600.0  # seconds a replaced partition's files stay readable
# What a write left under STAGING is removed after this long: long enough that no write still
# in progress (another partition's, by another run) loses its files.
STAGING_GRACE = 86400.0

# Characters Spark escapes in a partition directory's value (ExternalCatalogUtils.escapePathName).
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}


def partition_dir(partition_key: str, value: PartitionValue) -> str:
    """A partition's directory name, as Spark names it (``day=2024-01-01``)."""
    text = partition_label(value)
    escaped = "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in text)
    return f"{partition_key}={escaped}"


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _renameat2(a: Path, b: Path, flags: int) -> None:
    """Linux ``renameat2``. Raises SpecError where the file system cannot do it atomically
    (EINVAL, ENOSYS), OSError otherwise."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise SpecError("this system's C library has no renameat2: a parquet target needs an atomic directory "
                        "swap (Linux 3.15+, glibc 2.28+); use a catalog table (spark_table) or a table format")
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) != 0:
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise SpecError(f"the file system of {b.parent} cannot swap directories atomically (renameat2: "
                            f"{os.strerror(code)}); a parquet target needs a local disk (ext4, XFS, Btrfs, tmpfs); "
                            "elsewhere use a catalog table (spark_table) or a table format")
        raise OSError(code, f"renaming {a} to {b}: {os.strerror(code)}")


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one atomic step (``renameat2`` with RENAME_EXCHANGE)."""
    _renameat2(a, b, _RENAME_EXCHANGE)


def move_new(a: Path, b: Path) -> None:
    """Move ``a`` to ``b`` in one step, failing (EEXIST) if anything is at ``b`` (RENAME_NOREPLACE)."""
    _renameat2(a, b, _RENAME_NOREPLACE)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Files = tuple[tuple[str, int, int], ...]  # (name under the directory, size, modification time in ns)


class Listing:
    """The folder's partition directories as one read of the folder saw them, and each
    directory's files as first asked for: a partition's files are listed when it is first
    read or written, so a command that touches a few partitions of a large folder lists only
    those (:attr:`partitions` and :attr:`version` list every one, once)."""

    def __init__(self, root: Path, directories: Sequence[str]) -> None:
        self.root, self.directories = root, tuple(sorted(directories))
        self._known = frozenset(self.directories)
        self._files: dict[str, Files] = {}

    def files(self, directory: str) -> Files | None:
        """The directory's files (None: there was no such directory when the folder was read)."""
        if directory not in self._known:
            return None
        if directory not in self._files:
            self._files[directory] = _files(self.root / directory)
        return self._files[directory]

    @property
    def partitions(self) -> dict[str, Files]:
        """Every partition directory's files."""
        return {d: self.files(d) or () for d in self.directories}

    @property
    def version(self) -> str:
        parts = self.partitions
        text = "\n".join(f"{d}/{n}\t{s}\t{m}" for d in sorted(parts) for n, s, m in parts[d])
        return hashlib.sha256(text.encode()).hexdigest()


def _files(directory: Path) -> tuple[tuple[str, int, int], ...]:
    out = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory)
        if p.is_file() and not any(_hidden(part) for part in rel.parts):
            st = p.stat()
            out.append((rel.as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _value_type(names: list[str]) -> pa.DataType:
    """The partition column's type as Spark infers it from directory names."""
    import datetime as dt
    values = [urllib.parse.unquote(n) for n in names]
    try:
        [dt.date.fromisoformat(v) for v in values]
        if all(len(v) == 10 for v in values):
            return pa.date32()
    except ValueError:
        pass
    if all(v.lstrip("-").isdigit() for v in values):
        return pa.int64() if any(abs(int(v)) >= 2**31 for v in values) else pa.int32()
    return pa.string()


def place_arrow(place: Callable[[PartitionValue], Path], column: str, values: Sequence[PartitionValue],
                data: pa.Table, placed: dict[str, Path]) -> None:
    """Each partition's rows of ``data`` written from Arrow as one file (without ``column``) in
    the directory ``place`` gives it, recorded in ``placed`` (label -> directory) as it is made,
    so that a failure part way leaves ``placed`` naming what to discard."""
    for value in values:
        rows = data.filter(pc.equal(data[column], pa.scalar(value, data.schema.field(column).type)))
        new = placed[partition_label(value)] = place(value)
        new.mkdir(parents=True)
        if rows.num_rows:
            pq.write_table(rows.drop_columns([column]), new / f"part-00000-{uuid.uuid4()}.c000.snappy.parquet",
                           compression="snappy")


class ParquetFolderTable(LakeTable):
    """One Hive-partitioned Parquet folder (see the module docstring). A handle is a
    :class:`Listing` (None: no folder, or one without a data file yet)."""

    def __init__(self, location: str, partition_key: str, carried: bool = False) -> None:
        self.root = Path(local_path(location))
        self.partition_key = partition_key  # what the directories are named by: a value, or a window's label
        self.carried = carried  # the files keep every column (time windows); else the directory carries the key
        self.name = "parquet:" + str(self.root)

    def _listing(self) -> Listing | None:
        if not self.root.is_dir():
            return None
        with os.scandir(self.root) as entries:
            found = [e.name for e in entries
                     if e.name.partition("=")[0] == self.partition_key and "=" in e.name and e.is_dir()]
        return Listing(self.root, found)

    def shape(self) -> TableShape | None:
        listing = self._listing()
        first = None if listing is None else next(
            ((d, files[0][0]) for d, files in sorted(listing.partitions.items()) if files), None)
        if listing is None or first is None:
            return None  # no data file yet: apply writes the first partition
        schema = pq.read_schema(self.root / first[0] / first[1])
        names = [d.partition("=")[2] for d, files in listing.partitions.items() if files]
        columns = [(f.name, f.type) for f in schema if f.name != self.partition_key]
        if not self.carried:
            columns.append((self.partition_key, _value_type(names)))
        return TableShape(columns, [self.partition_key], [f.name for f in schema if not f.nullable], [])

    def open(self) -> Listing | None:
        return self._listing()

    def version(self, handle: Any) -> str | None:
        return None if handle is None else handle.version

    def _read_dir(self, directory: str, files: Sequence[tuple[str, int, int]], value: PartitionValue) -> pa.Table | None:
        tables = [pq.read_table(self.root / directory / name) for name, _, _ in files if name.endswith(".parquet")]
        if not tables:
            return None
        data = pa.concat_tables(tables, promote_options="permissive")
        if self.carried:
            return data
        if self.partition_key in data.column_names:
            data = data.drop_columns([self.partition_key])
        return data.append_column(self.partition_key, pa.array([value] * data.num_rows))

    def read(self, handle: Any, column: str, values: Sequence[Part]) -> pa.Table:
        parts = []
        for part in values:
            value = part_label(part) if isinstance(part, Span) else part
            directory = partition_dir(self.partition_key, value)
            files = None if handle is None else handle.files(directory)
            data = self._read_dir(directory, files or (), value)
            if data is not None:
                parts.append(data)
        if not parts:
            return pa.table({})
        return pa.concat_tables(parts, promote_options="permissive")

    def read_version(self, version: str | None, column: str, values: Sequence[Part]) -> pa.Table:
        """The partitions as they are now, read afresh: a folder keeps no old versions, so a
        change by another writer since ``version`` shows as rows that differ."""
        return self.read(self._listing(), column, values)

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        parts = []
        for directory, files in ([] if handle is None else sorted(handle.partitions.items())):
            raw = urllib.parse.unquote(directory.partition("=")[2])
            data = self._read_dir(directory, files, raw)
            if data is not None:
                parts.append(data.select(list(columns)))
        return pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})

    def create(self, schema: pa.Schema, partition_key: str, windowing: Windowing | None = None) -> str | None:
        self.root.mkdir(parents=True, exist_ok=True)
        created = self._listing()
        assert created is not None
        return created.version

    def close(self) -> None:
        pass

    def _purge(self) -> None:
        """Remove what killed runs left being written, and replaced partitions past their grace."""
        now = time.time()
        for folder, grace in ((STAGING, STAGING_GRACE), (REPLACED, REPLACED_GRACE)):
            base = self.root / folder
            if not base.is_dir():
                continue
            for entry in base.iterdir():
                if now - entry.stat().st_mtime > grace:
                    shutil.rmtree(entry, ignore_errors=True)

    SIGNAL = "file listing"

    def partition_signatures(self, handle: Any, column: str, values: Sequence[Part],
                             version: str | None = None) -> dict[str, str | None] | None:
        """Each partition directory's files with their sizes and modification times (a folder
        keeps no versions: None with ``version``)."""
        if version is not None:
            return None
        return {part_label(v): signature(None if handle is None else handle.files(
            partition_dir(self.partition_key, part_label(v) if isinstance(v, Span) else v))) for v in values}

    def versions_after(self, handle: Any, version: str) -> list[str] | None:
        return None  # a folder keeps no versions

    def partition_paths(self, handle: Any, value: PartitionValue) -> list[str]:
        """The data files of one partition as ``handle`` listed them (full paths)."""
        directory = partition_dir(self.partition_key, value)
        files = None if handle is None else handle.files(directory)
        return [str(self.root / directory / name) for name, _, _ in files or () if name.endswith(".parquet")]

    def place(self, run: str, value: PartitionValue) -> Path:
        """Where one run writes one partition in full before it is switched in (not created)."""
        return self.root / STAGING / run / partition_dir(self.partition_key, value)

    def discard(self, run: str, values: Sequence[PartitionValue], placed: Mapping[str, Path]) -> None:
        """Remove what a run wrote and did not switch in."""
        shutil.rmtree(self.root / STAGING / run, ignore_errors=True)

    def overwrite(self, handle: Any, column: str, values: Sequence[PartitionValue], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """Write each partition's rows of ``data`` from Arrow under ``_backfill_staging`` and
        switch them in (:meth:`switch_in`)."""
        run = uuid.uuid4().hex
        placed: dict[str, Path] = {}
        try:
            place_arrow(lambda value: self.place(run, value), column, values, data, placed)
            return self.switch_in(handle, column, values, placed)
        finally:
            self.discard(run, values, placed)

    def switch_in(self, handle: Any, column: str, values: Sequence[PartitionValue], placed: Mapping[str, Path]) -> str | None:
        """Make each partition's new directory (``placed``: label -> directory under
        ``_backfill_staging``; no data file: the partition becomes empty) durable and switch it
        in atomically (see the module docstring); a partition whose files changed since
        ``handle`` listed them is refused before anything is switched (TransientDatabaseError,
        safe to retry). The handle lists a partition's files when it is first read through it
        (apply reads each partition under its lock before it writes it), or else here."""
        # ``exclusive`` (records_can_move): a folder has no log to fail a commit on, so the
        # written keys were checked in no other partition just before (keys_elsewhere), and
        # partitions a moved key links never get here (the plan is refused).
        now = self._listing()
        dirs = [partition_dir(column, v) for v in values]
        # Each partition's files as this run read them (the handle lists a directory when it is
        # first read) against the files there now: only the partitions being written are listed.
        before = {d: None if handle is None else handle.files(d) for d in dirs}
        moved = [d for d in dirs if (before[d] or ()) != ((None if now is None else now.files(d)) or ())]
        if moved:
            raise TransientDatabaseError(f"another writer changed {', '.join(moved)} of {self.name} since this run "
                                         "read it; nothing of ours was switched in")
        self._purge()
        written = []
        for value, directory in zip(values, dirs):
            new = placed[partition_label(value)]
            new.mkdir(parents=True, exist_ok=True)
            for path in list(new.iterdir()):  # what a writer left beside the data (Spark's _SUCCESS, .crc)
                if _hidden(path.name) and path.is_file():
                    path.unlink()
            for path in new.iterdir():
                if path.is_file():
                    with open(path, "rb") as f:
                        os.fsync(f.fileno())
            _fsync_dir(new)
            _fsync_dir(new.parent)
            written.append((new, directory))
        for new, directory in written:
            self._switch(new, self.root / directory, before.get(directory))
        _fsync_dir(self.root)
        after = self._listing()
        return None if after is None else after.version

    def _switch(self, new: Path, old: Path, seen: tuple | None) -> None:
        """Put ``new`` at ``old`` in one step, if ``old`` still holds the files ``seen`` (None:
        there was no directory), else swap back: a writer came in while ours was written. Keep
        the old files for REPLACED_GRACE."""
        empty = not any(new.iterdir())
        if old.exists() and seen is None:  # created since it was read (even empty): a writer is at it
            raise TransientDatabaseError(f"another writer created {old.name} of {self.name} while this run wrote "
                                         "it; nothing of ours was switched in")
        if old.exists():
            exchange(new, old)  # ``new`` now holds the old partition
            if _files(new) != seen:  # compare-and-swap: what we swapped out is what we read
                exchange(new, old)
                raise TransientDatabaseError(f"another writer changed {old.name} of {self.name} while this run "
                                             "wrote it; nothing of ours was switched in")
            keep = self.root / REPLACED / uuid.uuid4().hex
            keep.parent.mkdir(exist_ok=True)
            os.rename(new, keep)
            os.utime(keep)  # a rename keeps the directory's own time: the grace starts now
            if empty:
                with contextlib.suppress(OSError):  # switched already; a writer's new file keeps it
                    os.rmdir(old)  # an emptied partition has no directory, as Spark leaves it
        elif seen is not None:
            raise TransientDatabaseError(f"another writer removed {old.name} of {self.name} while this run wrote "
                                         "it; nothing of ours was switched in")
        elif not empty:
            try:
                move_new(new, old)  # fails if anything appeared there meanwhile, even an empty directory
            except OSError as err:
                if err.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise TransientDatabaseError(f"another writer created {old.name} of {self.name} while this "
                                                 "run wrote it; nothing of ours was switched in") from None
                raise

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[PartitionValue],
                       keys: pa.Table) -> pa.Table | None:
        if handle is None:
            return None
        skip = {partition_dir(column, v) for v in values}
        names = [column, *keys.column_names]
        parts = []
        for directory, files in sorted(handle.partitions.items()):
            if directory in skip:
                continue
            data = self._read_dir(directory, files, urllib.parse.unquote(directory.partition("=")[2]))
            if data is not None:
                parts.append(data.select(names))
        if not parts:
            return None
        found = pa.concat_tables(parts, promote_options="permissive")
        wanted = keys.group_by(keys.column_names).aggregate([]).cast(found.select(keys.column_names).schema)
        return found.join(wanted, keys=keys.column_names, join_type="inner").select(names)

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        return True


class ParquetEngine(LakeEngine):
    """A Parquet folder target (core.context.TargetEngine), written by the Spark engine."""

    def table(self, conn: psycopg.Connection | None) -> LakeTable:
        target = self.spec.target
        return ParquetFolderTable(target.location, key_column(self.spec),  # type: ignore[union-attr]
                                  carried=self.spec.partition_window is not None)

    def window_partitioning(self, windowing: Windowing, shape: TableShape | None) -> list[str]:
        """A folder per window, named by its label (``created_at_hour=2024-11-03T01%3A00-0400``)."""
        return [key_column(self.spec)]

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """A partition value must name one directory: not empty, and not ``.`` or ``..``."""
        bad = [partition_label(p) for p in partitions if partition_label(p) in ("", ".", "..")]
        if bad:
            raise SpecError(f"partition value(s) {', '.join(repr(b) for b in bad)} cannot name a directory of a "
                            "parquet target")
