"""The lake source of a DuckDB spec, pinned to one version that cannot change.

A plan pins what it read, and both builds, approval and apply read exactly that:

- Delta: the table version (a version's files are never rewritten in place). It stays
  readable until a vacuum deletes its files or the log is cleaned up past it.
- Iceberg: the snapshot id. It stays readable until the snapshot is expired or its files
  are deleted.
- Parquet: a Hive-partitioned folder (``<partition_key>=<value>/...parquet``) has no version
  of its own: the pin is the list of the planned partitions' files with each file's size and
  SHA-256, and the version is the SHA-256 of that list. Any file added, removed or rewritten
  in those partitions breaks it.

:meth:`LakeSource.unreadable` says why a pin can no longer be read ("plan again"). DuckDB
reads the pinned files itself, as ``source_rows`` on the caller's connection (see
IcebergSource._register for the exception). :meth:`LakeSource.signature` is the source
sensor's cheap per-partition signal: metadata only, no data file read.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pyarrow as pa
import pyarrow.dataset as pads

from backfill_assets.core.duck import copy_batches
from backfill_assets.core.errors import SnapshotError, SpecError
from backfill_assets.core.lake.lake_files import (
    delta_dataset,
    files_digest,
    plain_iceberg_files,
    sha256_files,
    task_files,
)
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pinned import Pin
from backfill_assets.core.spec import DeltaSourceSpec, IcebergSourceSpec, LakeSourceSpec, ParquetSourceSpec, Spec
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# The relation the pinned rows are visible as, on the connection that reads them.
SOURCE_ROWS = "source_rows"


def _quoted(name: str) -> str:
    """A column name as DuckDB's quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def _plan_again(name: str, pin: Pin, why: str) -> SnapshotError:
    return SnapshotError(f"the pinned version {pin.version} of {name} can no longer be read ({why}); plan again")


