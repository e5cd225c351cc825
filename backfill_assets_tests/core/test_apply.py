"""Approval and the verified replace against a real PostgreSQL."""

from __future__ import annotations

import datetime as dt
import re

import psycopg
import pytest

from backfill_assets.cli import demo
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import (
    ApprovalError,
    ApprovalHaltedError,
    ApprovalOutdatedError,
    ConcurrentRunError,
    SourceDataError,
    SpecError,
    TransientDatabaseError,
    VerificationError,
)
from backfill_assets.core.pg.db import connection_factory
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store import ledger
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.flows import (
    ALL_DAYS,
    DAYS8,
    all_target_rows,
    approved,
    expected_hash,
    ledger_rows,
    newest_wins,
    run,
    target_day_hashes,
)
from backfill_assets_tests.support.specs import make_spec


def test_apply_makes_the_target_equal_to_an_independent_newest_wins(demo_db, factory):
    demo_db.execute(
        "INSERT INTO public.orders_daily (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "VALUES ('2024-01-20', 1, 1, '2024-01-20', 1, 1.00, 'outside', 'not in the plan')"
    )
    outside = all_target_rows(demo_db, dt.date(2024, 1, 20))
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    result = run(spec, plan, factory)
    assert [p["status"] for p in result.partitions] == ["verified"] * 8
    expected = newest_wins(demo.source_rows(), per_day=False)
    hashes = target_day_hashes(demo_db)
    for day in DAYS8:
        assert hashes[day.isoformat()] == expected_hash(demo_db, expected.get(day, []))
    # The empty day emptied its target partition; the unapproved day was not touched.
    assert demo_db.execute("SELECT count(*) FROM public.orders_daily WHERE order_date = '2024-01-05'").fetchone()[0] == 0
    assert all_target_rows(demo_db, dt.date(2024, 1, 20)) == outside
    # Moved records end in exactly one partition: their new one.
    for order_id, old, new in demo.MOVES:
        days = demo_db.execute("SELECT order_date FROM public.orders_daily WHERE order_id = %s", (order_id,)).fetchall()
        assert days == [(new,)]


def test_apply_twice_gives_byte_identical_partitions_and_a_ledger_row_per_partition_per_run(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    first = run(spec, plan, factory)
    rows_after_first = all_target_rows(demo_db)
    second = run(spec, plan, factory)
    assert {p["status"] for p in second.partitions} == {"skipped-already-verified"}
    assert all_target_rows(demo_db) == rows_after_first
    # The target was damaged since the approval: it is not what was approved against, so it is
    # refused until someone approves again; then a rerun rewrites it back to the same bytes.
    demo_db.execute("UPDATE public.orders_daily SET note = 'damaged' WHERE order_date = '2024-01-02'")
    with pytest.raises(ApprovalOutdatedError, match="2024-01-02: target changed since approval 1.*changed outside"):
        run(spec, plan, factory)
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, plan.plan_id), "alice")
    third = run(spec, plan, factory)
    statuses = {p["partition"]: p["status"] for p in third.partitions}
    assert statuses["2024-01-02"] == "verified" and statuses["2024-01-01"] == "skipped-already-verified"
    assert all_target_rows(demo_db) == rows_after_first
    for result in (first, second, third):
        rows = ledger.ledger_run(demo_db, "backfill_control", result.run_id)
        assert [r[0] for r in rows] == [d.isoformat() for d in DAYS8]
        assert all(r[4] for r in rows) and all(r[5] is None for r in rows)


def test_unapproved_plan_is_refused_and_nothing_is_written(demo_db, factory):
    spec = make_spec()
    before = target_day_hashes(demo_db)
    plan = make_plan(spec, ALL_DAYS, factory)
    with pytest.raises(ApprovalError, match="has not been approved"):
        run(spec, plan, factory)
    # An approval of another plan does not approve this one.
    approved(demo_db, factory, spec, PartitionRequest("2024-01-01"))
    with pytest.raises(ApprovalError, match="has not been approved"):
        run(spec, plan, factory)
    assert target_day_hashes(demo_db) == before


