"""The declared backfill: a YAML spec validated by pydantic.

Nothing here touches a database. Identifiers are checked for shape only (core.vocabulary);
core.pg.catalog checks that they exist.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated, Literal

import pydantic
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backfill_assets.core.errors import SpecError
from backfill_assets.core.vocabulary import (
    MAX_SPEC_NAME,
    Identifier,
    Limits,
    TableName,
    TableRef,
    check_identifier,
    parse_table_name,
)


def _check_env_name(value: str) -> str:
    # Never echo the value: someone may have pasted the URL itself here.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(
            "must be the NAME of an environment variable (like DATABASE_URL), not the URL itself"
        )
    return value


def _check_function_name(value: str) -> str:
    parts = value.split(".")
    if len(parts) != 2:
        raise ValueError("a trusted function is written as schema.function (one dot), without arguments")
    for part in parts:
        check_identifier(part)
    if parts[0] == "pg_catalog":
        raise ValueError("functions in pg_catalog are judged by the guard itself; list only your own")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSpec(_Strict):
    """A PostgreSQL table in the spec's database (``format`` may be left out)."""

    format: Literal["postgres"] = "postgres"
    table: TableName
    snapshot: Literal["copy", "immutable"]
    # A column every write sets to a value above any the table holds (an ingest sequence, an
    # `updated_at` set on insert and update): the source sensor's cheap per-partition signal.
    # Its type is checked against the catalog by core.watch (an integer, numeric,
    # date or timestamp).
    change_column: Identifier | None = None

    @property
    def ref(self) -> TableRef:
        return parse_table_name(self.table)

    @property
    def display_name(self) -> str:
        """``schema.table``."""
        return str(self.ref)


class IcebergCatalogSpec(_Strict):
    """A pyiceberg SQL catalog. Its URI (a PostgreSQL URL) comes only from a named variable;
    without ``uri_env`` the catalog lives in the spec's own database (``database_url_env``)."""

    type: Literal["sql"]
    uri_env: Annotated[str, AfterValidator(_check_env_name)] | None = None
    warehouse: Annotated[str, Field(min_length=1)]
    # The catalog name pyiceberg keys the catalog's rows by (iceberg_tables.catalog_name).
    # "default" is what pyiceberg's load_catalog() uses when given no name, so a reader with
    # the URI alone sees the tables this tool writes (see docs/lake-targets.md).
    name: Identifier = "default"


_NAMESPACE_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A lake location is a path or a file:// URI; other schemes would need credentials, which a
# spec may only name (see database_url_env), and are not supported yet.
_LOCATION = re.compile(r"(file://)?[^\x00-\x1f\x7f]+")


def _only(given: object, fmt: str, allowed: set[str], shape: str, what: str = "target") -> object:
    """Refuse, naming the shape, a target (or source) mapping with a field its format does not take."""
    if isinstance(given, dict) and set(given) - allowed - {"format"}:
        article = "an" if fmt[:1] in "aeiou" else "a"
        raise ValueError(f"{article} {fmt} {what} takes {shape}")
    return given


class PostgresTargetSpec(_Strict):
    """A PostgreSQL table in the spec's database (``format`` may be left out)."""

    format: Literal["postgres"] = "postgres"
    table: TableName

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "postgres", {"table"}, "`table: schema.table` and no location or catalog")

    @property
    def ref(self) -> TableRef:
        return parse_table_name(self.table)

    @property
    def display_name(self) -> str:
        """``schema.table``."""
        return str(self.ref)


class DeltaTargetSpec(_Strict):
    """A Delta Lake table at a local path or ``file://`` URI."""

    format: Literal["delta"]
    location: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "delta", {"location"}, "`location: <path or file:// URI>` and no table or catalog")

    @pydantic.field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if "://" in value and not value.startswith("file://"):
            raise ValueError("a delta location is a local path or a file:// URI (other stores are not supported yet)")
        if not _LOCATION.fullmatch(value):
            raise ValueError("a delta location may not contain control characters")
        return value

    @property
    def display_name(self) -> str:
        """``delta:<absolute path>``: a relative location is resolved against the current
        directory now. A plan names exactly one table: run from another directory, the same
        spec names another Delta table, and apply refuses the plan as made for a different
        target."""
        return "delta:" + str(Path(self.location.removeprefix("file://")).expanduser().resolve())


