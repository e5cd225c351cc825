"""The PostgreSQL engine's comparison of what a replacement changes: the approved stage against the target (or stage B), key by key.

Exact: rows are compared on their canonical text forms (docs/fingerprint.md), the forms the
fingerprint hashes, so ``-0`` vs ``0``, ``1.5`` vs ``1.50`` and NULL vs the empty string are
differences, which typed equality misses (through a 64-bit digest of each row's text forms:
a changed row escapes only by a digest collision, and the fingerprint, which decides plans and
verifications, hashes the full text with SHA-256). On one server the comparison is one keyed
full join inside it (sqlbuild.partition_diff, in parallel workers where the server can), each
side read once; no partition
is loaded into Python: only the counts and up to ``limit`` example keys per partition come
back, with both sides' values, looked up by key.

Across engines (a Delta or Iceberg target), the lake partition's rows are rendered to the same
text forms from Arrow and loaded, as text, into a temporary table
(TargetEngine.compared, core.lake.target), then compared by the same SQL with the stage's text
forms, keyed by the keys' text: exact, each side read once, no per-row Python; a key the lake
holds more than once counts once, as changed.

Read-only on the tables: it runs in one REPEATABLE READ transaction (read-only unless a lake
partition is loaded), after checking that stage A still holds the plan's rows (its seal, or a
fingerprint where the seal does not hold).
"""

from __future__ import annotations

import psycopg

from backfill_assets.core.differences import DEFAULT_LIMIT, KINDS, Against, Example, PartitionDiff
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.staged import staged
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order
from backfill_assets.core.vocabulary import TableRef


def diff_partition(conn: psycopg.Connection, ctx: PostgresContext, left: TableRef, right: TableRef, label: str,
                   limit: int = DEFAULT_LIMIT, *, right_as_text: bool = False) -> PartitionDiff:
    """One partition of ``left`` (the rows a replacement writes) against ``right``, in the
    caller's transaction, which must be open (see the module docstring)."""
    spec = ctx.spec
    columns = list(spec.columns)
    counts = dict.fromkeys(KINDS, 0)
    examples = []
    order = business_key_order(ctx.target_columns, spec.business_key)
    conn.execute(sqlbuild.prefer_parallel())
    rows = conn.execute(*sqlbuild.partition_diff(
        left, right, ctx.by, order, columns, ctx.value_of(label), limit,
        right_as_text=label if right_as_text else None))
    for row, kind, n, key, a, b in rows:
        if row == "count":
            counts[kind] = int(n)
            continue
        differing = [c for i, c in enumerate(columns) if a is None or b is None or a[i] != b[i]]
        if kind != "changed":  # a whole row on one side: its values, against nothing
            differing = columns
        examples.append(Example(
            key=dict(zip(spec.business_key, key)), kind=kind, columns=differing,
            values={c: [None if a is None else a[columns.index(c)], None if b is None else b[columns.index(c)]]
                    for c in differing},
        ))
    return PartitionDiff(label, **counts, examples=examples)


def rows_per_partition(conn: psycopg.Connection, ctx: PostgresContext, rel: TableRef, labels: list[str]) -> dict[str, int]:
    """How many rows ``rel`` (a table of the data database) holds in each of ``labels`` (0 where
    none), from one statement."""
    values = {ctx.value_of(label): label for label in labels}
    found = dict.fromkeys(labels, 0)
    if labels:
        for value, n in conn.execute(*sqlbuild.partition_counts(rel, ctx.by, list(values))):
            if value in values:
                found[values[value]] = int(n)
    return found


def diff_counts(conn: psycopg.Connection, ctx: PostgresContext, left: TableRef, right: TableRef,
                labels: list[str]) -> list[PartitionDiff]:
    """The counts of :func:`diff_partition` (no examples) for each of ``labels``, two tables of
    the data database, from one keyed join over all of them, in the caller's transaction,
    which must be open."""
    spec = ctx.spec
    values = {ctx.value_of(label): label for label in labels}
    counts: dict[str, dict[str, int]] = {label: dict.fromkeys(KINDS, 0) for label in labels}
    if labels:
        conn.execute(sqlbuild.prefer_parallel())
        for value, kind, n in conn.execute(*sqlbuild.partitions_diff_counts(
                left, right, ctx.by, spec.business_key, spec.columns, list(values))):
            if value in values:
                counts[values[value]][kind] = int(n)
    return [PartitionDiff(label, **counts[label]) for label in labels]


def first_added(conn: psycopg.Connection, ctx: PostgresContext, rel: TableRef, label: str, limit: int) -> list[dict[str, str | None]]:
    """The first ``limit`` business keys of one partition of ``rel`` (each as its text forms),
    in the order :func:`diff_partition` gives its examples: the keys it would name when the
    other side holds no row of the partition (every key added)."""
    spec = ctx.spec
    order = business_key_order(ctx.target_columns, spec.business_key)
    rows = conn.execute(*sqlbuild.first_keys(rel, ctx.by, order, ctx.value_of(label), limit))
    return [dict(zip(spec.business_key, key)) for (key,) in rows]


def diff_against(conn: psycopg.Connection, ctx: PostgresContext, label: str, against: Against = "target",
                 limit: int = DEFAULT_LIMIT, *, version: str | None = None) -> PartitionDiff:
    """Stage A's partition against the target's (a PostgreSQL table, or a lake partition, at
    ``version`` if given, loaded for the caller's transaction, which must be a writable one)
    or stage B's."""
    if against == "stage_b":
        return diff_partition(conn, ctx, ctx.stage("a"), ctx.stage("b"), label, limit)
    right, as_text = staged(ctx).compared(conn, ctx, label, version)
    return diff_partition(conn, ctx, ctx.stage("a"), right, label, limit, right_as_text=as_text)