def test_changed_stage_after_approval_is_refused_with_nothing_written(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    before = target_day_hashes(demo_db)
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'tampered' WHERE order_date = '2024-01-06'")
    with pytest.raises(ApprovalError, match=r"stage .* no longer has the planned fingerprint in partition\(s\) 2024-01-06"):
        run(spec, plan, factory)
    assert target_day_hashes(demo_db) == before


def test_stage_checks_read_the_seal_and_hash_only_partitions_whose_rows_were_rewritten(demo_db, factory, monkeypatch):
    from backfill_assets.core.engines.postgres import context as context_module
    from backfill_assets.core.engines.postgres.review import check_data_unchanged, check_spec_unchanged

    spec = make_spec()
    plan = make_plan(spec, ALL_DAYS, factory)
    stored = find_plan(demo_db, spec, plan.plan_id)
    hashed: list[object] = []
    real = context_module.PostgresContext.readings

    def counting(self, conn, rel, partition):
        if rel == self.stage("a"):  # the checks read the target too: what an approval records
            hashed.append(partition)
        return real(self, conn, rel, partition)

    monkeypatch.setattr(context_module.PostgresContext, "readings", counting)
    ctx = check_spec_unchanged(demo_db, spec, stored)
    demo_db.execute(b"VACUUM FREEZE backfill_control.orders_daily__stage_a")  # not a change
    check_data_unchanged(demo_db, ctx, stored)
    assert hashed == []  # every partition still sealed by its build
    # Rewritten with the same values: the seal breaks, the hash still matches.
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = note WHERE order_date = '2024-01-02'")
    check_data_unchanged(demo_db, ctx, stored)
    assert hashed == [dt.date(2024, 1, 2)]
    # A re-plan rebuilds every partition with the same rows: sealed again by the new builds.
    hashed.clear()
    assert make_plan(spec, ALL_DAYS, factory).plan_id == plan.plan_id
    hashed.clear()
    check_data_unchanged(demo_db, ctx, stored)
    assert hashed == []
    demo_db.execute("DELETE FROM backfill_control.orders_daily__stage_a WHERE order_date = '2024-01-04' "
                    "AND order_id = (SELECT min(order_id) FROM backfill_control.orders_daily__stage_a "
                    "WHERE order_date = '2024-01-04')")
    with pytest.raises(ApprovalError, match=r"in partition\(s\) 2024-01-04; plan again"):
        check_data_unchanged(demo_db, ctx, stored)


@pytest.mark.parametrize("change", [
    "UPDATE backfill_control.stage_builds SET writer_txid = writer_txid - 2147483648 "
    "WHERE variant = 'a' AND partition = '2024-01-02'",  # built 2^31 transactions ago
    "UPDATE backfill_control.stage_builds SET writer_txid = NULL "
    "WHERE variant = 'a' AND partition = '2024-01-02'",  # recorded by an older version
])
def test_a_stage_seal_past_the_horizon_or_of_unknown_age_is_not_trusted(demo_db, factory, monkeypatch, change):
    from backfill_assets.core.engines.postgres import context as context_module
    from backfill_assets.core.engines.postgres.review import check_data_unchanged, check_spec_unchanged

    spec = make_spec()
    plan = make_plan(spec, ALL_DAYS, factory)
    stored = find_plan(demo_db, spec, plan.plan_id)
    # Each build records its transaction's 64-bit id: the same transaction as its rows' xmin
    # (stage A's: stage B, equal to it, was hashed and not written).
    seals = demo_db.execute("SELECT writer_xid::bigint, writer_txid FROM backfill_control.stage_builds "
                            "WHERE writer_xid IS NOT NULL").fetchall()
    assert len(seals) == 7 and all(txid % 2**32 == xid for xid, txid in seals)
    ctx = check_spec_unchanged(demo_db, spec, stored)
    hashed: list[object] = []
    real = context_module.PostgresContext.readings

    def counting(self, conn, rel, partition):
        if rel == ctx.stage("a"):
            hashed.append(partition)
        return real(self, conn, rel, partition)

    monkeypatch.setattr(context_module.PostgresContext, "readings", counting)
    check_data_unchanged(demo_db, ctx, stored)
    assert hashed == []  # every seal holds
    demo_db.execute(change)
    check_data_unchanged(demo_db, ctx, stored)
    assert hashed == [dt.date(2024, 1, 2)]  # that seal is not trusted: hashed in full


def test_changed_immutable_source_is_refused_with_nothing_written(unmoved_db, factory):
    spec = make_spec(source={"table": "public.orders_raw", "snapshot": "immutable"}, records_can_move=False)
    plan = approved(unmoved_db, factory, spec)
    before = target_day_hashes(unmoved_db)
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-04'")
    with pytest.raises(ApprovalError, match=r"the source no longer has the planned fingerprint in partition\(s\) 2024-01-04"):
        run(spec, plan, factory)
    assert target_day_hashes(unmoved_db) == before


def test_spec_changed_since_the_plan_is_refused(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    with pytest.raises(ApprovalError, match="transform_version differ"):
        run(make_spec(transform_version="v2"), plan, factory)
    demo_db.execute("ALTER TABLE public.orders_daily ALTER COLUMN note TYPE varchar(200)")
    with pytest.raises(ApprovalError, match="columns differ"):
        run(spec, plan, factory)


def test_a_held_conflicting_lock_ends_in_a_lock_timeout_with_nothing_changed(demo_db, db_url):
    spec = make_spec(lock_timeout_ms=300)
    factory = connection_factory(db_url, spec.limits)
    plan = approved(demo_db, factory, spec)
    before = target_day_hashes(demo_db)
    with psycopg.connect(db_url.reveal()) as writer:  # a transaction left open by another writer
        writer.execute("UPDATE public.orders_daily SET note = note WHERE order_date = '2024-01-20'")
        started = dt.datetime.now()
        with pytest.raises(TransientDatabaseError, match="replacing partition.s. 2024-01-01 of public.orders_daily.*lock timeout") as err:
            run(spec, plan, factory)
        assert (dt.datetime.now() - started).total_seconds() < 10
        assert err.value.retryable
        writer.rollback()
    assert target_day_hashes(demo_db) == before
    (latest,) = [r for r in ledger.ledger_status(demo_db, spec) if r["partition"] == "2024-01-01"]
    assert latest["status"] == "failed" and "lock timeout" in latest["error"]


def test_verification_failure_rolls_back_and_stops_before_the_next_partition(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    before = target_day_hashes(demo_db)
    # A trigger that alters what is written into one day: the in-transaction check sees it.
    demo_db.execute(
        "CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN NEW.amount := NEW.amount + 0.01; END IF; "
        "RETURN NEW; END $$"
    )
    demo_db.execute("CREATE TRIGGER skew BEFORE INSERT ON public.orders_daily FOR EACH ROW EXECUTE FUNCTION public.skew()")
    with pytest.raises(VerificationError) as err:
        run(spec, plan, factory)
    assert err.value.partition == "2024-01-02" and err.value.step == "verification before commit"
    after = target_day_hashes(demo_db)
    assert after["2024-01-01"] != before["2024-01-01"]  # verified before the failure: stays
    assert {k: after[k] for k in list(after)[1:]} == {k: before[k] for k in list(before)[1:]}
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(demo_db, spec)}
    assert states["2024-01-01"] == "verified" and states["2024-01-02"] == "failed"
    assert {states[d.isoformat()] for d in DAYS8[2:]} == {"not-attempted"}


def test_rerun_after_an_interruption_converges_to_an_uninterrupted_run(demo_db, factory, db_url, conn):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)

    def crash(step: str, labels: list[str]) -> None:
        if step == "inserted" and labels == ["2024-01-03", "2024-01-04"]:
            raise KeyboardInterrupt  # the process dies mid-transaction

    with pytest.raises(KeyboardInterrupt):
        run(spec, plan, factory, checkpoint=crash)
    rerun = run(spec, plan, factory)
    statuses = {p["partition"]: p["status"] for p in rerun.partitions}
    assert statuses["2024-01-01"] == "skipped-already-verified" and statuses["2024-01-03"] == "verified"
    interrupted = rows_after = all_target_rows(demo_db)
    # An uninterrupted run in a fresh copy of the data ends in the same rows.
    demo.load(demo_db)
    demo_db.execute("DROP SCHEMA backfill_control CASCADE")
    plan2 = approved(demo_db, factory, spec)
    run(spec, plan2, factory)
    assert plan2.plan_id == plan.plan_id and all_target_rows(demo_db) == interrupted == rows_after


def test_a_second_apply_of_the_same_plan_at_once_is_refused(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    inner = []

    def nested(step: str, labels: list[str]) -> None:
        if step == "locked" and not inner:
            with pytest.raises(ConcurrentRunError, match="already running"):
                run(spec, plan, factory)
            inner.append(True)

    run(spec, plan, factory, checkpoint=nested)
    assert inner == [True]


def test_approval_refuses_unknown_refused_and_outdated_plans(unmoved_db, factory):
    conn = unmoved_db
    spec = make_spec(records_can_move=False)
    with pytest.raises(ApprovalError, match="no plans exist"):
        find_plan(conn, spec, "0123456789abcdef")
    plan = make_plan(spec, ALL_DAYS, factory)
    with pytest.raises(ApprovalError, match="there is no plan"):
        find_plan(conn, spec, "0123456789abcdef")
    with pytest.raises(ApprovalError, match="at least 8 hex digits"):
        find_plan(conn, spec, "abc")
    assert find_plan(conn, spec, plan.plan_id[:10]).plan_id == plan.plan_id
    with pytest.raises(ApprovalError, match="belongs to spec orders_daily, not other"):
        find_plan(conn, make_spec(name="other", records_can_move=False), plan.plan_id)
    # A stage changed after the plan: the approval is refused.
    conn.execute("DELETE FROM backfill_control.orders_daily__stage_a WHERE order_date = '2024-01-02'")
    with pytest.raises(ApprovalError, match="2024-01-02"):
        approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "alice")
    # A refused plan cannot be approved.
    conn.execute("CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
                 "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$")
    bad_spec = make_spec(
        records_can_move=False, trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}],
        transform_sql=("SELECT order_date, order_id, customer_id + jitter() AS customer_id, updated_at, ingest_seq, "
                       "amount, status, note FROM source"))
    bad = make_plan(bad_spec, PartitionRequest("2024-01-01"), factory)
    with pytest.raises(ApprovalError, match="was refused"):
        approve_plan(conn, factory, bad_spec, find_plan(conn, bad_spec, bad.plan_id), "alice")
    with pytest.raises(ApprovalError, match="approver's name"):
        approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), " ")
    assert conn.execute("SELECT count(*) FROM backfill_control.approvals").fetchone()[0] == 0


