"""The DuckDB engine's two builds: stage A (``DISTINCT ON``) and stage B (``row_number()``), each
on its own connection of the spec's DuckDB database, each partition replaced, fingerprinted
(format 3) and sealed in one DuckDB transaction; and the plan finished from them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

import psycopg
import pyarrow as pa
from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.comparison import compare
from backfill_assets.core.context import Clock, Context
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.engines.duckdb.database import cursor
from backfill_assets.core.engines.duckdb.inspect import described
from backfill_assets.core.fingerprint import digest, rows
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.lake.parts import spans_table
from backfill_assets.core.lake.target import parts_of
from backfill_assets.core.pinned.duck_types import source_types
from backfill_assets.core.pinned.pins import (
    LakeSnapshot,
    Pin,
    keys_detail,
    record_builds_b_kept_where_it_differs,
    record_plan,
)
from backfill_assets.core.pinned.source import WINDOWS, LakeSource, spans_in
from backfill_assets.core.planning import assemble
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


def stage_name(spec: Spec, variant: str) -> str:
    """A stage's table in the spec's DuckDB database."""
    return f"{spec.name}__stage_{variant}"


def builds_table(spec: Spec) -> str:
    """The builds' records (readings and seals) in the spec's DuckDB database."""
    return f"{spec.name}__builds"


def partition_column(ctx: Context) -> str:
    """The column a partition's rows are read by in the input and the stages: the partition
    key, or for time windows the window's label (statements.WINDOW)."""
    return statements.WINDOW if ctx.windowing is not None else ctx.spec.partition_key


def stage_columns(ctx: Context) -> list[str]:
    """A stage's columns: the spec's, then for time windows the window's label."""
    return [*ctx.spec.columns, statements.WINDOW] if ctx.windowing is not None else list(ctx.spec.columns)


def attach_input(duck: DuckDBPyConnection, ctx: Context, source: LakeSource, pin: Pin, labels: Sequence[str]) -> None:
    """The pinned source's rows of the partitions ``labels`` as SOURCE_ROWS on ``duck`` (time
    windows: only the rows in them, the windows registered as WINDOWS for :func:`windowed`)."""
    parts = parts_of(ctx, labels)
    source.attach(duck, pin, ctx.spec.partition_key, parts)
    if ctx.windowing is not None:
        duck.register(WINDOWS, spans_table(spans_in(parts)))


def windowed(ctx: Context, relation: sql.Composable, columns: Sequence[str]) -> sql.Composable:
    """``relation`` (of ``columns``) with each row's window label, for time windows (as is
    otherwise): what :func:`partition_column` reads."""
    if ctx.windowing is None:
        return relation
    return statements.labelled(relation, ctx.spec.partition_key, columns)


def as_stage(ctx: Context, data: pa.Table, label: str) -> pa.Table:
    """One partition's rows read from the target (the spec's columns), as a stage holds them:
    for time windows with the window's label, so that they compare with the stage's by it."""
    data = data.select(list(ctx.spec.columns))
    if ctx.windowing is None:
        return data
    return data.append_column(statements.WINDOW, pa.array([label] * data.num_rows, pa.string()))


def fields_of(columns: Sequence[ColumnInfo]) -> list[tuple[str, str]]:
    return [(c.name, rows.kind_of(c)) for c in columns]


def _float_keys(columns: Sequence[ColumnInfo], business_key: Sequence[str]) -> list[str]:
    return [c.name for c in columns if c.name in business_key and rows.kind_of(c) == "double"]


