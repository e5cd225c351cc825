"""The PostgreSQL engine's side of the plan: the stage tables made ready for parallel builds,
the builds compared and explained, and the plan stored with the data's stage partitions it
refuses removed in the same transaction."""

from __future__ import annotations

import psycopg

from backfill_assets.core.context import Clock
from backfill_assets.core.differences import example_text
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.diff import diff_partition
from backfill_assets.core.engines.postgres.snapshot import Snapshot, recheck_immutable_source
from backfill_assets.core.engines.postgres.staged import staged
from backfill_assets.core.engines.postgres.stages import ensure_stage
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.db import transient_errors
from backfill_assets.core.planning import DIFFERING_KEYS, assemble, differing_keys_prefix
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import partition_label


def stage_tables_ready(conn: psycopg.Connection, ctx: PostgresContext) -> None:
    """Create (or recreate) both stage tables under a lock of their own, so that two builds of
    one spec starting at once do not both create them; each build then finds them ready."""
    spec = ctx.spec
    with transient_errors("making the stage tables ready"), conn.transaction():
        conn.execute(*sqlbuild.advisory_xact_lock(f"backfill_assets:stage-tables:{spec.control_schema}:{spec.name}"))
        for variant in ("a", "b"):
            ensure_stage(conn, ctx, variant)


def finish_plan(
    conn: psycopg.Connection, control: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot,
    a: dict[str, Fingerprint], b: dict[str, Fingerprint], clock: Clock, progress: Progress,
) -> Plan:
    """Compare the builds (on ``conn``, the data), recheck an immutable source, then store the
    plan in the control store (``control``: ``conn`` itself, or a database of its own); a
    refused plan's differing stage partitions are deleted so that nothing can apply them.

    With one database, both happen in one transaction. With a control store of its own, the
    data's deletions commit first: should the plan's commit then fail, no plan names those
    stages, and the next plan builds them again."""
    spec = ctx.spec
    reports = snapshot.reports if snapshot.reports is not None else _input_reports(conn, ctx, snapshot)
    if snapshot.mode == "immutable":
        recheck_immutable_source(conn, ctx, snapshot)
    problems = staged(ctx).plan_problems(conn, ctx) + differing_keys(conn, ctx, a, b)
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
                        conn.execute(*sqlbuild.delete_partition(ctx.stage(v), ctx.by, value))
    progress(ProgressEvent("plan", f"{plan.plan_id[:16]}: {plan.status}", status=plan.status))
    return plan


def differing_keys(conn: psycopg.Connection, ctx: PostgresContext, a: dict[str, Fingerprint],
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
        if not d.differs:  # stage B was hashed, then built again to show the keys, and now agreed
            found.append(f"partition {label}: stage B, built again from the same snapshot to show the differing "
                         "keys, then equalled stage A: the transform gives different rows from the same data")
            continue
        found.append(f"{differing_keys_prefix(label)}, stage A against stage B: "
                     + "; ".join(example_text(e) for e in d.examples))
    return found


def _input_reports(conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    query, params = sqlbuild.input_report(input_rel, ctx.by, ctx.spec.business_key, ctx.bound())
    return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in conn.execute(query, params).fetchall()}
