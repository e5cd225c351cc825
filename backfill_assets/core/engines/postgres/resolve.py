"""Resolve a PostgreSQL spec into the :class:`Context` every later step works from: its
target's engine (chosen here, once, by ``target.format``), the catalog checked against the
spec, the partitions, and the validated transform. Read-only.
"""

from __future__ import annotations

import dataclasses

import psycopg

from backfill_assets.core.catalog import requested_partitions
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.guard.transform import GUARD, validate_transform_text
from backfill_assets.core.engines.postgres.inputs import input_reads
from backfill_assets.core.engines.postgres.staged import staged_engine
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest


def resolve(
    conn: psycopg.Connection, spec: Spec, request: PartitionRequest | list[str],
) -> PostgresContext:
    """Inspect read-only and validate everything about the spec before any write.

    ``request`` is the command line's partitions, or the labels stored in a plan.

    Raises:
        SpecError: the catalog disagrees with the spec, the partitions are malformed, or
            the transform is refused.
    """
    if spec.transform_sql is not None:
        transform = validate_transform_text(spec.transform_sql, spec.inputs)  # the parser first: no I/O
    else:
        transform = None
    target = engine_for(spec)
    engine = staged_engine(target)
    inspection = engine.inspect(conn, transform, GUARD)
    partitions = requested_partitions(spec, inspection, request)
    engine.check(conn, inspection, partitions, transform, GUARD)
    ctx = PostgresContext(spec, target, inspection, partitions, transform)
    if not spec.inputs:
        return ctx
    key = next((c for c in inspection.source_columns if c.name == spec.partition_key), None)
    return dataclasses.replace(ctx, inputs=input_reads(conn, spec, key, ctx.windowing))