def readings_of(duck: DuckDBPyConnection, relation: str | sql.Composable, columns: Sequence[ColumnInfo],
                partition_key: str, business_key: Sequence[str], total: str | None,
                values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of each of ``values`` of a relation (a table, or a parenthesised query) on
    ``duck``, in that order, from one grouped aggregate (format 3, equal to PostgreSQL's for the
    same rows)."""
    return [fp for fp, _ in _readings(duck, relation, columns, partition_key, business_key, total, values)]


def _readings(duck: DuckDBPyConnection, relation: str | sql.Composable, columns: Sequence[ColumnInfo],
              partition_key: str, business_key: Sequence[str], total: str | None, values: Sequence[PartitionValue],
              sealed: bool = False) -> list[tuple[Fingerprint, str]]:
    """:func:`readings_of`, each with its seal (:func:`seals_hold`) from the same pass when
    ``sealed`` ("0" without)."""
    query = digest.partition_digest_sql(relation, fields_of(columns), business_key, partition_key, total,
                                        _float_keys(columns, business_key), sealed=sealed)
    found = {partition_label(r[0]): r for r in duck.execute(query, {"partitions": list(values)}).fetchall()}
    out = []
    for value in values:
        row = found.get(partition_label(value))
        if row is None:
            out.append((empty(columns, total), "0"))
            continue
        seal = str(row[-1]) if sealed else "0"
        _, count, null_keys, duplicates, *sums, total_value = row[:-1] if sealed else row
        n = int(count)
        out.append((Fingerprint(n, int(null_keys), int(duplicates), None if total is None else rows.total_text(total_value),
                                rows.content_hash(columns, n, [int(s or 0) for s in sums])), seal))
    return out


def _ensure_stage(duck: DuckDBPyConnection, ctx: Context, variant: str, types: list[tuple[str, str]]) -> str:
    """The stage table with the input's DuckDB types (and a time window's label), (re)created
    when its columns differ."""
    stage = stage_name(ctx.spec, variant)
    wanted = [(n, t) for n, t in types if n in ctx.spec.columns]
    wanted.sort(key=lambda c: ctx.spec.columns.index(c[0]))
    if ctx.windowing is not None:
        wanted.append((statements.WINDOW, "VARCHAR"))
    if [tuple(r) for r in duck.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall()] != wanted:
        duck.execute(statements.create_stage(stage, wanted))
    return stage


def build_stage(db: DuckDBPyConnection, ctx: Context, snapshot: LakeSnapshot, source: LakeSource, variant: Literal["a", "b"],
                progress: Progress, *, keep: bool = True,
                values: Sequence[PartitionValue] | None = None) -> dict[str, Fingerprint]:
    """Build the partitions ``values`` (default: the context's) of one stage on a connection of
    its own, reading the pinned source on its own; the partitions are replaced and
    fingerprinted in one transaction. Not ``keep``: the stage's partitions are emptied and the
    rows are hashed as they are built, not written (stage B while it equals stage A)."""
    spec = ctx.spec
    values = list(ctx.partitions if values is None else values)
    labels = [partition_label(v) for v in values]
    key, columns = partition_column(ctx), stage_columns(ctx)
    out: dict[str, Fingerprint] = {}
    step, total = f"stage {variant}", len(values)
    with contextlib.closing(cursor(db)) as duck:
        attach_input(duck, ctx, source, snapshot.pin, labels)
        names = [name for name, _ in source_types(duck)]
        relation = statements.input_relation(names, spec.input_columns, ctx.transform)
        stage = _ensure_stage(duck, ctx, variant, described(duck, relation, spec.input_columns))
        relation = windowed(ctx, relation, spec.input_columns)
        select = statements.build_select(variant, relation, columns, key, spec.business_key,
                                         spec.ordering, moving=spec.records_can_move)
        progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
        # Every partition in one transaction and three statements: DuckDB parallelises each one
        # over all the partitions, where a statement per partition would pay its start each time.
        params = {"partitions": values}
        duck.begin()
        try:
            duck.execute(statements.delete_partitions(stage, key), params)
            if keep:
                duck.execute(statements.build_stage(variant, stage, relation, columns, key,
                                                    spec.business_key, spec.ordering, moving=spec.records_can_move),
                             params)
            found = _readings(duck, stage if keep else sql.SQL("({})").format(select), ctx.target_columns,
                              key, spec.business_key, spec.total, values, sealed=keep)
            record_seals(duck, ctx, variant, snapshot.snapshot_id, dict(zip(labels, found)) if keep else {}, labels)
            duck.commit()
        except BaseException:
            duck.rollback()
            raise
        for n, (label, (fp, _)) in enumerate(zip(labels, found), 1):
            out[label] = fp
            progress(ProgressEvent(step, f"{fp.row_count} row(s)", partition=label, done=n, total=total,
                                   rows=fp.row_count, status="built"))
    return out


def _seals_now(duck: DuckDBPyConnection, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> dict[str, tuple[int, str]]:
    spec = ctx.spec
    query = statements.seals(stage_name(spec, variant), partition_column(ctx), fields_of(ctx.target_columns))
    found = duck.execute(query, {"partitions": list(values)}).fetchall()
    return {partition_label(value): (int(n), str(seal)) for value, n, seal in found}


def record_seals(duck: DuckDBPyConnection, ctx: Context, variant: str, snapshot_id: str,
                 built: dict[str, tuple[Fingerprint, str]], labels: Sequence[str]) -> None:
    """Record, in the build's transaction, each partition's readings and seal (:func:`seals_hold`);
    the records of ``labels`` not in ``built`` (not kept) are removed."""
    table = builds_table(ctx.spec)
    duck.execute(statements.delete_builds(table), {"variant": variant, "labels": list(labels)})
    for label, (fp, seal) in built.items():
        duck.execute(statements.insert_build(table), {
            "variant": variant, "partition": label, "snapshot_id": snapshot_id,
            "readings": json.dumps(fp.as_dict(), sort_keys=True), "row_count": fp.row_count, "seal": seal,
        })


def seals_hold(duck: DuckDBPyConnection, ctx: Context, variant: str, expected: dict[str, Reading]) -> list[str]:
    """The partitions of ``expected`` (label -> readings) whose stage no longer carries them
    without being fingerprinted again: those whose build recorded exactly those readings
    and whose rows still give the build's seal (row count and the exact sum of DuckDB's 64-bit
    hash of every row) are unchanged; every other one is fingerprinted in full and compared.

    DuckDB keeps no row versions, so this seal is a hash, not PostgreSQL's writing
    transaction: a 64-bit sum that an accidental change leaves equal with probability about
    2^-64, not one that withstands a forged change. What apply copies into the target is
    fingerprinted in full (SHA-256) before the commit whatever the seal says."""
    spec = ctx.spec
    labels = list(expected)
    sealed = bool(duck.execute(statements.TABLE_COLUMNS, {"table": builds_table(spec)}).fetchall())
    recorded = {row[0]: (json.loads(row[1]), int(row[2]), str(row[3])) for row in duck.execute(
        statements.builds_of(builds_table(spec)), {"variant": variant, "labels": labels}).fetchall()} if sealed else {}
    now = _seals_now(duck, ctx, variant, [ctx.value_of(label) for label in labels])
    doubtful = [label for label in labels
                if label not in recorded or recorded[label][0] != expected[label]
                or now.get(label, (0, "0")) != recorded[label][1:]]
    if not doubtful:
        return []
    found = readings_of(duck, stage_name(spec, variant), ctx.target_columns, partition_column(ctx), spec.business_key,
                        spec.total, [ctx.value_of(label) for label in doubtful])
    return [label for label, fp in zip(doubtful, found) if fp.as_dict() != expected[label]]


def build_both(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, source: LakeSource, db: DuckDBPyConnection,
               clock: Clock, progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B, one after the other, each on its own DuckDB connection (DuckDB
    spreads each over its threads; two at once would share one memory_limit, which a
    partition's build can fill alone), and record each build in the control store."""
    with contextlib.closing(cursor(db)) as duck:  # once, before the two builds record in it
        duck.execute(statements.create_builds(builds_table(ctx.spec)))
    a = build_stage(db, ctx, snapshot, source, "a", progress)
    b = build_stage(db, ctx, snapshot, source, "b", progress, keep=False)
    # Stage B is kept only where it differs from stage A, built again from the same pin, which
    # the builds leave readable.
    record_builds_b_kept_where_it_differs(
        control, ctx, snapshot.snapshot_id, a, b, clock,
        lambda values: build_stage(db, ctx, snapshot, source, "b", progress, values=values))
    return a, b