class LakeSource:
    """A lake source (Delta, Iceberg or Parquet; see the module docstring)."""

    name: str
    # Whether a pin holds every partition at its version (a table format's log); a folder's pin
    # holds only the files of the partitions it was taken for.
    keeps_versions = True

    def latest(self, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        """The newest version, for the partitions ``values``."""
        raise NotImplementedError

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
        """Why the partitions ``values`` of ``pin`` can no longer be read exactly (a vacuumed
        or expired version, a file missing or changed), or None. Reads metadata and file
        listings (a Parquet folder's files are hashed again)."""
        raise NotImplementedError

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> None:
        """Make the partitions ``values`` of ``pin`` readable as :data:`SOURCE_ROWS` on the
        DuckDB connection ``con`` (its own: each build reads the source on its own).

        Raises:
            SnapshotError: the pin can no longer be read; plan again.
        """
        raise NotImplementedError

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        """Every partition of ``pin`` as :data:`SOURCE_ROWS` on ``con`` (where moved keys'
        newest versions are looked for; a Parquet pin holds only its partitions' files)."""
        raise SpecError(f"records_can_move needs every partition of the source: {self.name} cannot give them")

    def attach_newest(self, duck: DuckDBPyConnection) -> None:
        """Every partition of the source's newest version as :data:`SOURCE_ROWS` on ``con``
        (what ``profile`` reads, filtering the partitions it profiles; nothing is pinned)."""
        self.attach_all(duck, self.latest("", ()))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        """Make the source's newest columns readable as :data:`SOURCE_ROWS` on ``con``, without
        rows (what inspection describes)."""
        raise NotImplementedError

    def signature(self, partition_key: str, values: Sequence[PartitionValue]) -> tuple[str, dict[str, str]]:
        """The newest version, and per partition a digest of the files that hold it there
        (metadata only): the source sensor's signal of which partitions changed."""
        raise NotImplementedError

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, str]:
        """Per partition, the digest :meth:`signature` gives, at ``pin`` (metadata only)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source opened (an Iceberg catalog's connections)."""


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

    def _files(self, table: Any, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, list[str]]:
        """Per partition label, the data files that may hold its rows at the table's version
        (all files, where the table is not partitioned by the partition key)."""
        actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
        paths = actions.get("path", [])
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

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
        table, why = self._at(pin)
        if table is None:
            return f"its log cannot be loaded at that version: {why}"
        for files in self._files(table, partition_key, values).values():
            for path in files:
                full = Path(self.path) / urllib.parse.unquote(path) if "://" not in path else Path(local_path(path))
                if not full.exists():
                    return f"data file {path} is gone (vacuumed?)"
        return None

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> None:
        table, why = self._at(pin)
        if table is None:
            raise _plan_again(self.name, pin, why or "")
        self._register(duck, table, partition_key, values)

    def _register(self, duck: DuckDBPyConnection, table: Any, partition_key: str | None,
                  values: Sequence[PartitionValue] | None) -> None:
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
        if partition_key is not None and values is not None and partition_key in partitioned:
            meta = meta.filter(pads.field(partition_key).isin(list(values)))
        if meta.num_rows == 0:
            duck.register(SOURCE_ROWS, schema.empty_table())
            return
        name = f"{SOURCE_ROWS}_files"
        duck.register(name, meta)
        data = duck.read_parquet(meta.column("__file").to_pylist(), filename=True, union_by_name=True)
        columns = ", ".join(f"m.{_quoted(c)}" if c in partitioned else f"f.{_quoted(c)}" for c in schema.names)
        relation = data.set_alias("f").join(duck.table(name).set_alias("m"), "f.filename = m.__file").select(columns)
        if partition_key is not None and values is not None and partition_key not in partitioned:
            wanted = f"{SOURCE_ROWS}_values"  # a table not partitioned by the key: its rows are filtered
            duck.register(wanted, pa.table({"v": pa.array(list(values))}))
            relation = relation.filter(f"{_quoted(partition_key)} IN (SELECT v FROM {wanted})")
        duck.register(SOURCE_ROWS, relation)

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        duck.register(SOURCE_ROWS, delta_dataset(self._table(), self.name).schema.empty_table())

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        table, why = self._at(pin)
        if table is None:
            raise _plan_again(self.name, pin, why or "")
        self._register(duck, table, None, None)

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, str]:
        table, why = self._at(pin)
        if table is None:
            return {partition_label(v): "unreadable" for v in values}
        return {label: files_digest([(f,) for f in found])
                for label, found in self._files(table, partition_key, values).items()}

    def signature(self, partition_key: str, values: Sequence[PartitionValue]) -> tuple[str, dict[str, str]]:
        table = self._table()
        files = self._files(table, partition_key, values)
        return str(table.version()), {label: files_digest([(f,) for f in found]) for label, found in files.items()}


