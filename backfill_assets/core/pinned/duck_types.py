"""DuckDB's types as the PostgreSQL types that hold the same values, wherever DuckDB reads a
lake (the DuckDB engine's inspection, the sensor's question about a lake source): ``BIGINT``
is ``bigint``, ``DECIMAL(12,2)`` is ``numeric(12,2)``, ``TIMESTAMP WITH TIME ZONE`` is
``timestamp with time zone``; a type without such a counterpart is refused, naming the cast
that makes it one."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo, mapped_column
from backfill_assets.core.pinned.source import SOURCE_ROWS

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

# The columns of the pinned source rows, as DuckDB binds them.
DESCRIBE_SOURCE = sql.SQL("DESCRIBE {}").format(sql.Identifier(SOURCE_ROWS)).as_string(None)

# DuckDB type -> the PostgreSQL base type that holds the same values (core.catalog.PG_TYPES).
_TYPES = {
    "BIGINT": "int8", "INTEGER": "int4", "BOOLEAN": "bool", "DOUBLE": "float8", "VARCHAR": "text", "BLOB": "bytea",
    "DATE": "date", "TIMESTAMP WITH TIME ZONE": "timestamptz",
}
_DECIMAL = re.compile(r"DECIMAL\((\d+),(\d+)\)")
_CASTS = {
    "TINYINT": "INTEGER", "SMALLINT": "INTEGER", "UTINYINT": "INTEGER", "USMALLINT": "INTEGER",
    "UINTEGER": "BIGINT", "FLOAT": "DOUBLE", "TIMESTAMP": "TIMESTAMP WITH TIME ZONE (at a stated zone)",
    "TIMESTAMP_S": "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_MS": "TIMESTAMP WITH TIME ZONE",
    "TIMESTAMP_NS": "TIMESTAMP WITH TIME ZONE (microseconds)", "UUID": "VARCHAR", "HUGEINT": "DECIMAL(38,0)",
    "UBIGINT": "DECIMAL(20,0)",
}


def column_info(name: str, duck_type: str) -> ColumnInfo | None:
    """The column as the PostgreSQL type that holds the same values, or None."""
    return mapped_column(name, duck_type, _TYPES, _DECIMAL)


def unsupported(name: str, duck_type: str) -> str:
    """The problem of a column without a counterpart, and the cast that gives it one."""
    cast = _CASTS.get(duck_type)
    instead = (f"cast it in transform_sql (CAST({name} AS {cast}))" if cast else
               "select it as a supported type in transform_sql (integers, DECIMAL(p,s), DOUBLE, BOOLEAN, VARCHAR, "
               "BLOB, DATE, TIMESTAMP WITH TIME ZONE)")
    return f"column {name} has DuckDB type {duck_type}, which has no exact counterpart in the fingerprint and the lake target; {instead}"


def source_types(duck: DuckDBPyConnection) -> list[tuple[str, str]]:
    """(name, DuckDB type) of every column of the attached source rows."""
    rows = duck.execute(DESCRIBE_SOURCE).fetchall()
    return [(row[0], row[1]) for row in rows]
