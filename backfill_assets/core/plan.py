"""The plan: compare the two builds on every reading and record what an approver approves.

Nothing here writes to the target. The plan is stored in the control schema; its id is a
SHA-256 over the canonical JSON of everything an approver approves (core.fingerprint.identity), so the
same source, spec and partitions always give the same plan id. ``make_plan`` runs the whole
plan side (resolve, snapshot, both builds, compare); ``snapshot_step`` and ``stages_step`` are
its two halves for an orchestrator.
"""

from __future__ import annotations

from typing import Any

import psycopg

from backfill_assets.core.context import Clock, Context, build_lock, partition_locks, spec_lock, utc_now
from backfill_assets.core.diff import diff_partition, example_text
from backfill_assets.core.fingerprint.identity import PLAN_FORMAT, sha256_hex
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.db import ConnectionFactory, transient_errors
from backfill_assets.core.progress import Progress, ProgressEvent, quiet
from backfill_assets.core.resolve import resolve
from backfill_assets.core.snapshot import Snapshot, load_snapshot, recheck_immutable_source, take_snapshot
from backfill_assets.core.spec import Spec
from backfill_assets.core.stages import build_both, ensure_stage
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import (
    AddedPartition,
    PartitionEntry,
    Plan,
    PlanDocument,
    SnapshotRef,
    SourceReport,
)
from backfill_assets.core.vocabulary import PartitionRequest, partition_label


def spec_document(ctx: Context) -> dict[str, Any]:
    """The parts of a plan that come from the spec and the target's catalog.

    approve and apply recompute them from the current spec and catalog: any difference
    (another transform version, a target column added or retyped) refuses the plan.
    """
    spec = ctx.spec
    return {
        # Every column of the target, so that one added to it since the plan is drift too
        # (and whatever else names the table: an Iceberg table's catalog).
        **ctx.engine.plan_fields(ctx),
        "format": PLAN_FORMAT,
        "fingerprint_format": FINGERPRINT_FORMAT,
        "spec": spec.name,
        "target": spec.target_name,
        "source": spec.source_name,
        "partition_key": spec.partition_key,
        "business_key": list(spec.business_key),
        "ordering": [o.model_dump() for o in spec.ordering],
        "columns": [[c.name, c.type_name] for c in ctx.target_columns],
        "total": spec.total,
        "records_can_move": spec.records_can_move,
        "transform_version": spec.transform_version,
        "transform_sql_sha256": None if ctx.transform is None else sha256_hex(ctx.transform.encode("utf-8")),
    }


def assemble(ctx: Context, snapshot: Snapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
             reports: dict[str, tuple[int, int]], requested: list[str], found: list[str] | None = None) -> Plan:
    """Compare the stages on every reading and build the plan document and id; ``found``:
    problems found before, listed after the comparison's (differing keys, values a lake target
    could not hold)."""
    problems: list[str] = []
    partitions: list[PartitionEntry] = []
    for label in ctx.labels:
        fa, fb = a[label], b[label]
        diffs = fa.differences(fb)
        if diffs:
            problems.append(f"partition {label}: stages A and B differ on {', '.join(diffs)}")
        for side, fp in (("A", fa), ("B", fb)):
            if fp.null_key_count or fp.duplicate_key_count:
                problems.append(
                    f"partition {label}: stage {side} has {fp.null_key_count} NULL and "
                    f"{fp.duplicate_key_count} duplicate business key(s)"
                )
        rows_read, null_keys = reports.get(label, (0, 0))
        partitions.append(PartitionEntry(
            partition=label, match=not diffs, stage_a=fa, stage_b=fb,
            source=SourceReport(
                rows_read=rows_read, null_key_rows_dropped=null_keys,
                duplicates_collapsed=rows_read - null_keys - fa.row_count,
                snapshot_rows=snapshot.partitions[label]["row_count"],
                snapshot_hash=snapshot.partitions[label]["content_hash"],
            ),
        ))
    scope = ctx.scope
    document = PlanDocument(
        **spec_document(ctx),
        snapshot=SnapshotRef(**snapshot.as_dict()),
        requested_partitions=requested,
        added_partitions=[AddedPartition(partition=label, reasons=reasons)
                          for label, reasons in (scope.added.items() if scope else [])],
        # Partitions that moved keys link are replaced together, in one transaction.
        replace_groups=scope.groups() if scope else [[label] for label in ctx.labels],
        partitions=partitions,
        # A table that does not exist yet is created by apply: the approval covers that.
        creates_target=ctx.engine.creates_target(ctx),
    )
    return Plan.of(document, problems + list(found or []))