class IcebergTargetSpec(_Strict):
    """An Iceberg table (``table`` as namespace.table) in a SQL ``catalog``."""

    format: Literal["iceberg"]
    table: str
    catalog: IcebergCatalogSpec

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "iceberg", {"table", "catalog"},
                     "`table: namespace.table` and a `catalog`, and no location")

    @pydantic.field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) != 2 or not all(_NAMESPACE_PART.fullmatch(p) for p in parts):
            raise ValueError("an iceberg table is written namespace.table, each a plain identifier (letters, digits, _)")
        return value

    @property
    def display_name(self) -> str:
        """``iceberg:<catalog name>:<namespace.table>``."""
        return f"iceberg:{self.catalog.name}:{self.table}"


def _check_location(fmt: str, value: str) -> str:
    if "://" in value and not value.startswith("file://"):
        raise ValueError(f"a {fmt} location is a local path or a file:// URI (other stores are not supported yet)")
    if not _LOCATION.fullmatch(value):
        raise ValueError(f"a {fmt} location may not contain control characters")
    return value


def _absolute(location: str) -> str:
    return str(Path(location.removeprefix("file://")).expanduser().resolve())


class _LocatedSource(_Strict):
    """A lake source named by its local path or ``file://`` URI (``engine: {type: duckdb}``)."""

    format: str
    location: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        fmt = given.get("format", "") if isinstance(given, dict) else ""
        return _only(given, fmt, {"location"}, "`location: <path or file:// URI>` and nothing else", "source")

    @pydantic.field_validator("location")
    @classmethod
    def _location(cls, value: str, info: pydantic.ValidationInfo) -> str:
        return _check_location(str(info.data.get("format", "lake")), value)

    @property
    def display_name(self) -> str:
        """``<format>:<absolute path>`` (see DeltaTargetSpec.display_name)."""
        return f"{self.format}:{_absolute(self.location)}"


class DeltaSourceSpec(_LocatedSource):
    """A Delta Lake table read at one pinned version."""

    format: Literal["delta"]


class ParquetSourceSpec(_LocatedSource):
    """A folder of Parquet files, Hive-partitioned by the partition key (``<key>=<value>/``),
    pinned by its file list, each file's size and SHA-256."""

    format: Literal["parquet"]


class JdbcSourceSpec(_Strict):
    """A PostgreSQL table read by Spark over JDBC (``engine: {type: spark}``), copied once into
    the engine's staging folder in one consistent read; ``url_env`` names the environment
    variable that holds its JDBC URL (``jdbc:postgresql://host:port/db?user=...``)."""

    format: Literal["jdbc"]
    table: TableName
    url_env: Annotated[str, AfterValidator(_check_env_name)]

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "jdbc", {"table", "url_env"},
                     "`table: schema.table` and `url_env: <NAME of a variable holding the JDBC URL>`", "source")

    @property
    def ref(self) -> TableRef:
        return parse_table_name(self.table)

    @property
    def display_name(self) -> str:
        """``jdbc:<url variable>:<schema.table>`` (never the URL: it may carry a password)."""
        return f"jdbc:{self.url_env}:{self.ref}"


class ParquetTargetSpec(_Strict):
    """A folder of Parquet files, Hive-partitioned by the partition key, each partition
    replaced by an atomic directory swap (``engine: {type: spark}``; core.targets.parquet)."""

    format: Literal["parquet"]
    location: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "parquet", {"location"}, "`location: <path or file:// URI>` and no table or catalog")

    @pydantic.field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        return _check_location("parquet", value)

    @property
    def display_name(self) -> str:
        """``parquet:<absolute path>`` (see DeltaTargetSpec.display_name)."""
        return "parquet:" + _absolute(self.location)


_SPARK_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}")


