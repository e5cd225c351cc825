"""Step 1 on DuckDB: inspect the lake source and the lake target read-only, and resolve a
spec into the :class:`~backfill_assets.core.context.Context` the other steps work from.

DuckDB describes the source (its newest version's schema) and the input (through the guarded
transform); each column is named by the PostgreSQL type that holds the same values
(``BIGINT`` is ``bigint``, ``DECIMAL(12,2)`` is ``numeric(12,2)``, ``TIMESTAMP WITH TIME ZONE``
is ``timestamp with time zone``), so that the plan, the lake target's schema and the
fingerprint (core.fingerprint.rows: its preamble names engine-neutral types) are the ones a
PostgreSQL spec gives for the same rows. A type without such a counterpart is refused, naming
the cast that makes it one.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from backfill_assets.core.catalog import ColumnInfo, Inspection, ServerInfo
from backfill_assets.core.context import Context
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.engine import lake_engine_for
from backfill_assets.core.lake.sources import LakeSource
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest, parse_labels

# DuckDB type -> (PostgreSQL type name, category, collatable, base type).
_TYPES = {
    "BIGINT": ("bigint", "N", False, "int8"),
    "INTEGER": ("integer", "N", False, "int4"),
    "BOOLEAN": ("boolean", "B", False, "bool"),
    "DOUBLE": ("double precision", "N", False, "float8"),
    "VARCHAR": ("text", "S", True, "text"),
    "BLOB": ("bytea", "U", False, "bytea"),
    "DATE": ("date", "D", False, "date"),
    "TIMESTAMP WITH TIME ZONE": ("timestamp with time zone", "D", False, "timestamptz"),
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
    if duck_type in _TYPES:
        return ColumnInfo(name, *_TYPES[duck_type])
    m = _DECIMAL.fullmatch(duck_type)
    if m is not None:
        return ColumnInfo(name, f"numeric({m.group(1)},{m.group(2)})", "N", False, "numeric")
    return None


def unsupported(name: str, duck_type: str) -> str:
    """The problem of a column without a counterpart, and the cast that gives it one."""
    cast = _CASTS.get(duck_type)
    instead = (f"cast it in transform_sql (CAST({name} AS {cast}))" if cast else
               "select it as a supported type in transform_sql (integers, DECIMAL(p,s), DOUBLE, BOOLEAN, VARCHAR, "
               "BLOB, DATE, TIMESTAMP WITH TIME ZONE)")
    return f"column {name} has DuckDB type {duck_type}, which has no exact counterpart in the fingerprint and the lake target; {instead}"


def described(con: Any, relation: Any, columns: list[str]) -> list[tuple[str, str]]:
    """(name, DuckDB type) of ``columns`` of a relation, as DuckDB binds them."""
    return [(row[0], row[1]) for row in con.execute(statements.describe(relation, columns)).fetchall()]


def source_types(con: Any) -> list[tuple[str, str]]:
    """(name, DuckDB type) of every column of the attached source rows."""
    rows = con.execute(statements.DESCRIBE_SOURCE).fetchall()
    return [(row[0], row[1]) for row in rows]


def inspect(conn: psycopg.Connection | None, spec: Spec, source: LakeSource, con: Any) -> tuple[Inspection, str | None]:
    """Inspect the lake source (its newest schema, attached on ``con`` without rows) and the
    lake target, collecting every problem; return the inspection and the validated transform.

    Raises:
        SpecError, TransformError: the source cannot be read, or the transform is refused.
    """
    import duckdb
    source.attach_schema(con)
    types = source_types(con)
    source_columns = [c for c in (column_info(n, t) for n, t in types) if c is not None]
    inspection = Inspection(ServerInfo("duckdb", duckdb.__version__, 0, "UTF8"), source_columns, [], [], None, [], None)
    problems = inspection.problems
    names = {n for n, _ in types}
    transform = None
    if spec.transform_sql is not None:
        from backfill_assets.core.engines.duckdb.guard import check_duck_transform
        transform = check_duck_transform(spec.transform_sql, types)
    else:
        missing = [c for c in spec.input_columns if c not in names]
        if missing:
            problems.append(f"source {spec.source_name} has no column(s) {', '.join(missing)}; check columns and "
                            "ordering against the source")
            return inspection, transform
    relation = statements.input_relation([n for n, _ in types], spec.input_columns, transform)
    try:
        found = described(con, relation, spec.input_columns)
    except duckdb.Error as err:
        raise SpecError(f"the input of spec {spec.name} cannot be read in DuckDB: {' '.join(str(err).split())[:300]}") from None
    by_name: dict[str, ColumnInfo] = {}
    for name, duck_type in found:
        info = column_info(name, duck_type)
        if info is None:
            problems.append(unsupported(name, duck_type))
        else:
            by_name[name] = info
    if problems:
        return inspection, transform
    lake_engine_for(spec).inspect_table(conn, inspection, by_name)  # type: ignore[arg-type]
    return inspection, transform


def resolve(conn: psycopg.Connection | None, spec: Spec, request: PartitionRequest | list[str], source: LakeSource,
            con: Any) -> Context:
    """Inspect read-only and validate everything about a DuckDB spec before any write.

    Raises:
        SpecError: the source, the target or the transform disagrees with the spec, or the
            partitions are malformed.
    """
    inspection, transform = inspect(conn, spec, source, con)
    kind = inspection.require_plannable()
    partitions = request.resolve(kind) if isinstance(request, PartitionRequest) else parse_labels(request, kind)
    engine = engine_for(spec)
    engine.check_partitions(partitions)
    return Context(spec, engine, inspection, partitions, transform)
