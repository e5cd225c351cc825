"""An Apache Iceberg table in a pyiceberg SQL catalog, with a local warehouse, as the target.

Written with ``overwrite(df, overwrite_filter=<the partition>)`` on a table loaded at the
snapshot the partition was read at: one catalog commit (a delete and an append snapshot),
validated against writers since. pyiceberg does not refuse rows outside the filter (they
would land in other partitions), so every row's partition is checked here first. Never
``dynamic_partition_overwrite``: with an empty stage it leaves the stale rows. The catalog
lives in the spec's own database unless ``catalog.uri_env`` names another; its connections
carry the spec's limits like every other. See core.lake.tables for what every lake
table promises.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pyarrow as pa

from backfill_assets.core.errors import ConnectionConfigError, SpecError, TransientDatabaseError, VerificationError
from backfill_assets.core.lake.engine import LakeEngine
from backfill_assets.core.lake.iceberg_catalog import CATALOG_TABLES, catalog_identity, catalog_url
from backfill_assets.core.lake.iceberg_partitions import (
    iceberg_filter,
    iceberg_literal,
    window_partitioning,
    window_transform,
    window_transform_of,
)
from backfill_assets.core.lake.lake_files import plain_iceberg_files
from backfill_assets.core.lake.parts import Part, part_label
from backfill_assets.core.lake.tables import (
    META_PREFIX,
    LakeTable,
    TableShape,
    WrittenFile,
    among,
    check_rows_in,
    commit_failed,
    key_bounds,
    local_path,
    signature,
)
from backfill_assets.core.spec import IcebergTargetSpec
from backfill_assets.core.vocabulary import PartitionValue, TableRef, partition_label
from backfill_assets.core.windows import Windowing


class IcebergEngine(LakeEngine):
    """A ``format: iceberg`` target (core.context.TargetEngine)."""

    def _target(self) -> IcebergTargetSpec:
        target = self.spec.target
        assert isinstance(target, IcebergTargetSpec)
        return target

    def table(self, conn: psycopg.Connection) -> LakeTable:
        target = self._target()
        source = f"${target.catalog.uri_env}" if target.catalog.uri_env else "the spec's database"
        return IcebergLakeTable(target.table, target.catalog.name, target.catalog.warehouse,
                                catalog_url(conn, self.spec), source)

    def catalog_of(self, table: LakeTable) -> str | None:
        assert isinstance(table, IcebergLakeTable)
        return catalog_identity(table.url, table.warehouse)

    def window_partitioning(self, windowing: Windowing, shape: TableShape | None) -> list[str]:
        """Native partitions of the windows (core.lake.iceberg_windows.window_partitioning)."""
        return window_partitioning(self.spec, windowing, shape)

    def held_elsewhere(self) -> tuple[list[TableRef], list[str]]:
        """A catalog kept in the spec's database: a lock on its tables holds every commit up."""
        in_database = self._target().catalog.uri_env is None
        return [], (list(CATALOG_TABLES) if in_database else [])