def make_plan(
    spec: Spec, request: PartitionRequest, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> Plan:
    """Plan a backfill: snapshot, build both stages at once, compare. Never writes to the target.

    The stages are built on two connections at the same time, under the spec lock held for
    the whole plan.

    Returns the plan, stored in the control schema, with status ``ready`` or ``refused``;
    a refused plan's differing stage partitions are deleted so nothing can apply them.

    Raises:
        SpecError, ConnectionConfigError, SourceDataError, SnapshotError,
        TransientDatabaseError, ConcurrentRunError.
    """
    if spec.on_duckdb or spec.on_spark:  # the source, the snapshot and the stages in DuckDB or Spark
        flow = _engine_flow(spec)
        return flow.make_plan(spec, request, factory, clock=clock, progress=progress)
    with factory() as conn, factory.control(conn) as control, spec_lock(control, spec):
        progress(ProgressEvent("inspect", f"{spec.source_ref} -> {spec.target_name}"))
        ctx = resolve(conn, spec, request)
        snapshot, ctx = take_snapshot(conn, ctx, clock, progress)
        a, b = build_both(ctx, snapshot, factory, clock, progress)
        return finish_plan(conn, control, ctx, snapshot, a, b, clock, progress)


def _engine_flow(spec: Spec) -> Any:
    """The module that runs a DuckDB or Spark spec's steps (imported only when used)."""
    if spec.on_spark:
        from backfill_assets.core.spark import flow
    else:
        from backfill_assets.core.duck import flow  # type: ignore[no-redef]
    return flow


def snapshot_step(
    spec: Spec, request: PartitionRequest | list[str], factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> Snapshot:
    """Step 1 on its own (for an orchestrator): inspect, check and snapshot the partitions.

    A spec with ``parallel`` snapshots at once with its other builds of other partitions
    (core.context.build_lock)."""
    if spec.on_duckdb or spec.on_spark:  # the source, the snapshot and the stages in DuckDB or Spark
        flow = _engine_flow(spec)
        return flow.snapshot_step(spec, request, factory, clock=clock, progress=progress)  # type: ignore[return-value]
    with factory() as conn, factory.control(conn) as control, build_lock(control, spec):
        ctx = resolve(conn, spec, request)
        with partition_locks(control, spec, ctx.labels):
            snapshot, _ = take_snapshot(conn, ctx, clock, progress)
            return snapshot


def stages_step(
    spec: Spec, snapshot_id: str, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> tuple[Context, Plan, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Steps 2 and 3 for an orchestrator: build both stages from a recorded snapshot, compare
    them and store the plan, as make_plan does after its snapshot.

    A spec with ``parallel`` builds at once with its other builds of other partitions
    (core.context.build_lock): each holds the partitions of its snapshot, and the stage tables
    are made ready one build at a time.

    Returns the snapshot's context, the plan, and the readings of stages A and B.
    """
    if spec.on_duckdb or spec.on_spark:  # the source, the snapshot and the stages in DuckDB or Spark
        flow = _engine_flow(spec)
        return flow.stages_step(spec, snapshot_id, factory, clock=clock, progress=progress)
    with factory() as conn, factory.control(conn) as control, build_lock(control, spec):
        snapshot, ctx = load_snapshot(conn, spec, snapshot_id)
        with partition_locks(control, spec, ctx.labels):
            if spec.parallel is not None:
                _stage_tables_ready(conn, ctx)
            a, b = build_both(ctx, snapshot, factory, clock, progress)
            return ctx, finish_plan(conn, control, ctx, snapshot, a, b, clock, progress), a, b


def _stage_tables_ready(conn: psycopg.Connection, ctx: Context) -> None:
    """Create (or recreate) both stage tables under a lock of their own, so that two builds of
    one spec starting at once do not both create them; each build then finds them ready."""
    spec = ctx.spec
    with transient_errors("making the stage tables ready"), conn.transaction():
        conn.execute(*sqlbuild.advisory_xact_lock(f"backfill_assets:stage-tables:{spec.control_schema}:{spec.name}"))
        for variant in ("a", "b"):
            ensure_stage(conn, ctx, variant)


def finish_plan(
    conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, snapshot: Snapshot,
    a: dict[str, Fingerprint], b: dict[str, Fingerprint], clock: Clock, progress: Progress,
) -> Plan:
    """Compare the builds (on ``conn``, the data), recheck an immutable source, then store the
    plan in the control store (``control``: ``conn`` itself, or a database of its own); a
    refused plan's differing stage partitions are deleted so that nothing can apply them.

    With one database, both happen in one transaction. With a control store of its own, the
    data's deletions commit first: should the plan's commit then fail, no plan names those
    stages, and the next plan builds them again."""
    spec = ctx.spec
    reports = _input_reports(conn, ctx, snapshot)
    if snapshot.mode == "immutable":
        recheck_immutable_source(conn, ctx, snapshot)
    problems = ctx.engine.plan_problems(conn, ctx) + differing_keys(conn, ctx, a, b)
    plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested, problems)
    with control.transaction(), conn.transaction():
        if control is not conn:
            if not store.control_ready(control, spec.control_schema):
                store.ensure_control_schema(control, spec.control_schema)
            store.copy_snapshot_record(conn, control, spec.control_schema, snapshot.snapshot_id)
        store.record_plan(
            control, spec.control_schema, plan_id=plan.plan_id, spec_name=spec.name,
            target_table=spec.target_name, status=plan.status,
            snapshot_id=snapshot.snapshot_id, plan=plan.as_json(), created_at=clock(),
        )
        if plan.status == "refused":
            for entry in plan.document.partitions:
                if not entry.match:
                    value = ctx.value_of(entry.partition)
                    for v in ("a", "b"):
                        conn.execute(*sqlbuild.delete_partition(ctx.stage(v), spec.partition_key, value))
    progress(ProgressEvent("plan", f"{plan.plan_id[:16]}: {plan.status}", status=plan.status))
    return plan


# How many differing keys a refused plan names per partition, and how its problem starts.
DIFFERING_KEYS = 3


def differing_keys_prefix(label: str) -> str:
    """The start of the problem that names a partition's first differing keys."""
    return f"partition {label}: first differing key(s)"


def differing_keys(conn: psycopg.Connection, ctx: Context, a: dict[str, Fingerprint],
                   b: dict[str, Fingerprint]) -> list[str]:
    """For each partition whose stages differ, a problem naming its first differing keys and
    columns (core.diff, stage A against stage B), read before the refused plan deletes them."""
    found = []
    for label in ctx.labels:
        if a[label] == b[label]:
            continue
        try:
            with conn.transaction():
                d = diff_partition(conn, ctx, ctx.stage("a"), ctx.stage("b"), label, DIFFERING_KEYS)
        except psycopg.Error as err:  # the plan is refused anyway; the keys only explain it
            found.append(f"partition {label}: the differing keys could not be read ({err.__class__.__name__})")
            continue
        found.append(f"{differing_keys_prefix(label)}, stage A against stage B: "
                     + "; ".join(example_text(e) for e in d.examples))
    return found


def _input_reports(conn: psycopg.Connection, ctx: Context, snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    query, params = sqlbuild.input_report(input_rel, ctx.spec.partition_key, ctx.spec.business_key, {"partitions": ctx.partitions})
    return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in conn.execute(query, params).fetchall()}
