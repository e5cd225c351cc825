"""Approvals that do not live forever, and the ledger read by approval, against a real
PostgreSQL. Time moves through the injected clock (approve's and apply's), never by sleeping."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from backfill_assets.core.approve import approve_plan
from backfill_assets.core.context import utc_now
from backfill_assets.core.coverage import ApprovalExpiredError, open_approvals
from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store import control, ledger
from backfill_assets.core.store.plans import find_plan
from backfill_assets_tests.support.approvals import SCHEMA, synthetic_approvals
from backfill_assets_tests.support.flows import ALL_DAYS, DAYS8, ledger_rows, run, target_day_hashes
from backfill_assets_tests.support.specs import make_spec

WEEK = dt.timedelta(days=7)


def at(when: dt.datetime):
    """A clock stopped at ``when``."""
    return lambda: when


def approved_at(conn, factory, spec, when: dt.datetime):
    """Plan, then approve through the core with the clock at ``when``."""
    plan = make_plan(spec, ALL_DAYS, factory)
    approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "alice", clock=at(when))
    return plan


def test_apply_refuses_an_expired_approval_before_writing_anything(demo_db, factory):
    spec = make_spec()
    t0 = utc_now()
    plan = approved_at(demo_db, factory, spec, t0)
    before = target_day_hashes(demo_db)
    with pytest.raises(ApprovalExpiredError) as refused:
        run(spec, plan, factory, clock=at(t0 + WEEK))  # at its expiry time exactly, it has expired
    err = refused.value
    assert isinstance(err, ApprovalError) and err.exit_code == 6 and not err.retryable
    assert (err.approval_id, err.plan_id, err.expired_at, err.verified) == (1, plan.plan_id, t0 + WEEK, ())
    expired_at = (t0 + WEEK).astimezone(dt.timezone.utc).isoformat(timespec="seconds")
    assert str(err).startswith(f"approval 1 of plan {plan.plan_id[:16]} (by alice at ")
    assert f"expired at {expired_at} (approval_expires_after: 7d). Nothing was written." in str(err)
    assert str(err).endswith("approve the plan again to apply it.")
    assert target_day_hashes(demo_db) == before and ledger_rows(demo_db) == 0  # not even a ledger row
    # A second earlier, the same approval is applied.
    result = run(spec, plan, factory, clock=at(t0 + WEEK - dt.timedelta(seconds=1)))
    assert [p["status"] for p in result.partitions] == ["verified"] * 8


def test_the_expiry_is_the_specs_approval_expires_after(demo_db, factory):
    spec = make_spec(approval_expires_after="36h")
    t0 = utc_now()
    plan = approved_at(demo_db, factory, spec, t0)
    with pytest.raises(ApprovalExpiredError, match=r"\(approval_expires_after: 36h\)"):
        run(spec, plan, factory, clock=at(t0 + dt.timedelta(hours=36)))
    result = run(spec, plan, factory, clock=at(t0 + dt.timedelta(hours=35, minutes=59)))
    assert {p["status"] for p in result.partitions} == {"verified"}


def test_a_partly_applied_approval_past_its_expiry_does_not_resume_until_approved_again(demo_db, factory):
    """A run of the approval stops after committing its second partition; the rerun comes
    after the approval expired. It is refused like any other run, naming what the approval's
    runs already verified; a new approval (a new review) finishes the work, skipping the
    partitions the old one's runs replaced."""
    spec = make_spec()
    t0 = utc_now()
    plan = approved_at(demo_db, factory, spec, t0)

    def stop(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-02"]:
            raise KeyboardInterrupt("stopped after the commit")

    with pytest.raises(KeyboardInterrupt):
        run(spec, plan, factory, clock=at(t0 + dt.timedelta(hours=1)), checkpoint=stop)
    half_done = target_day_hashes(demo_db)
    ledger_before = ledger_rows(demo_db)
    later = t0 + dt.timedelta(days=8)
    with pytest.raises(ApprovalExpiredError) as refused:
        run(spec, plan, factory, clock=at(later))
    assert refused.value.verified == ("2024-01-01",)  # 2024-01-02 was committed, never verified
    assert ("Its runs verified 1 of its partition(s) (2024-01-01); a run under a new approval skips"
            in str(refused.value))
    assert target_day_hashes(demo_db) == half_done and ledger_rows(demo_db) == ledger_before
    (listed,) = open_approvals(demo_db, factory, spec, clock=at(later))
    assert listed.expired and listed.verified == ("2024-01-01",)
    # Approved again, on the target as it is now: the new approval's run finishes the work.
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, plan.plan_id), "bob", clock=at(later))
    result = run(spec, plan, factory, clock=at(later + dt.timedelta(minutes=5)))
    statuses = {p["partition"]: p["status"] for p in result.partitions}
    assert statuses["2024-01-01"] == statuses["2024-01-02"] == "skipped-already-verified"
    assert {statuses[d.isoformat()] for d in DAYS8[2:]} == {"verified"}
    assert target_day_hashes(demo_db) == {p["partition"]: p["stage_a"]["content_hash"]
                                          for p in plan.as_json()["partitions"]}
    # The old approval is superseded by the new one (apply takes a plan's newest), which is done.
    assert open_approvals(demo_db, factory, spec, clock=at(later + dt.timedelta(minutes=5))) == []