class SparkTableSpec(_Strict):
    """A table of the Spark session's catalog (``[catalog.]database.table``), partitioned by
    the partition key with its partitions in the catalog (``engine: {type: spark}``)."""

    format: Literal["spark_table"]
    table: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "spark_table", {"table"}, "`table: database.table` and nothing else")

    @pydantic.field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if not _SPARK_TABLE.fullmatch(value):
            raise ValueError("a spark_table is written [catalog.]database.table, each a plain identifier "
                             "(letters, digits, _)")
        return value

    @property
    def display_name(self) -> str:
        """``spark_table:<table>``."""
        return f"spark_table:{self.table}"


class IcebergSourceSpec(IcebergTargetSpec):
    """An Iceberg table read at one pinned snapshot id (``engine: {type: duckdb}``); named
    as an Iceberg target is."""

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "iceberg", {"table", "catalog"},
                     "`table: namespace.table` and a `catalog`, and no location", "source")


def _format(given: object) -> str:
    """The ``format`` of a source or target mapping (postgres when left out)."""
    if isinstance(given, dict):
        fmt = given.get("format", "postgres")
        return fmt if isinstance(fmt, str) else ""
    return getattr(given, "format", "")


# What the builds read, told apart by ``format``: a PostgreSQL table (the postgres engine), or
# a lake table or Parquet folder read where it lies (the duckdb engine, core.duck).
AnySourceSpec = Annotated[
    Annotated[SourceSpec, pydantic.Tag("postgres")]
    | Annotated[DeltaSourceSpec, pydantic.Tag("delta")]
    | Annotated[IcebergSourceSpec, pydantic.Tag("iceberg")]
    | Annotated[ParquetSourceSpec, pydantic.Tag("parquet")]
    | Annotated[JdbcSourceSpec, pydantic.Tag("jdbc")]
    | Annotated[SparkTableSpec, pydantic.Tag("spark_table")],
    pydantic.Discriminator(_format, custom_error_type="source_format",
                           custom_error_message="source.format is postgres (the default), delta, iceberg, parquet, "
                                                "jdbc or spark_table"),
]
LakeSourceSpec = DeltaSourceSpec | IcebergSourceSpec | ParquetSourceSpec
_SOURCE_TAGS = ("postgres", "delta", "iceberg", "parquet", "jdbc", "spark_table")