def unholdable(duck: DuckDBPyConnection, ctx: Context) -> list[str]:
    """Stage A's dates and time stamps a lake column cannot hold (infinite, or outside the
    years 1 to 9999), per partition and column."""
    spec = ctx.spec
    checked = [c.name for c in ctx.target_columns if c.base_type in ("date", "timestamptz")]
    if not checked:
        return []
    query = statements.unholdable(stage_name(spec, "a"), partition_column(ctx), checked)
    found = duck.execute(query, {"partitions": list(ctx.partitions)}).fetchall()
    return [
        f"partition {partition_label(row[0])}: column {name} has {n} value(s) a {spec.target.format} column cannot hold "
        "(an infinite date or time stamp, or a year outside 1 to 9999); fix them in the source or transform"
        for row in found for name, n in zip(checked, row[1:]) if n
    ]


def differing_keys(duck: DuckDBPyConnection, ctx: Context, a: dict[str, Fingerprint], b: dict[str, Fingerprint]) -> list[str]:
    spec = ctx.spec
    out = []
    query = compare.differing_keys(stage_name(spec, "a"), stage_name(spec, "b"), partition_column(ctx),
                                      spec.business_key, fields_of(ctx.target_columns))
    for value, label in zip(ctx.partitions, ctx.labels):
        if a[label] == b[label]:
            continue
        keys = duck.execute(query, {"partition": value}).fetchall()
        out.append(f"partition {label}: first differing key(s), stage A against stage B: "
                   + keys_detail(spec.business_key, keys) if keys else
                   f"partition {label}: stage B, built again from the same pin to show its keys, then equalled "
                   "stage A: the transform gives different rows from the same data")
    return out


def finish_plan(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, db: DuckDBPyConnection, reports: dict[str, tuple[int, int]],
                a: dict[str, Fingerprint], b: dict[str, Fingerprint], clock: Clock, progress: Progress) -> Plan:
    """Compare the stages, store the plan; a refused plan's differing stage partitions are
    deleted so that nothing can apply them."""
    spec = ctx.spec
    with contextlib.closing(cursor(db)) as duck:
        problems = unholdable(duck, ctx) + differing_keys(duck, ctx, a, b)
        plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested, problems)  # type: ignore[arg-type]
        if plan.status == "refused":
            for entry in plan.document.partitions:
                if not entry.match:
                    for v in ("a", "b"):
                        duck.execute(statements.delete_partition(stage_name(spec, v), partition_column(ctx)),
                                    {"partition": ctx.value_of(entry.partition)})
    return record_plan(control, spec, plan, snapshot.snapshot_id, clock, progress)