def test_status_lists_an_expired_approval_as_expired_with_what_its_runs_verified(demo_db, factory):
    spec = make_spec()
    t0 = utc_now()
    plan = approved_at(demo_db, factory, spec, t0)
    run(spec, plan, factory, clock=at(t0 + dt.timedelta(days=1)), only=["2024-01-01"])
    (before,) = open_approvals(demo_db, factory, spec, clock=at(t0 + WEEK - dt.timedelta(seconds=1)))
    assert not before.expired and before.state == "open" and before.problem is None
    assert {c.partition: c.state for c in before.partitions}["2024-01-01"] == "applied"
    (after,) = open_approvals(demo_db, factory, spec, clock=at(t0 + WEEK))
    assert after.expired and after.state == "expired" and after.expires_at == t0 + WEEK
    assert after.verified == ("2024-01-01",)
    assert {c.state for c in after.partitions} == {"expired"} and not any(c.covered for c in after.partitions)
    assert "apply refuses it: review the plan and approve the plan again" in after.problem
    shown = after.as_json()
    assert (shown["state"], shown["verified"], shown["expires_at"]) == ("expired", ["2024-01-01"],
                                                                        (t0 + WEEK).isoformat())


# --- the ledger, read by approval -----------------------------------------------------------

# Three runs of every approval over each of its partitions: the first two fail, the last
# verifies all but the partitions of every tenth approval.
_LEDGER = sql.SQL(
    "INSERT INTO {schema}.ledger (run_id, plan_id, approval_id, snapshot_id, target_table, partition, "
    "transform_version, status, run_started_at, finished_at) "
    "SELECT 'run-' || a.approval_id || '-' || r, a.plan_id, a.approval_id, 'synthetic', 'public.orders_daily', "
    "p.partition, 'v1', CASE WHEN r < 3 THEN 'failed' WHEN mod(a.approval_id, 10) = 0 THEN 'not-attempted' "
    "ELSE 'verified' END, now(), now() "
    "FROM {schema}.approvals AS a, generate_series(1, 3) AS r, "
    "jsonb_array_elements_text(a.partitions) AS p(partition)"
)
_ANALYZE = sql.SQL("ANALYZE {schema}.ledger, {schema}.approvals, {schema}.plans")
_EXPLAIN = sql.SQL("EXPLAIN (FORMAT JSON) ")
_DROP_INDEX = sql.SQL("DROP INDEX {index}")
_PLAN_OF = sql.SQL("SELECT plan_id FROM {schema}.approvals WHERE approval_id = %(approval_id)s")




def _nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def ledger_reads(conn: psycopg.Connection, query: sql.SQL, params: dict) -> set[str]:
    """How the plan of ``query`` reads the ledger: per node that reads it, 'index' (an index
    scan of the ledger's index by approval, or a bitmap heap scan over one), else its node
    type ('seq scan', say)."""
    (plan,) = conn.execute(_EXPLAIN + query.format(schema=sql.Identifier(SCHEMA)), params).fetchone()[0]
    found = set()
    for node in _nodes(plan["Plan"]):
        if node.get("Relation Name") != "ledger":
            continue
        used = {n.get("Index Name") for n in _nodes(node)}  # a bitmap heap scan's index is its child's
        found.add("index" if control.LEDGER_APPROVAL_INDEX in used else node["Node Type"].lower())
    return found