class IcebergLakeTable:
    """An Iceberg table in a pyiceberg SQL catalog, with a local warehouse."""

    def __init__(self, identifier: str, catalog_name: str, warehouse: str, catalog_url: Any,
                 catalog_source: str = "the spec's database") -> None:
        self.identifier = identifier
        self.catalog_source = catalog_source
        self.name = f"iceberg table {identifier}"
        self.catalog_name = catalog_name
        self.warehouse = "file://" + local_path(warehouse)
        self.url = catalog_url  # a URL object: no repr shows its password
        # The catalog password, removed from any library message we report (never printed).
        self.secret = getattr(catalog_url, "password", None) or None
        self._catalog: Any = None
        # The table as last loaded by read_version: it reads any snapshot it knows, and a
        # snapshot never changes, so the next partition read back needs no new load.
        self._loaded: Any = None

    def catalog(self) -> Any:
        """The SQL catalog. It does not create its own tables (pyiceberg would, on connecting):
        reading is read-only; :meth:`create` creates them."""
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog
            from sqlalchemy.exc import DBAPIError
            # The URL object keeps its password out of every repr; it is never printed.
            try:
                catalog = SqlCatalog(self.catalog_name, uri=self.url, warehouse=self.warehouse,
                                     init_catalog_tables="false")
                # pyiceberg takes a failed connection for missing catalog tables: connect here.
                catalog.engine.connect().close()
                self._catalog = catalog
            except ImportError as err:  # the URL names a driver that is not installed
                problem = (f"the Iceberg catalog URL in {self.catalog_source} needs the {err.name or 'a'} "
                           "driver, which is not installed; use a postgresql or sqlite URL")
            except DBAPIError as err:
                problem = " ".join(str(err.orig).split())
                password = getattr(self.url, "password", None)
                if password:
                    problem = problem.replace(str(password), "[redacted]")
                # Raised outside the except block: the driver's exception is not chained.
                problem = f"cannot connect to the Iceberg catalog in {self.catalog_source}: {problem}"
            else:
                return self._catalog
            raise ConnectionConfigError(problem)
        return self._catalog

    def _load(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError
        from sqlalchemy.exc import OperationalError, ProgrammingError
        try:
            return self.catalog().load_table(self.identifier)
        except NoSuchTableError:
            self._refuse_another_name()
            return None
        except FileNotFoundError as err:
            raise SpecError(
                f"the Iceberg catalog lists {self.identifier}, but its metadata file is missing "
                f"({err.filename or 'a file under the warehouse'}); restore the warehouse, or drop the "
                "table from the catalog"
            ) from None
        except (ProgrammingError, OperationalError) as err:  # no catalog tables yet: no table either
            if getattr(err.orig, "sqlstate", None) == "42P01" or "no such table" in str(err.orig):
                return None
            raise

    def _refuse_another_name(self) -> None:
        """A table not under our catalog name, but under another name of the same catalog
        database in the same place of the warehouse (the table this tool made when its
        catalog name defaulted to "backfill_assets"), must not be created again beside it:
        a second table in the same folder, which readers would take for the first.

        Raises:
            SpecError: naming the other catalog name(s) and how to carry on.
        """
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import select
        from sqlalchemy.orm import Session
        namespace, name = self.identifier.split(".")
        folder = f"{self.warehouse}/{namespace}/{name}/"
        query = select(IcebergTables.catalog_name, IcebergTables.metadata_location).where(
            IcebergTables.table_namespace == namespace, IcebergTables.table_name == name,
            IcebergTables.catalog_name != self.catalog_name,
        )
        with Session(self.catalog().engine) as session:
            others = sorted({c for c, location in session.execute(query) if (location or "").startswith(folder)})
        if others:
            listed = ", ".join(repr(c) for c in others)
            raise SpecError(
                f"the Iceberg catalog in {self.catalog_source} lists {self.identifier} in this warehouse under "
                f"the catalog name {listed}, not under {self.catalog_name!r}, the name the spec uses "
                "(target.catalog.name; pyiceberg's default name unless set). Creating it under "
                f"{self.catalog_name!r} would put a second table in the same folder. Set "
                f"target.catalog.name: {others[0]} to keep writing that table, or move its catalog rows "
                f"(catalog_name in iceberg_tables and iceberg_namespace_properties) to {self.catalog_name!r}"
            )

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.engine.dispose()
            self._catalog = None

    def shape(self) -> TableShape | None:
        table = self._load()
        if table is None:
            return None
        schema = table.schema()
        arrow = schema.as_arrow()
        partitioned = []
        for part in table.spec().fields:
            source = schema.find_column_name(part.source_id)
            partitioned.append(source if str(part.transform) == "identity" else f"{part.transform}({source})")
        # Snapshot isolation lets a concurrent write to our partition through: our commit must
        # fail instead (serializable, Iceberg's default).
        weak = [f"{key} = snapshot (a concurrent write to the partition would not fail our commit)"
                for key in ("write.delete.isolation-level", "write.update.isolation-level",
                            "write.merge.isolation-level")
                if str(table.properties.get(key, "serializable")).lower() == "snapshot"]
        return TableShape([(f.name, f.type) for f in arrow], partitioned,
                          [f.name for f in schema.fields if f.required], weak)

    def open(self) -> Any:
        return self._load()

    def version(self, handle: Any) -> str | None:
        if handle is None:
            return None
        snapshot = handle.current_snapshot()
        return None if snapshot is None else str(snapshot.snapshot_id)

    def _filter(self, column: str, values: Sequence[Part]) -> Any:
        return iceberg_filter(column, values)

    def _scan(self, handle: Any, snapshot_id: int | None, column: str, values: Sequence[Part]) -> pa.Table:
        schema = handle.schema().as_arrow()
        if snapshot_id is None:
            return schema.empty_table()
        return handle.scan(row_filter=self._filter(column, values), snapshot_id=snapshot_id).to_arrow()

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        if self.version(handle) is None:
            return handle.schema().as_arrow().empty_table().select(list(columns))
        return handle.scan(selected_fields=tuple(columns)).to_arrow()

    def read(self, handle: Any, column: str, values: Sequence[Part]) -> pa.Table:
        version = self.version(handle)
        return self._scan(handle, None if version is None else int(version), column, values)

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[Part],
                       keys: pa.Table) -> pa.Table | None:
        from pyiceberg.expressions import And, GreaterThanOrEqual, IsNull, LessThanOrEqual, Not, Or
        version = self.version(handle)
        if version is None:
            return None
        # NOT (col IN ...) leaves out a NULL partition value, which lies outside ours too.
        where: Any = Or(IsNull(column), Not(self._filter(column, values)))
        for name, least, greatest in key_bounds(keys):
            where = And(where, GreaterThanOrEqual(name, iceberg_literal(least)),
                        LessThanOrEqual(name, iceberg_literal(greatest)))
        found = handle.scan(row_filter=where, selected_fields=(column, *keys.column_names),
                            snapshot_id=int(version)).to_arrow()
        return among(found, keys)

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        # An overwrite commits a delete and an append snapshot, each carrying our plan id:
        # walking back from the current snapshot, only ours may lie before ``base``. (A
        # previous commit of the same plan may be ``base`` itself: the walk stops there.)
        plan = metadata.get(META_PREFIX + "plan_id")
        snapshot = None if handle is None else handle.current_snapshot()
        for _ in range(8):
            if snapshot is None:
                return base is None
            if str(snapshot.snapshot_id) == base:
                return True
            if snapshot.summary is None or snapshot.summary.additional_properties.get(META_PREFIX + "plan_id") != plan:
                return False
            parent = snapshot.parent_snapshot_id
            snapshot = None if parent is None else handle.snapshot_by_id(parent)
        return False

    @staticmethod
    def _without_retries(handle: Any) -> Any:
        """The handle's table, with its commit made once: pyiceberg retries a failed commit
        (``commit.retry.num-retries``, default 4) on the newer snapshot when the other
        writer's commit did not touch our overwrite's partitions. The property is set on
        this in-memory copy only: a commit sends its updates, never the metadata read."""
        from pyiceberg.table import Table, TableProperties
        properties = {**handle.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
        return Table(handle.name(), handle.metadata.model_copy(update={"properties": properties}),
                     handle.metadata_location, handle.io, handle.catalog, handle.config)

    # -- files a build engine writes (core.lake.tables.FileLakeTable) --------------------------
    carries_partition = True  # an Iceberg data file holds its identity partition column

    def partition_files(self, handle: Any, column: str, values: Sequence[PartitionValue],
                        version: str | None = None) -> dict[str, list[str]] | None:
        snapshot = version if version is not None else self.version(handle)
        if snapshot is None:
            return {partition_label(v): [] for v in values}
        if handle.snapshot_by_id(int(snapshot)) is None:
            handle = self._load()
        found: dict[str, list[str]] = {}
        for v in values:
            tasks = list(handle.scan(snapshot_id=int(snapshot), row_filter=self._filter(column, [v])).plan_files())
            paths = plain_iceberg_files(handle.schema(), handle.schema().as_arrow(), tasks)
            if paths is None:
                return None
            found[partition_label(v)] = paths
        return found

    SIGNAL = "manifest files"

    def partition_signatures(self, handle: Any, column: str, values: Sequence[Part],
                             version: str | None = None) -> dict[str, str | None] | None:
        """Each partition's data and delete files in the manifests (an Iceberg file is never
        written again) and the schema they are read with, at the handle's snapshot or at
        snapshot ``version``."""
        labels = [part_label(v) for v in values]
        if handle is None:
            return dict.fromkeys(labels, None)
        snapshot_id = version if version is not None else self.version(handle)
        if snapshot_id is None:  # no snapshot yet: every partition is empty
            return {label: signature(handle.schema().model_dump_json(), [], []) for label in labels}
        snapshot = handle.snapshot_by_id(int(snapshot_id))
        if snapshot is None:
            handle = self._load()
            snapshot = None if handle is None else handle.snapshot_by_id(int(snapshot_id))
            if snapshot is None:
                return None  # expired
        schema = handle.schema() if version is None else handle.schemas().get(snapshot.schema_id, handle.schema())
        out: dict[str, str | None] = {}
        for label, v in zip(labels, values):
            tasks = list(handle.scan(snapshot_id=int(snapshot_id), row_filter=self._filter(column, [v])).plan_files())
            out[label] = signature(schema.model_dump_json(), sorted(t.file.file_path for t in tasks),
                                   sorted(d.file_path for t in tasks for d in t.delete_files))
        return out

    def versions_after(self, handle: Any, version: str) -> list[str] | None:
        chain, snapshot = [], None if handle is None else handle.current_snapshot()
        while snapshot is not None and str(snapshot.snapshot_id) != version:
            chain.append(str(snapshot.snapshot_id))
            parent = snapshot.parent_snapshot_id
            snapshot = None if parent is None else handle.snapshot_by_id(parent)
        return None if snapshot is None else chain[::-1]

    def writable_as_files(self, handle: Any) -> bool:
        """Our files carry column names, not field ids: readers find their columns through the
        table's name mapping (add_files sets one from the current schema where there is none),
        which must then map each column's current name to its field id."""
        mapping = None if handle is None else handle.metadata.name_mapping()
        if mapping is None:
            return True
        mapped = {name: field.field_id for field in mapping for name in field.names}
        return all(mapped.get(f.name) == f.field_id for f in handle.schema().fields)

    def new_file(self, handle: Any, column: str, label: str, tag: str) -> tuple[str, str]:
        folder = Path(local_path(handle.location()), "data", f"{quote(column, safe='')}={quote(label, safe='')}")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"00000-{tag}-{uuid.uuid4()}.parquet"
        return str(path), "file://" + str(path)

    def commit_files(self, handle: Any, column: str, values: Sequence[PartitionValue], files: Sequence[WrittenFile],
                     schema: pa.Schema, metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """One transaction: the partitions' files deleted by their filter (whole files, from the
        metadata), ours added (pyiceberg infers each file's partition from its column
        statistics, and sets the table's name mapping if it has none, since our files carry
        names, not field ids): a delete and an append snapshot in one catalog commit."""
        from pyiceberg.exceptions import CommitFailedException, ValidationException
        before = self.version(handle)
        table = self._without_retries(handle) if exclusive else handle
        try:
            with warnings.catch_warnings(), table.transaction() as txn:
                warnings.filterwarnings("ignore", "Delete operation did not match", UserWarning)
                txn.delete(self._filter(column, values), snapshot_properties=dict(metadata))
                if files:
                    txn.add_files([f.logged for f in files], snapshot_properties=dict(metadata),
                                  check_duplicate_files=False)
        except (CommitFailedException, ValidationException) as err:
            for f in files:
                Path(f.path).unlink(missing_ok=True)
            raise TransientDatabaseError(
                commit_failed(self.name, values, before, exclusive, err.__class__.__name__)
            ) from err
        return self._committed(handle, table, before, values, metadata)

    def read_version(self, version: str | None, column: str, values: Sequence[Part]) -> pa.Table:
        known = self._loaded is not None and version is not None and self._loaded.snapshot_by_id(int(version))
        handle = self._loaded if known else self._load()
        self._loaded = handle
        if handle is None:
            raise VerificationError(", ".join(part_label(v) for v in values), "read of the committed snapshot",
                                    f"{self.name} at snapshot {version}", "no table")
        return self._scan(handle, None if version is None else int(version), column, values)

    def create(self, schema: pa.Schema, partition_key: str, windowing: Windowing | None = None) -> str | None:
        """Partitioned by the key's values (identity), or for time windows by the transform of
        the column that cuts time where they do (:func:`window_transform`)."""
        namespace = self.identifier.split(".")[0]
        Path(self.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        catalog = self.catalog()
        catalog.create_tables()  # the catalog's own tables, if missing
        catalog.create_namespace_if_not_exists(namespace)
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
        # One catalog commit: the schema and its identity partitioning together.
        try:
            with catalog.create_table_transaction(self.identifier, schema=schema) as txn:
                with txn.update_spec() as spec:
                    if windowing is None:
                        spec.add_identity(partition_key)
                    else:
                        transform = window_transform(windowing)
                        spec.add_field(partition_key, window_transform_of(transform), f"{partition_key}_{transform}")
        except (TableAlreadyExistsError, CommitFailedException):
            problem = f"creating {self.name}: another writer created it first"
        else:
            return None  # a new Iceberg table has no snapshot
        raise TransientDatabaseError(problem)

    def overwrite(self, handle: Any, column: str, values: Sequence[Part], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str:
        from pyiceberg.exceptions import CommitFailedException, ValidationException
        check_rows_in(data, column, values, self.name)
        before = self.version(handle)
        # Exclusive: one attempt, whose AssertRefSnapshotId (main is still the snapshot read)
        # fails if anything was committed since.
        table = self._without_retries(handle) if exclusive else handle
        try:
            with warnings.catch_warnings():
                # "Delete operation did not match any records": a partition that was empty.
                warnings.filterwarnings("ignore", "Delete operation did not match", UserWarning)
                table.overwrite(data, overwrite_filter=self._filter(column, values),
                                snapshot_properties=dict(metadata))
        except (CommitFailedException, ValidationException) as err:
            raise TransientDatabaseError(
                commit_failed(self.name, values, before, exclusive, err.__class__.__name__)
            ) from err
        return self._committed(handle, table, before, values, metadata)

    def _committed(self, handle: Any, table: Any, before: str | None, values: Sequence[Part],
                   metadata: Mapping[str, str]) -> str | None:
        """Our commit's snapshot, checked to carry our plan (``before`` where nothing was
        committed); the handle then reads it."""
        if table is not handle:  # the handle reads what we committed, as after a commit of its own
            handle.metadata, handle.metadata_location = table.metadata, table.metadata_location
        snapshot = handle.current_snapshot()
        if snapshot is None or str(snapshot.snapshot_id) == before:
            # Nothing to delete and nothing to append (an empty stage, an empty partition):
            # pyiceberg commits no snapshot, and the partition is as approved at ``before``.
            return before
        if snapshot.summary is None or \
                snapshot.summary.additional_properties.get(META_PREFIX + "plan_id") != metadata.get(META_PREFIX + "plan_id"):
            raise VerificationError(
                ", ".join(part_label(v) for v in values), f"snapshot summary of {self.name}",
                f"a snapshot by plan {metadata.get(META_PREFIX + 'plan_id', '')[:16]}", "another snapshot",
            )
        return str(snapshot.snapshot_id)