def test_approval_records_who_and_when_for_exactly_the_plan(unmoved_db, factory):
    spec = make_spec(records_can_move=False)
    plan = make_plan(spec, PartitionRequest("2024-01-02,2024-01-04"), factory)
    at = dt.datetime(2026, 11, 29, 9, 0, tzinfo=dt.timezone.utc)
    approval_id = approve_plan(unmoved_db, factory, spec, find_plan(unmoved_db, spec, plan.plan_id), "bob",
                               clock=lambda: at)
    row = unmoved_db.execute(
        "SELECT approval_id, plan_id, approved_by, approved_at, partitions FROM backfill_control.approvals"
    ).fetchone()
    assert row == (approval_id, plan.plan_id, "bob", at, ["2024-01-02", "2024-01-04"])


def test_records_can_move_needs_a_copied_snapshot_and_no_transform():
    with pytest.raises(SpecError, match="records_can_move needs `snapshot: copy`"):
        make_spec(source={"table": "public.orders_raw", "snapshot": "immutable"})
    with pytest.raises(SpecError, match="cannot be combined with transform_sql"):
        make_spec(transform_sql="SELECT order_date FROM source")


def test_a_moved_key_whose_new_partition_is_unknown_stops_the_plan(demo_db, factory):
    order_id = dt.date(2024, 1, 2).toordinal() * 1000 + 7
    demo_db.execute(
        "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "VALUES (NULL, %s, 1, '2030-01-01', 999999, 1.00, 'lost', 'no day')", (order_id,)
    )
    with pytest.raises(SourceDataError) as err:
        make_plan(make_spec(), ALL_DAYS, factory)
    assert f"(order_id={order_id})" in str(err.value) and "cannot be identified" in str(err.value)
    assert demo_db.execute("SELECT to_regnamespace('backfill_control')").fetchone()[0] is None