class IcebergSource(LakeSource):
    def __init__(self, spec: IcebergSourceSpec, catalog_url: Any) -> None:
        from backfill_assets.core.lake.iceberg import IcebergLakeTable
        self.table = IcebergLakeTable(spec.table, spec.catalog.name, spec.catalog.warehouse, catalog_url,
                                      "the spec's database" if spec.catalog.uri_env is None else spec.catalog.uri_env)
        self.name = f"iceberg:{spec.catalog.name}:{spec.table}"

    def _handle(self) -> Any:
        handle = self.table.open()
        if handle is None:
            raise SpecError(f"source {self.name} does not exist in its catalog; check source.table and source.catalog")
        return handle

    def _filter(self, partition_key: str, values: Sequence[PartitionValue]) -> Any:
        from pyiceberg.expressions import In
        return In(partition_key, list(values))

    def latest(self, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        snapshot = self._handle().current_snapshot()
        return Pin("none" if snapshot is None else str(snapshot.snapshot_id))

    def _tasks(self, handle: Any, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> list[Any]:
        if pin.version == "none":
            return []
        return list(handle.scan(snapshot_id=int(pin.version), row_filter=self._filter(partition_key, values)).plan_files())

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
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

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> None:
        # The step checked the pin's files (unreadable); only an expiry since then is looked for here.
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            raise _plan_again(self.name, pin, "the snapshot was expired")
        if pin.version == "none":
            duck.register(SOURCE_ROWS, handle.schema().as_arrow().empty_table())
            return
        scan = handle.scan(snapshot_id=int(pin.version), row_filter=self._filter(partition_key, values))
        self._register(duck, handle, scan, (partition_key, values))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        duck.register(SOURCE_ROWS, self._handle().schema().as_arrow().empty_table())

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            raise _plan_again(self.name, pin, "the snapshot was expired")
        if pin.version == "none":
            duck.register(SOURCE_ROWS, handle.schema().as_arrow().empty_table())
            return
        self._register(duck, handle, handle.scan(snapshot_id=int(pin.version)), None)

    def _register(self, duck: DuckDBPyConnection, handle: Any, scan: Any,
                  wanted: tuple[str, Sequence[PartitionValue]] | None) -> None:
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
        columns = ", ".join(_quoted(c) for c in schema.names)
        relation = duck.read_parquet(files, union_by_name=True).select(columns)
        if wanted is not None:  # the planned files may hold other partitions' rows too
            key, values = wanted
            duck.register(f"{SOURCE_ROWS}_values", pa.table({"v": pa.array(list(values))}))
            relation = relation.filter(f"{_quoted(key)} IN (SELECT v FROM {SOURCE_ROWS}_values)")
        duck.register(SOURCE_ROWS, relation)

    def signature(self, partition_key: str, values: Sequence[PartitionValue]) -> tuple[str, dict[str, str]]:
        pin = self.latest(partition_key, values)
        return pin.version, self.signature_at(pin, partition_key, values)

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, str]:
        handle = self._handle()
        if pin.version != "none" and handle.snapshot_by_id(int(pin.version)) is None:
            return {partition_label(v): "unreadable" for v in values}
        # One planning per partition: its files are pruned by its value.
        return {partition_label(v): files_digest([(p,) for t in self._tasks(handle, pin, partition_key, [v])
                                                    for p in task_files(t)])
                for v in values}

    def close(self) -> None:
        self.table.close()


class ParquetSource(LakeSource):
    keeps_versions = False

    def __init__(self, spec: ParquetSourceSpec) -> None:
        self.root = Path(local_path(spec.location))
        self.name = spec.display_name
        self.hash_files = sha256_files  # the pinned files' SHA-256 (an engine may hash them on its executors)

    def _listing(self, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, list[Path]]:
        """Per partition label, its files (``<key>=<value>/``, any depth below)."""
        if not self.root.is_dir():
            raise SpecError(f"source {self.name} is not a folder; check source.location")
        wanted = {partition_label(v) for v in values}
        found: dict[str, list[Path]] = {label: [] for label in wanted}
        for entry in sorted(self.root.iterdir()):
            key, sep, raw = entry.name.partition("=")
            if not sep or key != partition_key or not entry.is_dir():
                continue
            label = urllib.parse.unquote(raw)
            if label in found:
                found[label] = sorted(p for p in entry.rglob("*.parquet") if p.is_file())
        return found

    def _pin(self, listing: dict[str, list[Path]], hashed: bool) -> Pin:
        files = []
        digests = self.hash_files([str(p) for paths in listing.values() for p in paths]) if hashed else {}
        for paths in listing.values():
            for p in paths:
                files.append((p.relative_to(self.root).as_posix(), p.stat().st_size, digests.get(str(p), "")))
        files.sort()
        return Pin(files_digest(files), tuple(files))

    def latest(self, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        return self._pin(self._listing(partition_key, values), hashed=True)

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
        now = self.latest(partition_key, values)
        if now.files == pin.files:
            return None
        before, after = {f[0]: f for f in pin.files}, {f[0]: f for f in now.files}
        for path in sorted(before.keys() | after.keys()):
            if path not in after:
                return f"file {path} was removed"
            if path not in before:
                return f"file {path} was added"
            if before[path] != after[path]:
                return f"file {path} was rewritten"
        return "its files changed"

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> None:
        # The files were hashed against the pin by the step (unreadable) before any attach;
        # approval hashes them again before anything is written.
        if any(not (self.root / f[0]).is_file() for f in pin.files):
            raise _plan_again(self.name, pin, "a file is gone")
        files = [str(self.root / f[0]) for f in pin.files]
        if not files:
            raise SnapshotError(f"source {self.name} has no Parquet file in partition(s) "
                                f"{', '.join(partition_label(v) for v in values)}; check the partitions and the folder")
        # hive_partitioning: the partition key comes from the folder names, typed by DuckDB.
        duck.register(SOURCE_ROWS, duck.read_parquet(files, hive_partitioning=True))  # this connection's only

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        """The pinned partitions' files and, for every other partition, its files now: where
        moved keys' versions are looked for (the snapshot pins the partitions that hold them
        and looks again at that pin, core.engines.duckdb.snapshot)."""
        if any(not (self.root / f[0]).is_file() for f in pin.files):
            raise _plan_again(self.name, pin, "a file is gone")
        pinned = {f[0].split("/", 1)[0] for f in pin.files}
        files = [str(self.root / f[0]) for f in pin.files]
        for entry in sorted(self.root.iterdir()) if self.root.is_dir() else []:
            if entry.is_dir() and "=" in entry.name and entry.name not in pinned:
                files += [str(p) for p in sorted(entry.rglob("*.parquet")) if p.is_file()]
        if not files:
            raise SnapshotError(f"source {self.name} holds no Parquet file; check source.location")
        duck.register(SOURCE_ROWS, duck.read_parquet(files, hive_partitioning=True))

    def attach_newest(self, duck: DuckDBPyConnection) -> None:
        self.attach_schema(duck)  # the folder holds a Parquet file
        duck.register(SOURCE_ROWS, duck.read_parquet(str(self.root / "**" / "*.parquet"), hive_partitioning=True))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        if not self.root.is_dir():
            raise SpecError(f"source {self.name} is not a folder; check source.location")
        first = next((p for p in sorted(self.root.rglob("*.parquet")) if p.is_file()), None)
        if first is None:
            raise SpecError(f"source {self.name} holds no Parquet file; check source.location")
        duck.register(SOURCE_ROWS, duck.read_parquet(str(first), hive_partitioning=True).limit(0))

    def signature(self, partition_key: str, values: Sequence[PartitionValue]) -> tuple[str, dict[str, str]]:
        """Per partition, a digest of its files' paths and sizes (no file is read: a file
        rewritten at the same size is found by approval and apply, which hash every file)."""
        listing = self._listing(partition_key, values)
        per = {label: files_digest([(p.relative_to(self.root).as_posix(), str(p.stat().st_size)) for p in paths])
               for label, paths in listing.items()}
        return files_digest(sorted(per.items())), per

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, str]:
        per: dict[str, list[tuple[str, str]]] = {partition_label(v): [] for v in values}
        for path, size, _ in pin.files:
            label = urllib.parse.unquote(path.split("/", 1)[0].partition("=")[2])
            if label in per:
                per[label].append((path, str(size)))
        return {label: files_digest(files) for label, files in per.items()}


def lake_source(spec: Spec, conn: psycopg.Connection | None) -> LakeSource:
    """The spec's lake source (``conn``: the control store's connection, where an Iceberg
    catalog without ``uri_env`` lives)."""
    source: LakeSourceSpec = spec.source  # type: ignore[assignment]
    if isinstance(source, DeltaSourceSpec):
        return DeltaSource(source)
    if isinstance(source, ParquetSourceSpec):
        return ParquetSource(source)
    from backfill_assets.core.lake.iceberg import catalog_url
    assert conn is not None, "an Iceberg source's catalog is reached through the control store's connection"
    return IcebergSource(source, catalog_url(conn, spec, source.catalog))

