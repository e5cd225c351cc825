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

from typing import TYPE_CHECKING, Any

import psycopg

from backfill_assets.core.catalog import Inspection, ServerInfo, requested_partitions
from backfill_assets.core.context import Context
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.engine import inspect_input
from backfill_assets.core.pinned.duck_types import column_info, source_types, unsupported
from backfill_assets.core.pinned.source import LakeSource
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

def described(duck: DuckDBPyConnection, relation: Any, columns: list[str]) -> list[tuple[str, str]]:
    """(name, DuckDB type) of ``columns`` of a relation, as DuckDB binds them."""
    return [(row[0], row[1]) for row in duck.execute(statements.describe(relation, columns)).fetchall()]


def inspect(conn: psycopg.Connection | None, spec: Spec, source: LakeSource, duck: DuckDBPyConnection) -> tuple[Inspection, str | None]:
    """Inspect the lake source (its newest schema, attached on ``con`` without rows) and the
    lake target, collecting every problem; return the inspection and the validated transform.

    Raises:
        SpecError, TransformError: the source cannot be read, or the transform is refused.
    """
    import duckdb
    source.attach_schema(duck)
    types = source_types(duck)
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
        found = described(duck, relation, spec.input_columns)
    except duckdb.Error as err:
        raise SpecError(f"the input of spec {spec.name} cannot be read in DuckDB: {' '.join(str(err).split())[:300]}") from None
    inspect_input(conn, spec, inspection, found, column_info, unsupported)
    return inspection, transform


def resolve(conn: psycopg.Connection | None, spec: Spec, request: PartitionRequest | list[str], source: LakeSource,
            duck: DuckDBPyConnection) -> Context:
    """Inspect read-only and validate everything about a DuckDB spec before any write.

    Raises:
        SpecError: the source, the target or the transform disagrees with the spec, or the
            partitions are malformed.
    """
    inspection, transform = inspect(conn, spec, source, duck)
    partitions = requested_partitions(spec, inspection, request)
    engine = engine_for(spec)
    engine.check_partitions(partitions)
    return Context(spec, engine, inspection, partitions, transform)