# --- an approval covers the target it was given against (issue 10, part 2) ----------------

V1 = make_spec(records_can_move=False)
V2 = make_spec(records_can_move=False, transform_version="v2", transform_sql=(
    "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, upper(status) AS status, note "
    "FROM source"))




def test_an_old_approval_of_a_plan_made_again_cannot_roll_back_a_newer_backfill(unmoved_db, factory):
    v1 = approved(unmoved_db, factory, V1)
    run(V1, v1, factory)
    v1_hashes = target_day_hashes(unmoved_db, demo.DEMO_DAYS)
    v2 = approved(unmoved_db, factory, V2)
    v2_run = run(V2, v2, factory)
    v2_hashes = target_day_hashes(unmoved_db, demo.DEMO_DAYS)
    assert v2_hashes != v1_hashes
    # Months later the v1 spec is planned again: the same plan id, still approved (approval 1).
    again = make_plan(V1, ALL_DAYS, factory)
    assert again.plan_id == v1.plan_id
    rows_before = ledger_rows(unmoved_db)
    with pytest.raises(ApprovalOutdatedError) as err:
        run(V1, again, factory)
    assert err.value.exit_code == 6 and err.value.approval_id == 1
    assert sorted(err.value.reasons) == [d.isoformat() for d in demo.DEMO_DAYS if v1_hashes[d.isoformat()] != v2_hashes[d.isoformat()]]
    reason = next(iter(err.value.reasons.values()))
    assert "target changed since approval 1: it now has" in reason
    assert f"a later run {v2_run.run_id} of plan {v2.plan_id[:16]} verified it at" in reason
    # Nothing written, not even a ledger row.
    assert target_day_hashes(unmoved_db, demo.DEMO_DAYS) == v2_hashes and ledger_rows(unmoved_db) == rows_before
    # Someone who sees the target as it is now approves v1 again: then it applies.
    approve_plan(unmoved_db, factory, V1, find_plan(unmoved_db, V1, again.plan_id), "bob")
    assert {p["status"] for p in run(V1, again, factory).partitions} >= {"verified"}
    assert target_day_hashes(unmoved_db, demo.DEMO_DAYS) == v1_hashes