def test_the_queries_that_read_the_ledger_by_approval_use_its_index(conn):
    """1,200 approvals with three runs each over eight partitions (28,800 ledger rows): every
    query that reads the ledger by approval reads it through the index; without the index
    each scans the whole ledger; a schema made before the index gets it in place."""
    spec = make_spec()
    now = utc_now()
    synthetic_approvals(conn, spec.name, [now - dt.timedelta(minutes=n) for n in range(1200, 0, -1)],
                        [d.isoformat() for d in DAYS8])
    with conn.transaction():
        conn.execute(_LEDGER.format(schema=sql.Identifier(SCHEMA)))
        conn.execute(_ANALYZE.format(schema=sql.Identifier(SCHEMA)))
    plan_id = conn.execute(_PLAN_OF.format(schema=sql.Identifier(SCHEMA)), {"approval_id": 600}).fetchone()[0]
    queries = {
        "open approvals (status)": (ledger._OPEN_APPROVALS, {"spec_name": spec.name}),
        "approvals since a cursor (the sensor)": (
            ledger._APPROVALS_SINCE, {"spec_name": spec.name, "after": 1100, "limit": 100, "approved_after": None}),
        "the sensor's first tick": (
            ledger._APPROVALS_SINCE, {"spec_name": spec.name, "after": 0, "limit": 100,
                                      "approved_after": now - dt.timedelta(minutes=150)}),
        "unverified failures (apply)": (ledger._UNVERIFIED_FAILURES, {"plan_id": plan_id}),
        "verified by an approval (an expired one)": (ledger._VERIFIED_BY_APPROVAL, {"approval_id": 600}),
    }
    assert len(ledger.open_approvals(conn, SCHEMA, spec.name)) == 120  # every tenth
    assert ledger.verified_by_approval(conn, SCHEMA, 600) == []
    assert ledger.verified_by_approval(conn, SCHEMA, 601) == [d.isoformat() for d in DAYS8]
    assert [f["partition"] for f in ledger.unverified_failures(conn, SCHEMA, plan_id)] == [d.isoformat() for d in DAYS8]
    for name, (query, params) in queries.items():
        assert ledger_reads(conn, query, params) == {"index"}, name
    # The control: without the index, each reads the whole ledger.
    conn.execute(_DROP_INDEX.format(index=sql.Identifier(SCHEMA, control.LEDGER_APPROVAL_INDEX)))
    for name, (query, params) in queries.items():
        assert "seq scan" in ledger_reads(conn, query, params), name
    # A schema made by a version before the index: read-only commands work without it (and do
    # not build it); apply builds it before its first write.
    assert control.control_ready(conn, SCHEMA)
    assert "seq scan" in ledger_reads(conn, *queries["open approvals (status)"])
    control.ensure_ledger_index(conn, SCHEMA)
    for name, (query, params) in queries.items():
        assert ledger_reads(conn, query, params) == {"index"}, name


def test_the_sensor_query_reads_at_most_its_limit_and_only_approvals_after_a_time(conn):
    now = utc_now()
    times = [now - dt.timedelta(days=10)] * 3 + [now - dt.timedelta(days=1)] * 5
    synthetic_approvals(conn, "orders_daily", times, ["2024-01-01"])
    first = ledger.approvals_since(conn, SCHEMA, "orders_daily", 0, limit=3, approved_after=now - WEEK)
    assert [a["approval_id"] for a in first] == [4, 5, 6]
    assert all(a["approved_at"] == now - dt.timedelta(days=1) and not a["applied"] for a in first)
    rest = ledger.approvals_since(conn, SCHEMA, "orders_daily", 6, limit=3)
    assert [a["approval_id"] for a in rest] == [7, 8]
    assert [a["approval_id"] for a in ledger.approvals_since(conn, SCHEMA, "orders_daily", 0, limit=100)] == list(
        range(1, 9))
