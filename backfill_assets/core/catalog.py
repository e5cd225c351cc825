"""The catalog model every engine speaks: a column as a catalog describes it (PostgreSQL's type
names, whatever the engine), the server, and an inspection of a spec's source and target with
every problem found; with the rules on a partition key's and a total's types that every
engine's inspection applies, and the PostgreSQL types an engine's own types are named by
(:data:`PG_TYPES`, :func:`typed_column`, :func:`numeric_column`): each engine keeps only its
names for them (Spark's ``bigint``, DuckDB's ``BIGINT``: ``int8``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionKind, PartitionRequest, PartitionValue, parse_labels
from backfill_assets.core.windows import ColumnKind, Windowing, zone

PARTITION_KINDS: dict[str, PartitionKind] = {
    "date": "date", "int2": "integer", "int4": "integer", "int8": "integer",
    "text": "text", "varchar": "text", "bpchar": "text",
}
EXACT_NUMERIC = {"int2", "int4", "int8", "numeric"}


@dataclass(frozen=True)
class ColumnInfo:
    """A column as the catalog describes it."""

    name: str
    type_name: str  # format_type(): the exact type, with modifiers
    category: str  # pg_type.typcategory
    collatable: bool
    base_type: str  # pg_type.typname of the base type (domains resolved)


# The PostgreSQL base types another engine's types are named by, with what a catalog says of
# each: base type -> (type name, category, collatable). numeric(p,s) is numeric_column's.
PG_TYPES: dict[str, tuple[str, str, bool]] = {
    "int8": ("bigint", "N", False),
    "int4": ("integer", "N", False),
    "bool": ("boolean", "B", False),
    "float8": ("double precision", "N", False),
    "text": ("text", "S", True),
    "bytea": ("bytea", "U", False),
    "date": ("date", "D", False),
    "timestamptz": ("timestamp with time zone", "D", False),
}


def typed_column(name: str, base_type: str) -> ColumnInfo:
    """Column ``name`` of PostgreSQL base type ``base_type`` (one of :data:`PG_TYPES`)."""
    type_name, category, collatable = PG_TYPES[base_type]
    return ColumnInfo(name, type_name, category, collatable, base_type)


def numeric_column(name: str, precision: int | str, scale: int | str) -> ColumnInfo:
    """Column ``name`` of type numeric(precision,scale)."""
    return ColumnInfo(name, f"numeric({precision},{scale})", "N", False, "numeric")


def mapped_column(name: str, engine_type: str, types: Mapping[str, str], decimal: re.Pattern[str]) -> ColumnInfo | None:
    """Column ``name`` of an engine's type ``engine_type`` as the PostgreSQL type that holds the
    same values: by ``types`` (the engine's type name -> a base type of :data:`PG_TYPES`), or
    numeric(p,s) where ``decimal`` matches it with p and s as its groups; None: no counterpart."""
    if engine_type in types:
        return typed_column(name, types[engine_type])
    m = decimal.fullmatch(engine_type)
    return None if m is None else numeric_column(name, m.group(1), m.group(2))


@dataclass(frozen=True)
class ServerInfo:
    engine: str
    version: str
    version_num: int
    encoding: str


@dataclass
class Inspection:
    """What the catalog says about a spec's tables, and every problem found."""

    server: ServerInfo
    source_columns: list[ColumnInfo]
    target_columns: list[ColumnInfo]
    target_unique_keys: list[tuple[str, list[str]]]
    partition_kind: PartitionKind | None
    grain_columns: list[str]
    grain_ddl: str | None
    problems: list[str] = field(default_factory=list)
    # What the target's engine found of its table beyond the columns (a lake table: whether it
    # exists, and the schema the stage maps to; core.lake.target.LakeState), shown by
    # ``inspect`` through its ``as_dict``. None for a PostgreSQL target.
    target_table: Any = None

    def column(self, name: str) -> ColumnInfo:
        """A target column by name."""
        return next(c for c in self.target_columns if c.name == name)

    def spec_target_columns(self, spec: Spec) -> list[ColumnInfo]:
        """The spec's columns, in the spec's order, with the target's types."""
        return [self.column(c) for c in spec.columns]

    def require_plannable(self) -> PartitionKind:
        """Raise SpecError naming every problem; return the partition kind."""
        if self.problems:
            raise SpecError("; ".join(self.problems))
        assert self.partition_kind is not None
        return self.partition_kind

    def as_dict(self) -> dict[str, object]:
        return {
            "engine": self.server.engine, "version": self.server.version,
            "encoding": self.server.encoding,
            "source_columns": [[c.name, c.type_name] for c in self.source_columns],
            "target_columns": [[c.name, c.type_name] for c in self.target_columns],
            "target_unique_keys": [{"name": n, "columns": cols} for n, cols in self.target_unique_keys],
            "partition_kind": self.partition_kind, "grain_columns": self.grain_columns,
            "grain_ddl": self.grain_ddl, "problems": self.problems,
            **({} if self.target_table is None else self.target_table.as_dict()),
        }


def check_total(spec: Spec, columns: dict[str, ColumnInfo], problems: list[str]) -> None:
    """An additive total must be exact."""
    if spec.total is not None and spec.total in columns and columns[spec.total].base_type not in EXACT_NUMERIC:
        problems.append(
            f"total {spec.total} has type {columns[spec.total].type_name}; an additive total must "
            "be exact (integer or numeric)"
        )


# The base types a time window's column may have, as core.windows names what they hold.
WINDOW_COLUMN_KINDS: dict[str, ColumnKind] = {"timestamptz": "timestamptz", "timestamp": "timestamp", "date": "date"}


def windowing_of(spec: Spec, column: ColumnInfo) -> Windowing:
    """The spec's ``partition_window`` over ``column`` (the partition key, as the target has it).

    Raises:
        SpecError: the column is not a date or time stamp, or the window cannot be read from
            it (hours of a date; a zone declared for the wrong kind of column).
    """
    window = spec.partition_window
    assert window is not None
    kind = WINDOW_COLUMN_KINDS.get(column.base_type)
    if kind is None:
        raise SpecError(
            f"partition_window needs a date or time stamp partition_key; {column.name} has type {column.type_name}: "
            "window a timestamptz, timestamp or date column, or leave partition_window out to partition by its values"
        )
    assert window.every is not None  # the spec's validator derives it from a cron
    return Windowing(window.every, zone(window.time_zone), kind,
                     zone(window.column_time_zone) if window.column_time_zone else None, window.offset)


def requested_partitions(spec: Spec, inspection: Inspection, request: PartitionRequest | list[str]
                         ) -> list[PartitionValue]:
    """The partitions ``request`` names (the command line's, or the labels a plan stored), as
    the inspected partition key holds them: values, or for time windows their labels.

    Raises:
        SpecError: the inspection found problems, or the partitions are malformed.
    """
    kind = inspection.require_plannable()
    if kind == "window":  # windows are named by their labels
        windowing = windowing_of(spec, inspection.column(spec.partition_key))
        return list(windowing.request(request.text) if isinstance(request, PartitionRequest)
                    else windowing.labels(request))
    return request.resolve(kind) if isinstance(request, PartitionRequest) else parse_labels(request, kind)


def partition_kind_of(column: ColumnInfo, problems: list[str], spec: Spec | None = None) -> PartitionKind | None:
    """The kind of a partition key column (None, with a problem, when it cannot be one): with
    the ``spec`` given and declaring ``partition_window``, ``window`` where it can be windowed."""
    if spec is not None and spec.partition_window is not None:
        try:
            windowing_of(spec, column)
        except SpecError as err:
            problems.append(str(err))
            return None
        return "window"
    kind = PARTITION_KINDS.get(column.base_type)
    if kind is None:
        problems.append(
            f"partition_key {column.name} has type {column.type_name}; use a date, integer or text partition key"
        )
    return kind