def test_a_target_changed_outside_the_tool_since_the_approval_is_refused_before_any_write(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    demo_db.execute("UPDATE public.orders_daily SET note = 'hand fix' WHERE order_date = '2024-01-06'")
    before = target_day_hashes(demo_db)
    with pytest.raises(ApprovalOutdatedError) as err:
        run(spec, plan, factory)
    assert list(err.value.reasons) == ["2024-01-06"]
    assert re.search(r"target changed since approval 1: it now has \d+ rows, total [\d.]+, hash [0-9a-f]{16}, "
                     r"approved against \d+ rows, total [\d.]+, hash [0-9a-f]{16}; changed outside backfill_assets",
                     err.value.reasons["2024-01-06"])
    # Refused before the first write: 2024-01-01, first in order, was not replaced either.
    assert target_day_hashes(demo_db) == before and ledger_rows(demo_db) == 0
    # A change in a partition this run does not choose does not stop the others.
    result = run(spec, plan, factory, only=["2024-01-01"])
    assert [(p["partition"], p["status"]) for p in result.partitions] == [("2024-01-01", "verified")]


def test_a_change_that_slips_in_before_the_lock_is_refused_under_it(demo_db, factory, db_url):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    before = target_day_hashes(demo_db)

    def slip_in(step: str, labels: list[str]) -> None:
        if step == "verified" and labels == ["2024-01-01"]:  # after apply's first check of every partition
            with psycopg.connect(db_url.reveal(), autocommit=True) as writer:
                writer.execute("UPDATE public.orders_daily SET amount = amount + 1 WHERE order_date = '2024-01-02'")

    with pytest.raises(ApprovalOutdatedError) as err:
        run(spec, plan, factory, checkpoint=slip_in)
    assert list(err.value.reasons) == ["2024-01-02"] and "changed outside backfill_assets" in err.value.reasons["2024-01-02"]
    after = target_day_hashes(demo_db)
    assert after["2024-01-01"] == plan.as_json()["partitions"][0]["stage_a"]["content_hash"]
    assert after["2024-01-02"] not in (before["2024-01-02"], plan.as_json()["partitions"][1]["stage_a"]["content_hash"])
    assert {k: after[k] for k in list(after)[2:]} == {k: before[k] for k in list(before)[2:]}
    states = {r["partition"]: (r["status"], r["error"]) for r in ledger.ledger_status(demo_db, spec)}
    assert states["2024-01-01"][0] == "verified"
    assert states["2024-01-02"][0] == "failed" and "no longer covers" in states["2024-01-02"][1]
    assert {states[d.isoformat()][0] for d in DAYS8[2:]} == {"not-attempted"}


@pytest.mark.parametrize(("crash", "left"), [
    (KeyboardInterrupt, "started"),  # the process dies right after the commit
    (psycopg.OperationalError, "failed"),  # the post-commit check loses its connection
])
def test_a_run_stopped_after_its_commit_resumes_under_the_same_approval(demo_db, factory, crash, left):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)

    def stop(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-02"]:
            raise crash("stopped after the commit")

    with pytest.raises(crash):
        run(spec, plan, factory, checkpoint=stop)
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(demo_db, spec)}
    assert states["2024-01-02"] == left
    # 2024-01-02 now carries the approved rows, not the ones approved against: this approval's
    # own run put them there, so the rerun takes it as done and carries on.
    rerun = run(spec, plan, factory)
    statuses = {p["partition"]: p["status"] for p in rerun.partitions}
    assert statuses["2024-01-01"] == statuses["2024-01-02"] == "skipped-already-verified"
    assert {statuses[d.isoformat()] for d in DAYS8[2:]} == {"verified"}
    assert target_day_hashes(demo_db) == {p["partition"]: p["stage_a"]["content_hash"] for p in plan.as_json()["partitions"]}


