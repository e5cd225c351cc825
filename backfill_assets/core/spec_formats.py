"""The spec's sources and targets: one pydantic model per ``format``, the unions that tell them
apart, and the pieces every part of the spec shares (the strict base model, the name of an
environment variable, a lake location).

Nothing here touches a database or knows the engines: which engine reads or writes a format is
core.supports'.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backfill_assets.core.vocabulary import Identifier, TableName, TableRef, parse_table_name


def _check_env_name(value: str) -> str:
    # Never echo the value: someone may have pasted the URL itself here.
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError(
            "must be the NAME of an environment variable (like DATABASE_URL), not the URL itself"
        )
    return value


# The NAME of an environment variable (a URL is only ever named, never written in a spec).
EnvName = Annotated[str, AfterValidator(_check_env_name)]


# Every part of a spec: unknown keys are refused, and a part never changes.
STRICT = ConfigDict(extra="forbid", frozen=True)


class Strict(BaseModel):
    """The base of the parts of a spec (:data:`STRICT`)."""

    model_config = STRICT


class NamesTable:
    """What a part of a spec that names a PostgreSQL table (``table: schema.table``) says of it:
    its ``ref`` and how messages name it (mixed into the part's model)."""

    @property
    def ref(self) -> TableRef:
        return parse_table_name(self.table)  # type: ignore[attr-defined]

    @property
    def display_name(self) -> str:
        """``schema.table``."""
        return str(self.ref)


class SourceSpec(NamesTable, Strict):
    """A PostgreSQL table in the spec's database (``format`` may be left out)."""

    format: Literal["postgres"] = "postgres"
    table: TableName
    # exported: both builds read one MVCC snapshot the plan holds (core.engines.postgres.snapshot);
    # copy: the partitions copied into a sealed table; immutable: read in place, pinned by fingerprint.
    snapshot: Literal["exported", "copy", "immutable"] = "exported"
    # A column every write sets to a value above any the table holds (an ingest sequence, an
    # `updated_at` set on insert and update): the source sensor's cheap per-partition signal.
    # Its type is checked against the catalog by core.engines.postgres.watch (an integer, numeric,
    # date or timestamp).
    change_column: Identifier | None = None


class IcebergCatalogSpec(Strict):
    """A pyiceberg SQL catalog. Its URI (a PostgreSQL URL) comes only from a named variable;
    without ``uri_env`` the catalog lives in the spec's own database (``database_url_env``)."""

    type: Literal["sql"]
    uri_env: EnvName | None = None
    warehouse: Annotated[str, Field(min_length=1)]
    # The catalog name pyiceberg keys the catalog's rows by (iceberg_tables.catalog_name).
    # "default" is what pyiceberg's load_catalog() uses when given no name, so a reader with
    # the URI alone sees the tables this tool writes (see docs/lake-targets.md).
    name: Identifier = "default"


_NAMESPACE_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A lake location is a path or a file:// URI; other schemes would need credentials, which a
# spec may only name (see database_url_env), and are not supported yet.
_LOCATION = re.compile(r"(file://)?[^\x00-\x1f\x7f]+")


def check_location(fmt: str, value: str) -> str:
    """``value`` if it is a lake location (a local path or a ``file://`` URI) of ``fmt``."""
    if "://" in value and not value.startswith("file://"):
        raise ValueError(f"a {fmt} location is a local path or a file:// URI (other stores are not supported yet)")
    if not _LOCATION.fullmatch(value):
        raise ValueError(f"a {fmt} location may not contain control characters")
    return value


def _absolute(location: str) -> str:
    return str(Path(location.removeprefix("file://")).expanduser().resolve())


def _only(given: object, fmt: str, allowed: set[str], shape: str, what: str = "target") -> object:
    """Refuse, naming the shape, a target (or source) mapping with a field its format does not take."""
    if isinstance(given, dict) and set(given) - allowed - {"format"}:
        article = "an" if fmt[:1] in "aeiou" else "a"
        raise ValueError(f"{article} {fmt} {what} takes {shape}")
    return given


class PostgresTargetSpec(NamesTable, Strict):
    """A PostgreSQL table in the spec's database (``format`` may be left out)."""

    format: Literal["postgres"] = "postgres"
    table: TableName

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "postgres", {"table"}, "`table: schema.table` and no location or catalog")


