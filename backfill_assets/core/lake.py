"""Lake tables a backfill can replace partitions of: Delta Lake (``deltalake``) and Apache
Iceberg (``pyiceberg``), behind one small interface.

Each is written with its engine's native partition overwrite, in one commit per partition
(or group of partitions):

- Delta: ``write_deltalake(mode="overwrite", predicate=<the partition>)`` on a handle loaded
  at the version the partition was read at. delta-rs refuses rows outside the predicate, and
  fails the commit (``CommitFailedError``) when another writer changed the same partition
  since that version. The predicate is built here from typed, validated values only, and
  compared with the one the table's history records for our version.
- Iceberg: ``overwrite(df, overwrite_filter=<the partition>)`` on a table loaded at the
  snapshot the partition was read at: one catalog commit (a delete and an append snapshot),
  validated against writers since. pyiceberg does not refuse rows outside the filter (they
  would land in other partitions), so every row's partition is checked here first. Never
  ``dynamic_partition_overwrite``: with an empty stage it leaves the stale rows.

Both read a partition at an exact version (Delta) or snapshot (Iceberg), so the check after
our commit reads what we committed, whatever was committed since; both carry our plan id and
content hash in the commit's own metadata. The stages, the control schema and the ledger
stay in PostgreSQL (core.target.LakeTarget ties the two together).

Both engines REBASE a commit over another writer's commit to other partitions (delta-rs's
conflict checker and pyiceberg's retries test only the overwrite's own partitions): right for
a partition overwrite, not for a promise about the whole table. With ``records_can_move`` a
business key has one home across the table, so :meth:`LakeTable.keys_elsewhere` reads, at
the version the commit is based on, whether a key being written lies in another partition,
and the overwrite is then ``exclusive``: committed as the very next version after that one,
or not at all (Delta ``max_commit_retries=0``: a newer version, or losing the race for the
next one, fails the commit; Iceberg: no retry, so ``AssertRefSnapshotId`` on the snapshot
read fails it). :meth:`LakeTable.follows` confirms afterwards that nothing landed in
between, without relying on either library keeping that behaviour.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from backfill_assets.core.db import as_transient
from backfill_assets.core.errors import (
    BackfillError, ConnectionConfigError, LakeTargetError, SpecError, TransientDatabaseError, VerificationError,
)
from backfill_assets.core.spec import PartitionValue, TargetSpec, partition_label

# Commit metadata keys (Delta commit properties, Iceberg snapshot summary).
META_PREFIX = "backfill_assets."


@dataclass(frozen=True)
class TableShape:
    """What a lake table's metadata says: its columns and Arrow types, its partitioning, and
    what could refuse rows at commit: columns that may not be NULL, and table constraints."""

    columns: list[tuple[str, pa.DataType]]
    partitioned_by: list[str]
    required: list[str] = field(default_factory=list)
    constraints: list[str] = field(default_factory=list)


class LakeTable(Protocol):
    """One lake table. ``Handle`` is the table loaded at one version (None: no table yet)."""

    name: str

    def shape(self) -> TableShape | None:
        """The table's columns and partitioning, or None when it does not exist."""
        ...

    def open(self) -> Any:
        """The table at its current version (None when it does not exist)."""
        ...

    def version(self, handle: Any) -> str | None:
        """The version (Delta) or snapshot id (Iceberg) a handle reads; None: no commit yet."""
        ...

    def read(self, handle: Any, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        """The rows of some partitions as the handle's version holds them."""
        ...

    def read_version(self, version: str | None, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        """The rows of some partitions at exactly ``version``, read afresh."""
        ...

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        """Some columns of every row, as the handle's version holds them."""
        ...

    def create(self, schema: pa.Schema, partition_key: str) -> str | None:
        """Create the table, empty, partitioned by ``partition_key`` (identity); return the
        version that creation made (what :meth:`version` says of a handle opened right after,
        unless another writer came in between).

        Raises:
            TransientDatabaseError: another writer created the table first.
        """
        ...

    def close(self) -> None:
        """Release the catalog's connections."""
        ...

    def overwrite(self, handle: Any, column: str, values: Sequence[PartitionValue], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str | None:
        """Replace the partitions with ``data`` in one commit based on the handle's version;
        return the committed version. The handle then reads that version. ``exclusive``: the
        commit must be the next version after the handle's (not rebased over a commit to
        other partitions).

        Raises:
            TransientDatabaseError: another writer changed these partitions since (with
                ``exclusive``: the table) (safe to retry).
        """
        ...

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[PartitionValue],
                       keys: pa.Table) -> pa.Table | None:
        """The rows, as the handle's version holds them, outside the partitions ``values``
        whose business key (the columns of ``keys``) is one of ``keys``' rows: their
        partition column and key columns only (None: no table or no commit yet). Reads only
        those columns, skipping the partitions ``values`` and the files whose key statistics
        lie outside the keys' range."""
        ...

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        """Whether the version the handle reads was committed directly on ``base`` by the
        commit carrying ``metadata`` (nothing of another writer in between)."""
        ...


def _library_errors() -> tuple[type[BaseException], ...]:
    """What deltalake, pyiceberg, pyarrow, SQLAlchemy (the Iceberg catalog) and the file system
    raise: the failures :func:`lake_errors` reports as our own."""
    import pyiceberg.exceptions as iceberg_errors
    from deltalake.exceptions import DeltaError
    from sqlalchemy.exc import SQLAlchemyError
    iceberg = tuple(v for v in vars(iceberg_errors).values() if isinstance(v, type) and issubclass(v, Exception))
    return (DeltaError, OSError, pa.ArrowException, ValueError, SQLAlchemyError, *iceberg)


@contextlib.contextmanager
def lake_errors(table: LakeTable, what: str) -> Iterator[None]:
    """Report a lake library's failure as :class:`LakeTargetError` (a one-line message, at most
    300 characters of the library's, the table's secret removed), so that apply records it in
    the ledger and stops like any other failure. Our own errors pass through."""
    try:
        yield
    except BackfillError:
        raise
    except _library_errors() as err:
        # A lock or statement timeout in an Iceberg catalog kept in PostgreSQL (SQLAlchemy wraps
        # the driver's error): transient, like the same wait anywhere else.
        transient = as_transient(err, f"{what} {table.name}")
        if transient is not None:
            raise transient from None
        text = " ".join(str(err).split())
        secret = getattr(table, "secret", None)
        if secret:
            text = text.replace(secret, "[redacted]")
        problem = f"{what} {table.name}: {err.__class__.__name__}: {text[:300]}"
    else:
        return
    raise LakeTargetError(problem)  # outside the except block: the library's error is not chained


def lake_table(target: TargetSpec, catalog_url: Any = None) -> LakeTable:
    """The lake table of a spec's target. ``catalog_url``: an Iceberg SQL catalog's
    SQLAlchemy URL (core.target works it out; never printed)."""
    if target.format == "delta":
        assert target.location is not None
        return DeltaLakeTable(target.location)
    if target.format == "iceberg":
        assert target.table is not None and target.catalog is not None
        source = f"${target.catalog.uri_env}" if target.catalog.uri_env else "the spec's database"
        return IcebergLakeTable(target.table, target.catalog.name, target.catalog.warehouse, catalog_url, source)
    raise TypeError(f"{target.format} is not a lake format")


def _local_path(location: str) -> str:
    """An absolute local path from a path or file:// URI (relative paths: the current directory)."""
    return str(Path(location.removeprefix("file://")).expanduser().resolve())


_UTC_NAMES = ("UTC", "+00:00", "Etc/UTC", "Z")


def _folded(t: pa.DataType) -> pa.DataType | str | tuple:
    """An Arrow type with what does not change its values folded: dictionaries by their value
    type, the string kinds into one, the binary kinds into one, UTC by any name."""
    if pa.types.is_dictionary(t):
        return _folded(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return ("timestamp", t.unit, "UTC" if t.tz in _UTC_NAMES else t.tz)
    return t


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two Arrow types hold the same values (:func:`_folded`)."""
    return _folded(a) == _folded(b)


def type_text(t: pa.DataType) -> str:
    """An Arrow type as plans and messages print it, folded as :func:`same_type` folds it."""
    folded = _folded(t)
    if isinstance(folded, str):
        return folded
    if isinstance(folded, tuple):
        return f"timestamp[{folded[1]}, tz={folded[2]}]" if folded[2] else f"timestamp[{folded[1]}]"
    return str(folded)


def shape_problems(name: str, shape: TableShape, wanted: Sequence[tuple[str, pa.DataType]],
                   partition_key: str) -> list[str]:
    """Why an existing lake table cannot take the stage's rows, naming each column."""
    problems = []
    have = dict(shape.columns)
    for column, want in wanted:
        if column not in have:
            problems.append(f"{name} has no column {column} (the stage has it as {type_text(want)})")
        elif not same_type(have[column], want):
            problems.append(
                f"{name} column {column} is {type_text(have[column])} but the stage's is {type_text(want)}"
            )
    extra = [c for c, _ in shape.columns if c not in dict(wanted)]
    if extra:
        problems.append(f"{name} has column(s) {', '.join(extra)} that the spec's columns do not list")
    for column in shape.required:
        problems.append(
            f"{name} column {column} may not be NULL, but the stage's column may hold NULL (and the rows "
            "written declare it nullable); make the lake column nullable"
        )
    for constraint in shape.constraints:
        problems.append(
            f"{name} has the constraint {constraint}, which could refuse the stage's rows at commit; "
            "drop it, or keep it out of the table this tool writes"
        )
    if shape.partitioned_by != [partition_key]:
        problems.append(
            f"{name} is partitioned by ({', '.join(shape.partitioned_by) or 'nothing'}), "
            f"not by the partition key ({partition_key})"
        )
    return problems


EXAMPLE_KEYS = 3  # example keys an error names


def _key_bounds(keys: pa.Table) -> list[tuple[str, Any, Any]]:
    """Each key column's least and greatest value among ``keys`` (NULLs left out), for the
    column types whose order file statistics keep as Python compares them (integers, text,
    dates): a range the key check filters on, so that the engine skips the files and row
    groups outside it. Only a pre-filter: :func:`_among` decides."""
    bounds = []
    for name in keys.column_names:
        t = keys.schema.field(name).type
        if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_date32(t)):
            continue
        extremes = pc.min_max(keys[name])
        least, greatest = extremes["min"].as_py(), extremes["max"].as_py()
        if least is not None and greatest is not None:
            bounds.append((name, least, greatest))
    return bounds


def _among(found: pa.Table, keys: pa.Table) -> pa.Table:
    """The rows of ``found`` whose key (the columns of ``keys``) equals a row of ``keys``: a
    semi-join in Arrow, the keys cast to the lake's types (a NULL key matches nothing)."""
    names = keys.column_names
    plain = {n: found.schema.field(n).type for n in names}
    for n, t in plain.items():
        if pa.types.is_dictionary(t):
            found = found.set_column(found.schema.get_field_index(n), n, found[n].cast(t.value_type))
            plain[n] = t.value_type
    wanted = pa.table({n: keys[n].cast(plain[n]) for n in names})
    return found.join(wanted, keys=names, join_type="left semi")


@dataclass(frozen=True)
class KeysFound:
    """Business keys found in other partitions: those partitions (labels, sorted), how many
    distinct keys, and a few as ``key=value in partition``."""

    partitions: list[str]
    count: int
    examples: list[str]


def keys_found(found: pa.Table | None, column: str, key_columns: Sequence[str]) -> KeysFound | None:
    """What :meth:`LakeTable.keys_elsewhere` found, for a message; None if nothing."""
    if found is None or found.num_rows == 0:
        return None
    labels = sorted({"NULL" if v is None else partition_label(v) for v in pc.unique(found[column]).to_pylist()})
    count = found.group_by(list(key_columns)).aggregate([]).num_rows
    first = found.sort_by([(c, "ascending") for c in (*key_columns, column)]).slice(0, EXAMPLE_KEYS)
    examples = [
        ", ".join(f"{c}={row[c]}" for c in key_columns)
        + f" in {'NULL' if row[column] is None else partition_label(row[column])}"
        for row in first.to_pylist()
    ]
    return KeysFound(labels, count, examples)


def check_rows_in(data: pa.Table, column: str, values: Sequence[PartitionValue], name: str) -> None:
    """Every row of ``data`` must lie in one of the partitions ``values`` (pyiceberg writes
    rows outside an overwrite's filter into other partitions instead of refusing them).

    Raises:
        VerificationError: naming how many rows lie outside.
    """
    if data.num_rows == 0:
        return
    inside = pc.is_in(data[column], value_set=pa.array(list(values), type=data.schema.field(column).type))
    outside = data.num_rows - pc.sum(pc.fill_null(inside, False).cast(pa.int64())).as_py()
    if outside:
        raise VerificationError(
            ", ".join(partition_label(v) for v in values), f"partition check before writing {name}",
            f"every row in partition(s) {', '.join(partition_label(v) for v in values)}", f"{outside} row(s) outside",
        )


def _commit_failed(name: str, values: Sequence[PartitionValue], base: object, exclusive: bool, why: str) -> str:
    """The problem of an overwrite another writer's commit made fail (TransientDatabaseError
    adds that it is safe to retry)."""
    labels = ", ".join(partition_label(v) for v in values)
    if exclusive:
        return (f"replacing partition(s) {labels} of {name}: another writer committed to the table after "
                f"version {base}, which our commit had to follow directly (with records_can_move the "
                f"business keys are checked at that version) ({why}); nothing of ours was committed")
    return (f"replacing partition(s) {labels} of {name}: another writer committed to them first ({why}); "
            "nothing of ours was committed")


# --- Delta Lake ------------------------------------------------------------------------------


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


def delta_predicate(column: str, values: Sequence[PartitionValue]) -> str:
    """``"col" = v`` (one partition) or ``"col" IN (v1, v2)``, from validated values only."""
    ident = '"' + column.replace('"', '""') + '"'
    if len(values) == 1:
        return f"{ident} = {_sql_literal(values[0])}"
    return f"{ident} IN ({', '.join(_sql_literal(v) for v in values)})"


class DeltaLakeTable:
    """A Delta table on local disk."""

    def __init__(self, location: str) -> None:
        self.path = _local_path(location)
        self.name = f"delta table {location}"

    def _load(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError
        try:
            return DeltaTable(self.path, version=version)
        except TableNotFoundError:
            return None

    def shape(self) -> TableShape | None:
        table = self._load()
        if table is None:
            return None
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
        return self._load()

    def version(self, handle: Any) -> str | None:
        return None if handle is None else str(handle.version())

    def read(self, handle: Any, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        dataset = handle.to_pyarrow_dataset()
        return dataset.to_table(filter=pads.field(column).isin(list(values)))

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        return handle.to_pyarrow_dataset().to_table(columns=list(columns))

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[PartitionValue],
                       keys: pa.Table) -> pa.Table | None:
        if handle is None:
            return None
        # Rows with a NULL partition value are outside our partitions too (~isin keeps them).
        where = ~pads.field(column).isin(list(values))
        for name, least, greatest in _key_bounds(keys):
            where = where & (pads.field(name) >= least) & (pads.field(name) <= greatest)
        found = handle.to_pyarrow_dataset().to_table(columns=[column, *keys.column_names], filter=where)
        return _among(found, keys)

    def follows(self, handle: Any, base: str | None, metadata: Mapping[str, str]) -> bool:
        # The version after ``base`` is ours (_check_commit read it from the log): nothing
        # can lie between them.
        return handle is not None and base is not None and handle.version() == int(base) + 1

    def read_version(self, version: str | None, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        handle = self._load(None if version is None else int(version))
        if handle is None:
            raise VerificationError(", ".join(partition_label(v) for v in values), "read of the committed version",
                                    f"{self.name} at version {version}", "no table")
        return self.read(handle, column, values)

    def close(self) -> None:
        pass

    def create(self, schema: pa.Schema, partition_key: str) -> str | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError
        Path(self.path).mkdir(parents=True, exist_ok=True)
        try:
            created = DeltaTable.create(self.path, schema, mode="error", partition_by=[partition_key])
        except DeltaError as err:
            if "already exists" not in str(err):
                raise
            problem = f"creating {self.name}: another writer created it first"
        else:
            return str(created.version())
        raise TransientDatabaseError(problem)

    def overwrite(self, handle: Any, column: str, values: Sequence[PartitionValue], data: pa.Table,
                  metadata: Mapping[str, str], exclusive: bool = False) -> str:
        from deltalake import CommitProperties, write_deltalake
        from deltalake.exceptions import CommitFailedError
        predicate = delta_predicate(column, values)
        base = handle.version()
        # Without retries delta-rs commits exactly the next version after the handle's, or
        # fails: it neither rebases over a newer version nor retries after losing the race
        # for the next one.
        properties = CommitProperties(custom_metadata=dict(metadata), max_commit_retries=0 if exclusive else None)
        try:
            write_deltalake(handle, data, mode="overwrite", predicate=predicate, commit_properties=properties)
        except CommitFailedError as err:
            raise TransientDatabaseError(
                _commit_failed(self.name, values, base, exclusive, " ".join(str(err).split())[:200])
            ) from err
        version = handle.version()
        self._check_commit(version, column, values, predicate, metadata)
        return str(version)

    def _check_commit(self, version: int, column: str, values: Sequence[PartitionValue], predicate: str,
                      metadata: Mapping[str, str]) -> None:
        """Read OUR commit from the table's log: an overwrite with a predicate, carrying our
        plan, whose every added and removed file lies in our partitions. (delta-rs records
        the predicate as it parsed it, ``order_date = '2024-01-01'::date``, so its text is not
        compared; the files it touched say exactly what it did.)

        Raises:
            VerificationError: naming what the commit did instead.
        """
        import json
        log = Path(self.path) / "_delta_log" / f"{version:020d}.json"
        actions = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        params = info.get("operationParameters", {})
        ours = {partition_label(v) for v in values}
        touched = {(a.get("add") or a.get("remove") or {}).get("partitionValues", {}).get(column)
                   for a in actions if "add" in a or "remove" in a}
        if (info.get("operation") != "WRITE" or params.get("mode") != "Overwrite" or not params.get("predicate")
                or info.get(META_PREFIX + "plan_id") != metadata.get(META_PREFIX + "plan_id")
                or not touched <= ours):
            raise VerificationError(
                ", ".join(sorted(ours)), f"the log of {self.name} at version {version}",
                f"an overwrite where {predicate} by plan {metadata.get(META_PREFIX + 'plan_id', '')[:16]}, "
                f"touching partition(s) {', '.join(sorted(ours))} only",
                f"{info.get('operation')} {params.get('mode')} where {params.get('predicate')} touching "
                f"{', '.join(sorted(str(t) for t in touched))}",
            )


# --- Apache Iceberg ---------------------------------------------------------------------------


def _iceberg_literal(value: PartitionValue) -> object:
    return value.isoformat() if isinstance(value, dt.date) else value


class IcebergLakeTable:
    """An Iceberg table in a pyiceberg SQL catalog, with a local warehouse."""

    def __init__(self, identifier: str, catalog_name: str, warehouse: str, catalog_url: Any,
                 catalog_source: str = "the spec's database") -> None:
        self.identifier = identifier
        self.catalog_source = catalog_source
        self.name = f"iceberg table {identifier}"
        self.catalog_name = catalog_name
        self.warehouse = "file://" + _local_path(warehouse)
        self._url = catalog_url
        # The catalog password, removed from any library message we report (never printed).
        self.secret = getattr(catalog_url, "password", None) or None
        self._catalog: Any = None

    def catalog(self) -> Any:
        """The SQL catalog. It does not create its own tables (pyiceberg would, on connecting):
        reading is read-only; :meth:`create` creates them."""
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog
            from sqlalchemy.exc import DBAPIError
            # The URL object keeps its password out of every repr; it is never printed.
            try:
                catalog = SqlCatalog(self.catalog_name, uri=self._url, warehouse=self.warehouse,
                                     init_catalog_tables="false")
                # pyiceberg takes a failed connection for missing catalog tables: connect here.
                catalog.engine.connect().close()
                self._catalog = catalog
            except ImportError as err:  # the URL names a driver that is not installed
                problem = (f"the Iceberg catalog URL in {self.catalog_source} needs the {err.name or 'a'} "
                           "driver, which is not installed; use a postgresql or sqlite URL")
            except DBAPIError as err:
                problem = " ".join(str(err.orig).split())
                password = getattr(self._url, "password", None)
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

    def _filter(self, column: str, values: Sequence[PartitionValue]) -> Any:
        from pyiceberg.expressions import EqualTo, In
        literals = [_iceberg_literal(v) for v in values]
        return EqualTo(column, literals[0]) if len(literals) == 1 else In(column, literals)

    def _scan(self, handle: Any, snapshot_id: int | None, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        schema = handle.schema().as_arrow()
        if snapshot_id is None:
            return schema.empty_table()
        return handle.scan(row_filter=self._filter(column, values), snapshot_id=snapshot_id).to_arrow()

    def read_columns(self, handle: Any, columns: Sequence[str]) -> pa.Table:
        if self.version(handle) is None:
            return handle.schema().as_arrow().empty_table().select(list(columns))
        return handle.scan(selected_fields=tuple(columns)).to_arrow()

    def read(self, handle: Any, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        version = self.version(handle)
        return self._scan(handle, None if version is None else int(version), column, values)

    def keys_elsewhere(self, handle: Any, column: str, values: Sequence[PartitionValue],
                       keys: pa.Table) -> pa.Table | None:
        from pyiceberg.expressions import And, GreaterThanOrEqual, IsNull, LessThanOrEqual, Not, Or
        version = self.version(handle)
        if version is None:
            return None
        # NOT (col IN ...) leaves out a NULL partition value, which lies outside ours too.
        where: Any = Or(IsNull(column), Not(self._filter(column, values)))
        for name, least, greatest in _key_bounds(keys):
            where = And(where, GreaterThanOrEqual(name, _iceberg_literal(least)),
                        LessThanOrEqual(name, _iceberg_literal(greatest)))
        found = handle.scan(row_filter=where, selected_fields=(column, *keys.column_names),
                            snapshot_id=int(version)).to_arrow()
        return _among(found, keys)

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

    def read_version(self, version: str | None, column: str, values: Sequence[PartitionValue]) -> pa.Table:
        handle = self._load()
        if handle is None:
            raise VerificationError(", ".join(partition_label(v) for v in values), "read of the committed snapshot",
                                    f"{self.name} at snapshot {version}", "no table")
        return self._scan(handle, None if version is None else int(version), column, values)

    def create(self, schema: pa.Schema, partition_key: str) -> str | None:
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
                    spec.add_identity(partition_key)
        except (TableAlreadyExistsError, CommitFailedException):
            problem = f"creating {self.name}: another writer created it first"
        else:
            return None  # a new Iceberg table has no snapshot
        raise TransientDatabaseError(problem)

    def overwrite(self, handle: Any, column: str, values: Sequence[PartitionValue], data: pa.Table,
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
                _commit_failed(self.name, values, before, exclusive, err.__class__.__name__)
            ) from err
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
                ", ".join(partition_label(v) for v in values), f"snapshot summary of {self.name}",
                f"a snapshot by plan {metadata.get(META_PREFIX + 'plan_id', '')[:16]}", "another snapshot",
            )
        return str(snapshot.snapshot_id)