def test_a_rerun_after_success_skips_every_partition_and_closes_the_approval(demo_db, factory):
    from backfill_assets.core.coverage import open_approvals

    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    first = run(spec, plan, factory, only=["2024-01-01", "2024-01-02"])
    (still_open,) = open_approvals(demo_db, factory, spec)
    states = {c.partition: c.state for c in still_open.partitions}
    assert states["2024-01-01"] == states["2024-01-02"] == "applied" and states["2024-01-06"] == "unchanged"
    second = run(spec, plan, factory)
    third = run(spec, plan, factory)
    assert [p["status"] for p in first.partitions] == ["verified"] * 2
    assert {p["partition"]: p["status"] for p in second.partitions}["2024-01-01"] == "skipped-already-verified"
    assert {p["status"] for p in third.partitions} == {"skipped-already-verified"}
    assert open_approvals(demo_db, factory, spec) == []


def test_a_target_put_back_after_a_later_backfill_is_not_the_one_approved_against(unmoved_db, factory):
    day = "2024-01-02"
    v1 = approved(unmoved_db, factory, V1, PartitionRequest(day))  # approved against the stale rows
    stale = all_target_rows(unmoved_db, dt.date(2024, 1, 2))
    v2 = approved(unmoved_db, factory, V2, PartitionRequest(day))
    v2_run = run(V2, v2, factory)
    # Someone puts the stale rows back by hand: the same readings approval 1 recorded.
    unmoved_db.execute("DELETE FROM public.orders_daily WHERE order_date = %s", (day,))
    with unmoved_db.cursor() as cur:
        cur.executemany("INSERT INTO public.orders_daily (order_date, order_id, customer_id, updated_at, ingest_seq, "
                        "amount, status, note) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", stale)
    assert all_target_rows(unmoved_db, dt.date(2024, 1, 2)) == stale
    with pytest.raises(ApprovalOutdatedError) as err:
        run(V1, make_plan(V1, PartitionRequest(day), factory), factory)
    assert (f"target replaced since approval 1: a later run {v2_run.run_id} of plan {v2.plan_id[:16]} (approval 2)"
            in err.value.reasons[day])
    assert all_target_rows(unmoved_db, dt.date(2024, 1, 2)) == stale
    assert v1.plan_id == make_plan(V1, PartitionRequest(day), factory).plan_id


def test_an_approval_recorded_without_the_target_readings_must_be_given_again(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    demo_db.execute("UPDATE backfill_control.approvals SET target_readings = NULL")  # as an older version left it
    before = target_day_hashes(demo_db)
    with pytest.raises(ApprovalOutdatedError, match="recorded by an older version without the target's readings.*"
                                                   "approve the plan again"):
        run(spec, plan, factory)
    assert target_day_hashes(demo_db) == before and ledger_rows(demo_db) == 0
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, plan.plan_id), "alice")
    assert {p["status"] for p in run(spec, plan, factory).partitions} == {"verified"}