class EngineSpec(_Strict):
    """Where the source is read and both builds run: ``postgres`` (the default: the spec's
    database), ``duckdb`` (an embedded DuckDB over a lake source; core.duck) or ``spark``
    (Apache Spark; core.spark). Plans, approvals, the ledger and the locks stay in the
    control store either way."""

    type: Literal["postgres", "duckdb", "spark"] = "postgres"
    # spark: the session's master (local[N], spark://host:port, or sc://host:port for Spark
    # Connect) and its settings; a session already active in the process (a Dagster resource's)
    # is used as it is.
    master: Annotated[str, Field(min_length=1, pattern=r"^(local(\[(\d+|\*)\])?|spark://\S+|sc://\S+|yarn|k8s://\S+)$")] | None = None
    conf: dict[Annotated[str, Field(pattern=r"^spark\.[A-Za-z0-9_.-]+$")], str] = {}
    # spark: where the stages and a JDBC source's copies are written (default:
    # <home>/spark/<spec name>); every executor must see it.
    staging: Annotated[str, Field(min_length=1)] | None = None
    # duckdb: the database file the stages live in (default: <home>/duckdb/<spec name>.duckdb).
    database: Annotated[str, Field(min_length=1)] | None = None
    # duckdb: its memory_limit setting (for example 4GB); beyond it, DuckDB spills to disk.
    memory_limit: Annotated[str, Field(pattern=r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")] | None = None
    threads: Annotated[int, Field(strict=True, ge=1, le=256)] | None = None

    @pydantic.model_validator(mode="after")
    def _duckdb_only(self) -> EngineSpec:
        if self.type != "duckdb" and (self.database or self.memory_limit or self.threads):
            raise ValueError("database, memory_limit and threads are settings of `type: duckdb`")
        if self.type != "spark" and (self.master or self.conf or self.staging):
            raise ValueError("master, conf and staging are settings of `type: spark`")
        if self.database is not None:
            _check_location("duckdb database", self.database)
        if self.staging is not None:
            _check_location("spark staging", self.staging)
        return self


# Where apply writes, told apart by ``format``. Each format's engine (what inspection, the
# stages, the plan, approval, diff and apply ask of the target) is core.targets.engine_for's;
# a new engine is a variant here, its literal there, and its module.
TargetSpec = Annotated[
    Annotated[PostgresTargetSpec, pydantic.Tag("postgres")]
    | Annotated[DeltaTargetSpec, pydantic.Tag("delta")]
    | Annotated[IcebergTargetSpec, pydantic.Tag("iceberg")]
    | Annotated[ParquetTargetSpec, pydantic.Tag("parquet")]
    | Annotated[SparkTableSpec, pydantic.Tag("spark_table")],
    pydantic.Discriminator(_format, custom_error_type="target_format",
                           custom_error_message="target.format is postgres (the default), delta, iceberg, "
                                                "parquet or spark_table"),
]


class OrderingColumn(_Strict):
    """One newest-wins ordering column. ``nulls`` must be declared if the column has NULLs."""

    column: Identifier
    direction: Literal["asc", "desc"]
    nulls: Literal["first", "last"] | None = None


class PartitionsSpec(_Strict):
    """How the Dagster code location partitions the assets of a spec.

    ``daily`` and ``monthly`` are time windows from ``start`` to ``end`` (exclusive, default
    open); their keys are ISO dates (a month is keyed by its first day), so the partition key
    column must be a date. ``static`` lists the partition values.
    """

    type: Literal["daily", "monthly", "static"]
    start: dt.date | None = None
    end: dt.date | None = None
    values: list[str] | None = None

    @pydantic.model_validator(mode="after")
    def _shape(self) -> PartitionsSpec:
        if self.type == "static":
            if not self.values or self.start or self.end:
                raise ValueError("static partitions take a non-empty `values` list and no start/end")
            if len(set(self.values)) != len(self.values):
                raise ValueError("static partition values must be distinct")
        else:
            if self.start is None or self.values is not None:
                raise ValueError(f"{self.type} partitions take a `start` date (and an optional `end`), not values")
            if self.end is not None and self.end <= self.start:
                raise ValueError("partitions.end must come after partitions.start")
            if self.type == "monthly" and (self.start.day != 1 or (self.end and self.end.day != 1)):
                raise ValueError("monthly partitions start and end on the first day of a month")
        return self


# A parallel build holds one advisory lock per partition it builds (PostgreSQL's shared lock
# table holds max_locks_per_transaction * max_connections, 6,400 by default): these bounds keep
# every build at once within 3,200.
MAX_PARTITIONS_PER_RUN = 200
MAX_CONCURRENT_BUILDS = 16


class ParallelSpec(_Strict):
    """Multi-run backfills in the Dagster code location (see docs/dagster.md, "Running backfills in
    parallel"): a backfill becomes runs of at most ``max_partitions_per_run`` partitions, and at
    most ``max_concurrent_builds`` of the runs building the snapshot and stages go at once (the
    limit of the spec's build pool). The target's runs go one at a time."""

    max_partitions_per_run: Annotated[int, Field(strict=True, ge=1, le=MAX_PARTITIONS_PER_RUN)]
    max_concurrent_builds: Annotated[int, Field(strict=True, ge=1, le=MAX_CONCURRENT_BUILDS)]


class TrustedFunction(_Strict):
    """A function outside ``pg_catalog`` that ``transform_sql`` may call although the guard
    cannot see into it (see docs/reliability.md, "Functions the guard cannot see into"): ``name`` as ``schema.function``, and
    why its result depends on its arguments alone."""

    name: Annotated[str, AfterValidator(_check_function_name)]
    reason: Annotated[str, Field(min_length=1, max_length=500)]


_DURATION = re.compile(r"^\s*(\d+)\s*(d|day|days|h|hour|hours|m|min|minute|minutes)\s*$")
_DURATION_UNITS = {"d": "days", "h": "hours", "m": "minutes", "min": "minutes"}


def _parse_duration(value: object) -> object:
    """``7d``, ``36 hours``, ``90m`` as a timedelta (anything else is left to pydantic's
    own timedelta parsing: ISO 8601 such as ``P7D``, or seconds)."""
    if isinstance(value, str) and (m := _DURATION.match(value)):
        unit = m.group(2)
        unit = _DURATION_UNITS.get(unit, unit if unit.endswith("s") else unit + "s")
        return dt.timedelta(**{unit: int(m.group(1))})
    return value


Duration = Annotated[dt.timedelta, pydantic.BeforeValidator(_parse_duration)]
DEFAULT_APPROVAL_EXPIRY = dt.timedelta(days=7)


class Spec(_Strict):
    """A declared backfill. See docs/spec.md."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=MAX_SPEC_NAME)]
    database_url_env: Annotated[str, AfterValidator(_check_env_name)]
    # The control store (plans, approvals, ledger, the runs' locks) in another PostgreSQL
    # database, named by this variable; without it they live in control_schema of the data's.
    control_database_url_env: Annotated[str, AfterValidator(_check_env_name)] | None = None
    engine: EngineSpec = EngineSpec()
    source: AnySourceSpec
    target: TargetSpec
    partition_key: Identifier
    business_key: Annotated[list[Identifier], Field(min_length=1)]
    ordering: Annotated[list[OrderingColumn], Field(min_length=1)]
    columns: Annotated[list[Identifier], Field(min_length=1)]
    total: Identifier | None = None
    records_can_move: bool = False
    transform_version: Annotated[str, Field(min_length=1, max_length=200)]
    transform_sql: str | None = None
    control_schema: Identifier = "backfill_control"
    partitions: PartitionsSpec | None = None
    parallel: ParallelSpec | None = None
    lock_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 5_000
    statement_timeout_ms: Annotated[int, Field(gt=0, le=86_400_000)] = 600_000
    # Functions outside pg_catalog that transform_sql may call (core.guard.transform).
    trusted_functions: list[TrustedFunction] = []
    # An approval not applied within this long is expired: apply refuses it, status and the
    # approval sensor say so.
    approval_expires_after: Duration = DEFAULT_APPROVAL_EXPIRY
    # Apply replaces consecutive partitions together, in one transaction, while they hold at
    # most this many approved rows (0: one partition, or one group of linked partitions, per
    # transaction). Each partition is still verified on its own; a failure rolls back its batch.
    replace_batch_rows: Annotated[int, Field(ge=0, le=100_000_000)] = 0

    @pydantic.model_validator(mode="after")
    def _columns_agree(self) -> Spec:
        problems = []
        if len(set(self.columns)) != len(self.columns):
            problems.append("columns lists a column twice")
        if self.partition_key not in self.columns:
            problems.append(f"partition_key {self.partition_key!r} must be one of columns")
        if len(set(self.business_key)) != len(self.business_key):
            problems.append("business_key lists a column twice")
        if self.partition_key in self.business_key:
            problems.append(
                "business_key must not include partition_key: the grain is "
                "(partition_key, business_key)"
            )
        missing = [c for c in self.business_key if c not in self.columns]
        if missing:
            problems.append(f"business_key columns {missing} must be in columns")
        ordering = [o.column for o in self.ordering]
        if len(set(ordering)) != len(ordering):
            problems.append("ordering lists a column twice")
        in_key = [c for c in ordering if c in self.business_key or c == self.partition_key]
        if in_key:
            problems.append(f"ordering columns {in_key} are part of the key and cannot order it")
        if self.total is not None and self.total not in self.columns:
            problems.append(f"total {self.total!r} must be one of columns")
        if self.transform_sql is not None and not self.transform_sql.strip():
            problems.append("transform_sql is empty; remove it or write a SELECT")
        problems += self._engine_problems()
        if isinstance(self.source, SourceSpec) and self.source.change_column == self.partition_key:
            problems.append(
                "source.change_column must not be the partition_key: it must move on every write "
                "within a partition (an ingest sequence or an updated_at column)"
            )
        if self.records_can_move and isinstance(self.source, SourceSpec) and self.source.snapshot != "copy":
            problems.append(
                "records_can_move needs `snapshot: copy`: the versions of every moved key "
                "are copied so that old and new partitions are rebuilt from one snapshot"
            )
        if self.records_can_move and self.transform_sql is not None:
            problems.append(
                "records_can_move cannot be combined with transform_sql yet: a key's versions "
                "are found by the source's own business key columns"
            )
        if self.parallel is not None and self.records_can_move:
            problems.append(
                "parallel cannot be combined with records_can_move: the partitions a moved key "
                "links are built and replaced together, and a multi-run backfill splits the range "
                "into runs without knowing them; remove `parallel` (one run) or records_can_move"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _engine_problems(self) -> list[str]:
        lake_source = not isinstance(self.source, SourceSpec)
        if self.engine.type == "postgres":
            if isinstance(self.source, (JdbcSourceSpec, SparkTableSpec)):
                return [f"a {self.source.format} source is read by `engine: {{type: spark}}`; add it to the spec (the "
                        "postgres engine reads a PostgreSQL table of its own database)"]
            if lake_source:
                return [f"a {self.source.format} source is read by `engine: {{type: duckdb}}`; add it to the spec "
                        "(the postgres engine reads a PostgreSQL table)"]
            if self.target.format in ("parquet", "spark_table"):
                return [f"a {self.target.format} target is written by `engine: {{type: spark}}`; add it to the spec, or "
                        "choose a postgres, delta or iceberg target"]
            return []
        if self.engine.type == "spark":
            return self._spark_problems()
        problems = []
        if isinstance(self.source, (JdbcSourceSpec, SparkTableSpec)) or self.target.format in ("parquet", "spark_table"):
            problems.append("jdbc and spark_table sources, and parquet and spark_table targets, are read and written "
                            "by `engine: {type: spark}`")
        if not lake_source:
            problems.append("engine duckdb reads a lake source: source.format is delta, iceberg or parquet "
                            "(a PostgreSQL source is read by the postgres engine: remove `engine`)")
        if self.target.format == "postgres":
            problems.append("engine duckdb writes a lake target: target.format is delta or iceberg")
        if self.records_can_move and isinstance(self.source, ParquetSourceSpec):
            problems.append("records_can_move needs a Delta or Iceberg source on engine duckdb: a key's versions "
                            "are looked for in every partition of the pinned version, and a Parquet pin holds only "
                            "the planned partitions' files")
        if self.parallel is not None:
            problems.append("parallel is not supported on engine duckdb yet; remove it (one run builds every partition)")
        if self.replace_batch_rows:
            problems.append("replace_batch_rows is not supported on engine duckdb yet: each lake partition is "
                            "replaced in a commit of its own; remove it")
        if self.trusted_functions:
            problems.append("trusted_functions name PostgreSQL functions; engine duckdb trusts DuckDB's built-in "
                            "functions only: remove them")
        return problems

    def _spark_problems(self) -> list[str]:
        problems = []
        if not isinstance(self.source, (ParquetSourceSpec, JdbcSourceSpec, SparkTableSpec)):
            problems.append("engine spark reads a parquet folder (format: parquet, location), a PostgreSQL table "
                            "over JDBC (format: jdbc, table, url_env) or a table of its catalog (format: spark_table, "
                            "table): change source.format")
        if self.target.format not in ("parquet", "spark_table"):
            problems.append("engine spark writes a parquet folder (target: {format: parquet, location}) or a table of "
                            "its catalog (target: {format: spark_table, table}); Delta and Iceberg through Spark need "
                            "the cluster's own jars (docs/engines.md)")
        if self.records_can_move:
            problems.append("records_can_move is not supported on engine spark: a key's versions are looked for in "
                            "every partition of the pinned source, and a Parquet pin (or a JDBC copy) holds only the "
                            "planned partitions; remove it, or run the spec on engine duckdb over a Delta or Iceberg "
                            "source")
        if self.parallel is not None:
            problems.append("parallel is not supported on engine spark: one run builds every partition, and Spark "
                            "spreads the work over its executors; remove it")
        if self.replace_batch_rows:
            problems.append("replace_batch_rows is not supported on engine spark: each partition's files are "
                            "switched on their own; remove it")
        if self.trusted_functions:
            problems.append("trusted_functions name PostgreSQL functions; engine spark trusts Spark's built-in "
                            "functions only: remove them")
        return problems

    @pydantic.field_validator("approval_expires_after")
    @classmethod
    def _positive_expiry(cls, value: dt.timedelta) -> dt.timedelta:
        if value <= dt.timedelta(0) or value > dt.timedelta(days=3650):
            raise ValueError("approval_expires_after must be between 1 minute and 3650 days (for example 7d or 36h)")
        if value < dt.timedelta(minutes=1):
            raise ValueError("approval_expires_after must be at least 1 minute (for example 7d or 36h)")
        return value

    @property
    def limits(self) -> Limits:
        """The finite waits every connection of this spec carries (vocabulary.Limits)."""
        return Limits(self.lock_timeout_ms, self.statement_timeout_ms)

    @property
    def target_name(self) -> str:
        """The target as plans, ledgers and messages name it (see TargetSpec.display_name)."""
        return self.target.display_name

    @property
    def source_ref(self) -> TableRef:
        """A PostgreSQL source's table (TypeError for a lake source)."""
        if not isinstance(self.source, SourceSpec):
            raise TypeError(f"a {self.source.format} source is not a PostgreSQL table")
        return self.source.ref

    @property
    def source_name(self) -> str:
        """The source as plans and messages name it (``schema.table``, ``delta:<path>``, ...)."""
        return self.source.display_name

    @property
    def on_duckdb(self) -> bool:
        """Whether the source is read and the builds run in DuckDB (core.duck)."""
        return self.engine.type == "duckdb"

    @property
    def on_spark(self) -> bool:
        """Whether the source is read and the builds run in Apache Spark (core.spark)."""
        return self.engine.type == "spark"

    @property
    def target_ref(self) -> TableRef:
        """A PostgreSQL target's table (TypeError for any other format)."""
        if not isinstance(self.target, PostgresTargetSpec):
            raise TypeError(f"a {self.target.format} target is not a PostgreSQL table")
        return self.target.ref

    @property
    def input_columns(self) -> list[str]:
        """Columns the newest-wins step reads: the target columns, then ordering-only ones."""
        extra = [o.column for o in self.ordering if o.column not in self.columns]
        return [*self.columns, *extra]


def _format_validation_error(err: pydantic.ValidationError) -> str:
    # Only the location and the message: pydantic's default text echoes the input value.
    lines = []
    for item in err.errors(include_input=False, include_url=False):
        # A union's tag (source.postgres.snapshot) is not a key the user wrote: left out.
        parts = [str(p) for n, p in enumerate(item["loc"])
                 if not (n == 1 and item["loc"][0] == "source" and p in _SOURCE_TAGS)]
        loc = ".".join(parts) or "spec"
        msg = item["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def spec_from_mapping(data: object, origin: str = "spec") -> Spec:
    """Validate a parsed spec mapping; raise :class:`SpecError` naming every problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: the spec must be a YAML mapping of keys to values")
    try:
        return Spec.model_validate(data)
    except pydantic.ValidationError as err:
        raise SpecError(f"{origin} is invalid: {_format_validation_error(err)}") from None


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file.

    Raises:
        SpecError: the file is missing, is not YAML, or does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist; pass --spec with a YAML spec") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"spec file {path} cannot be read: {err.__class__.__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise SpecError(f"spec file {path} is not valid YAML{where}: {problem}") from None
    return spec_from_mapping(data, origin=f"spec file {path}")