class DeltaTargetSpec(Strict):
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
        return check_location("delta", value)

    @property
    def display_name(self) -> str:
        """``delta:<absolute path>``: a relative location is resolved against the current
        directory now. A plan names exactly one table: run from another directory, the same
        spec names another Delta table, and apply refuses the plan as made for a different
        target."""
        return "delta:" + _absolute(self.location)


class IcebergTargetSpec(Strict):
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


class _LocatedSource(Strict):
    """A lake source named by its local path or ``file://`` URI."""

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
        return check_location(str(info.data.get("format", "lake")), value)

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


class JdbcSourceSpec(NamesTable, Strict):
    """A PostgreSQL table read by Spark over JDBC (``engine: {type: spark}``), copied once into
    the engine's staging folder in one consistent read; ``url_env`` names the environment
    variable that holds its JDBC URL (``jdbc:postgresql://host:port/db?user=...``)."""

    format: Literal["jdbc"]
    table: TableName
    url_env: EnvName
    # A column every write changes (an ingest sequence, an updated_at), by which the source
    # sensor finds the partitions that moved, as for a PostgreSQL source.
    change_column: Identifier | None = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "jdbc", {"table", "url_env", "change_column"},
                     "`table: schema.table`, `url_env: <NAME of a variable holding the JDBC URL>` and optionally "
                     "`change_column`", "source")

    @property
    def display_name(self) -> str:
        """``jdbc:<url variable>:<schema.table>`` (never the URL: it may carry a password)."""
        return f"jdbc:{self.url_env}:{self.ref}"


class ParquetTargetSpec(Strict):
    """A folder of Parquet files, Hive-partitioned by the partition key, each partition
    replaced by an atomic directory swap (``engine: {type: spark}``; core.engines.spark.parquet)."""

    format: Literal["parquet"]
    location: str

    @pydantic.model_validator(mode="before")
    @classmethod
    def _fields(cls, given: object) -> object:
        return _only(given, "parquet", {"location"}, "`location: <path or file:// URI>` and no table or catalog")

    @pydantic.field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        return check_location("parquet", value)

    @property
    def display_name(self) -> str:
        """``parquet:<absolute path>`` (see DeltaTargetSpec.display_name)."""
        return "parquet:" + _absolute(self.location)


_SPARK_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}")


class SparkTableSpec(Strict):
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


def format_of(given: object) -> str:
    """The ``format`` of a source or target mapping (postgres when left out)."""
    if isinstance(given, dict):
        fmt = given.get("format", "postgres")
        return fmt if isinstance(fmt, str) else ""
    return getattr(given, "format", "")


# What the builds read, told apart by ``format``: a PostgreSQL table of the spec's database, a
# lake table or Parquet folder read where it lies, a PostgreSQL table over JDBC, or a table of
# Spark's catalog. Which engine reads which is core.supports'.
AnySourceSpec = Annotated[
    Annotated[SourceSpec, pydantic.Tag("postgres")]
    | Annotated[DeltaSourceSpec, pydantic.Tag("delta")]
    | Annotated[IcebergSourceSpec, pydantic.Tag("iceberg")]
    | Annotated[ParquetSourceSpec, pydantic.Tag("parquet")]
    | Annotated[JdbcSourceSpec, pydantic.Tag("jdbc")]
    | Annotated[SparkTableSpec, pydantic.Tag("spark_table")],
    pydantic.Discriminator(format_of, custom_error_type="source_format",
                           custom_error_message="source.format is postgres (the default), delta, iceberg, parquet, "
                                                "jdbc or spark_table"),
]
LakeSourceSpec = DeltaSourceSpec | IcebergSourceSpec | ParquetSourceSpec
SOURCE_TAGS = ("postgres", "delta", "iceberg", "parquet", "jdbc", "spark_table")  # AnySourceSpec's tags


# Where apply writes, told apart by ``format``. Each format's engine (what inspection, the
# stages, the plan, approval, diff and apply ask of the target) is core.targets.engine_for's;
# a new engine is a variant here, its literal there, and its module.
TargetSpec = Annotated[
    Annotated[PostgresTargetSpec, pydantic.Tag("postgres")]
    | Annotated[DeltaTargetSpec, pydantic.Tag("delta")]
    | Annotated[IcebergTargetSpec, pydantic.Tag("iceberg")]
    | Annotated[ParquetTargetSpec, pydantic.Tag("parquet")]
    | Annotated[SparkTableSpec, pydantic.Tag("spark_table")],
    pydantic.Discriminator(format_of, custom_error_type="target_format",
                           custom_error_message="target.format is postgres (the default), delta, iceberg, "
                                                "parquet or spark_table"),
]
