"""The core reports its progress as typed events, for a real plan and apply."""

from __future__ import annotations

import uuid

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.plan import make_plan
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.store.plans import find_plan
from backfill_assets_tests.support.flows import ALL_DAYS
from backfill_assets_tests.support.specs import make_spec


def counted(events: list[ProgressEvent], step: str) -> list[ProgressEvent]:
    return [e for e in events if e.step == step and e.counted]


def test_plan_and_apply_emit_typed_events_with_partition_done_total_and_rows(demo_db, factory):
    spec = make_spec()
    planned: list[ProgressEvent] = []
    plan = make_plan(spec, ALL_DAYS, factory, progress=planned.append)
    stored = find_plan(demo_db, spec, plan.plan_id)
    labels, n = stored.labels, len(stored.labels)
    rows = [stored.approved(label)["row_count"] for label in labels]

    firsts = list(dict.fromkeys(e.step for e in planned))
    assert firsts[:2] == ["inspect", "snapshot"] and firsts[-1] == "plan"
    assert set(firsts[2:-1]) == {"stage a", "stage b"}
    for step in ("stage a", "stage b"):
        own = counted(planned, step)
        assert (own[0].done, own[0].total, own[0].status) == (0, n, "started")
        assert [(e.partition, e.done, e.total, e.rows, e.status) for e in own[1:]] == [
            (label, i, n, r, "built") for i, (label, r) in enumerate(zip(labels, rows), 1)]
        assert own[-1].last and not any(e.last for e in own[:-1])
        assert str(own[1]) == f"{step}: 1/{n} {labels[0]}: {rows[0]} row(s)"
    assert planned[-1] == ProgressEvent("plan", f"{plan.plan_id[:16]}: ready", status="ready")

    approve_plan(demo_db, factory, spec, stored, "alice")
    applied: list[ProgressEvent] = []
    apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, progress=applied.append)
    own = counted(applied, "apply")
    assert own == applied  # apply reports only its partitions
    assert (own[0].done, own[0].total, own[0].partition) == (0, n, None)
    assert [(e.partition, e.done, e.total, e.rows, e.status) for e in own[1:]] == [
        (label, i, n, r, "verified") for i, (label, r) in enumerate(zip(labels, rows), 1)]
    assert str(own[1]).startswith(f"apply: 1/{n} {labels[0]}: verified ({rows[0]} rows, total ")