def test_an_approval_records_every_partitions_target_readings_as_approved_against(demo_db, factory):
    from backfill_assets.core.approve import record_approval

    spec = make_spec()
    plan = make_plan(spec, ALL_DAYS, factory)
    before = target_day_hashes(demo_db)
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, plan.plan_id), "alice")
    (recorded,) = demo_db.execute("SELECT target_readings FROM backfill_control.approvals").fetchone()
    assert sorted(recorded) == [d.isoformat() for d in DAYS8]
    assert {k: v["content_hash"] for k, v in recorded.items()} == before
    assert set(recorded["2024-01-01"]) == set(plan.as_json()["partitions"][0]["stage_a"])
    with pytest.raises(ApprovalError, match=r"the target was not read in partition\(s\) 2024-01-08"):
        record_approval(demo_db, spec, find_plan(demo_db, spec, plan.plan_id), "alice",
                        target={k: v for k, v in recorded.items() if k != "2024-01-08"})


def test_a_stored_plan_edited_after_it_was_made_is_refused_and_status_still_lists_the_others(
        unmoved_db, factory):
    from backfill_assets.core.coverage import open_approvals

    spec = make_spec(records_can_move=False)
    plan = make_plan(spec, PartitionRequest("2024-01-01..2024-01-02"), factory)
    approve_plan(unmoved_db, factory, spec, find_plan(unmoved_db, spec, plan.plan_id), "alice")
    other = make_plan(spec, PartitionRequest("2024-01-03"), factory)
    approve_plan(unmoved_db, factory, spec, find_plan(unmoved_db, spec, other.plan_id), "bob")
    # Someone edits the stored plan: its readings no longer hash to its id.
    unmoved_db.execute(
        "UPDATE backfill_control.plans SET plan = jsonb_set(plan, '{partitions,0,stage_a,row_count}', '0') "
        "WHERE plan_id = %s", (plan.plan_id,))
    with pytest.raises(ApprovalError, match=f"plan {plan.plan_id[:16]} does not hash to its id"):
        find_plan(unmoved_db, spec, plan.plan_id)
    with pytest.raises(ApprovalError, match="does not hash to its id"):
        apply_plan(spec, plan.plan_id, factory, run_id="edited")
    listed = {a.approval.plan_id: a for a in open_approvals(unmoved_db, factory, spec)}
    assert "does not hash to its id" in listed[plan.plan_id].problem
    assert listed[other.plan_id].problem is None
    assert [c.state for c in listed[other.plan_id].partitions] == ["unchanged"]


def test_after_a_failed_partition_a_run_of_the_same_approval_only_goes_on_by_retrying_it(unmoved_db, factory):
    """Apply stops at its first failure, across runs too (the command line as a multi-run
    Dagster backfill): a later run that leaves the failed partition out is refused before it
    writes; one that retries it goes on."""
    spec = make_spec(records_can_move=False)
    plan = approved(unmoved_db, factory, spec)
    unmoved_db.execute(
        "CREATE FUNCTION public.refuse_day() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN RAISE EXCEPTION 'the target refused the row'; END IF; "
        "RETURN NEW; END $$")
    unmoved_db.execute("CREATE TRIGGER refuse_day BEFORE INSERT ON public.orders_daily "
                       "FOR EACH ROW EXECUTE FUNCTION public.refuse_day()")
    with pytest.raises(psycopg.errors.RaiseException):
        run(spec, plan, factory, only=["2024-01-01", "2024-01-02"])
    before = target_day_hashes(unmoved_db)
    with pytest.raises(ApprovalHaltedError, match="2024-01-02") as refused:
        run(spec, plan, factory, only=["2024-01-03"])
    assert "the target refused the row" in str(refused.value)
    assert target_day_hashes(unmoved_db) == before  # nothing written
    unmoved_db.execute("DROP TRIGGER refuse_day ON public.orders_daily")
    result = run(spec, plan, factory, only=["2024-01-02", "2024-01-03"])  # retries the failed one
    assert [p["status"] for p in result.partitions] == ["verified", "verified"]
    assert [p["status"] for p in run(spec, plan, factory, only=["2024-01-04"]).partitions] == ["verified"]
