"""`snapshot: exported` against a real PostgreSQL: both builds import one MVCC snapshot the
plan holds, nothing is copied, and a writer that commits while the plan runs reaches
neither build."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from backfill_assets.cli import demo
from backfill_assets.core.engines.postgres.snapshot import source_changes
from backfill_assets.core.errors import SnapshotError, SourceDataError
from backfill_assets.core.plan import make_plan, snapshot_step, stages_step
from backfill_assets.core.progress import ProgressEvent
from backfill_assets_tests.support.flows import ALL_DAYS, approved, check_against_newest_wins, run, target_hashes
from backfill_assets_tests.support.specs import make_spec

pytestmark = pytest.mark.postgres

EXPORTED = make_spec(records_can_move=False, source={"table": "public.orders_raw"})  # the default mode
COPY = make_spec(records_can_move=False)


def _copies(conn: psycopg.Connection) -> int:
    return conn.execute(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'backfill_control' AND c.relname ~ '^snap_([0-9a-f]{16}|new_)'"
    ).fetchone()[0]


def _holders(conn: psycopg.Connection) -> int:
    """Sessions of this database still in a transaction (an exported snapshot's holder)."""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%%'"
    ).fetchone()[0]


def test_the_default_mode_is_exported_and_copies_nothing():
    assert EXPORTED.source.snapshot == "exported"


def test_an_exported_plan_builds_what_a_copied_one_does(unmoved_db, factory):
    plan = make_plan(EXPORTED, ALL_DAYS, factory)
    assert plan.status == "ready" and plan.document.snapshot.mode == "exported"
    check_against_newest_wins(unmoved_db, plan, demo.source_rows(moved=False), per_day=True, days=demo.DEMO_DAYS)
    assert _copies(unmoved_db) == 0 and _holders(unmoved_db) == 0
    exported_parts = unmoved_db.execute(
        "SELECT partitions FROM backfill_control.snapshots WHERE snapshot_id = %s", (plan.document.snapshot.id,)
    ).fetchone()[0]
    copied = make_plan(COPY, ALL_DAYS, factory)
    copied_parts = unmoved_db.execute(
        "SELECT partitions FROM backfill_control.snapshots WHERE snapshot_id = %s", (copied.document.snapshot.id,)
    ).fetchone()[0]
    # The same source rows, fingerprinted in either mode: the same per-partition readings.
    assert exported_parts == copied_parts and len(exported_parts) == len(demo.DEMO_DAYS)
    assert [p.stage_a for p in plan.document.partitions] == [p.stage_a for p in copied.document.partitions]
    assert plan.document.snapshot.id != copied.document.snapshot.id  # the mode is part of the id


def test_the_same_source_gives_the_same_plan_id(unmoved_db, factory):
    first = make_plan(EXPORTED, ALL_DAYS, factory)
    again = make_plan(EXPORTED, ALL_DAYS, factory)
    assert first.plan_id == again.plan_id and first.document.snapshot.id == again.document.snapshot.id


def test_a_writer_committing_during_the_builds_reaches_neither(unmoved_db, factory, db_url):
    """Once stage A's first partition is built, another session deletes and rewrites rows of
    every day and commits. Both builds, and the source fingerprint that names the snapshot,
    still read the rows as they were when the plan began; the sensor's check then sees the
    source moved on."""
    before = make_plan(COPY, ALL_DAYS, factory)  # the same rows, copied: the expected readings
    wrote = []

    def write_once(event: ProgressEvent) -> None:
        if event.step == "stage a" and event.status == "built" and not wrote:
            with psycopg.connect(db_url.reveal(), autocommit=True) as other:
                other.execute("DELETE FROM public.orders_raw WHERE order_id % 3 = 0")
                other.execute("UPDATE public.orders_raw SET amount = amount + 1, note = 'late write'")
            wrote.append(True)

    plan = make_plan(EXPORTED, ALL_DAYS, factory, progress=write_once)
    assert wrote and plan.status == "ready"
    assert [p.stage_a for p in plan.document.partitions] == [p.stage_a for p in before.document.partitions]
    assert [p.stage_b for p in plan.document.partitions] == [p.stage_a for p in before.document.partitions]
    recorded = unmoved_db.execute(
        "SELECT partitions FROM backfill_control.snapshots WHERE snapshot_id = %s", (plan.document.snapshot.id,)
    ).fetchone()[0]
    copied = unmoved_db.execute(
        "SELECT partitions FROM backfill_control.snapshots WHERE snapshot_id = %s", (before.document.snapshot.id,)
    ).fetchone()[0]
    assert recorded == copied  # the source as it was, not as the writer left it
    with_rows = [d.isoformat() for (d,) in unmoved_db.execute(
        "SELECT DISTINCT order_date FROM public.orders_raw ORDER BY 1").fetchall()]
    assert len(with_rows) >= 5 and sorted(source_changes(unmoved_db, EXPORTED)) == with_rows


def test_an_exported_plan_applies_and_verifies(unmoved_db, factory):
    plan = approved(unmoved_db, factory, EXPORTED)
    result = run(EXPORTED, plan, factory)
    assert {p["status"] for p in result.partitions} == {"verified"}
    expected = {p.partition: p.stage_a.content_hash for p in plan.document.partitions}
    assert target_hashes(unmoved_db) == expected


def test_a_refused_source_builds_nothing_and_lets_the_snapshot_go(unmoved_db, factory):
    unmoved_db.execute(
        "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount + 1, status, note "
        "FROM public.orders_raw WHERE order_id IS NOT NULL LIMIT 1"
    )
    with pytest.raises(SourceDataError, match="tie on every ordering column"):
        make_plan(EXPORTED, ALL_DAYS, factory)
    assert _holders(unmoved_db) == 0
    assert not unmoved_db.execute("SELECT to_regclass('backfill_control.orders_daily__stage_a') IS NOT NULL").fetchone()[0]


def test_steps_run_apart_refuse_an_exported_snapshot_with_what_to_do(unmoved_db, factory):
    """An orchestrator's snapshot and stages steps run apart: the exported snapshot is gone
    by the second, so the stages step refuses it (the Dagster layer builds in one step)."""
    plan = make_plan(EXPORTED, ALL_DAYS, factory)
    with pytest.raises(SnapshotError, match="or declare `snapshot: copy` to build them in a later step"):
        stages_step(EXPORTED, plan.document.snapshot.id, factory)
    # The spec switched to a copy since: that snapshot cannot serve it either; take another.
    copy = make_spec(records_can_move=False, source={"table": "public.orders_raw", "snapshot": "copy"})
    with pytest.raises(SnapshotError, match="take a snapshot again: this one was taken before the spec declared"):
        stages_step(copy, plan.document.snapshot.id, factory)


def test_the_holder_is_gone_after_a_failed_build(unmoved_db, factory):
    """A plan that stops during the builds (a progress callback raising stands in for any
    failure) ends the exported snapshot's transaction with it, and stores no plan."""

    class Stop(Exception):
        pass

    def fail(event: ProgressEvent) -> None:
        if event.step == "stage b" and event.status == "built":
            raise Stop

    with pytest.raises(Stop):
        make_plan(EXPORTED, ALL_DAYS, factory, progress=fail)
    assert _holders(unmoved_db) == 0
    with factory.control(unmoved_db) as control:
        assert control.execute("SELECT count(*) FROM backfill_control.plans").fetchone()[0] == 0


def test_a_truncate_during_the_builds_waits_for_the_plan(unmoved_db, factory, db_url):
    """TRUNCATE is not MVCC-safe (an older snapshot would see an empty table); the holding
    transaction's lock on the source makes it wait for the plan, so it cannot reach a build."""
    outcome = []

    def truncate_once(event: ProgressEvent) -> None:
        if event.step == "stage a" and event.status == "built" and not outcome:
            with psycopg.connect(db_url.reveal(), autocommit=True) as other:
                other.execute("SET lock_timeout = '200ms'")
                try:
                    other.execute("TRUNCATE public.orders_raw")
                    outcome.append("truncated")
                except psycopg.errors.LockNotAvailable:
                    outcome.append("waited")

    plan = make_plan(EXPORTED, ALL_DAYS, factory, progress=truncate_once)
    assert outcome == ["waited"] and plan.status == "ready"
    check_against_newest_wins(unmoved_db, plan, demo.source_rows(moved=False), per_day=True, days=demo.DEMO_DAYS)


def test_a_snapshot_step_alone_is_refused_with_what_to_do(unmoved_db, factory):
    with pytest.raises(SnapshotError, match="snapshot: copy"):
        snapshot_step(EXPORTED, ALL_DAYS, factory)
    assert _copies(unmoved_db) == 0


def _writers(conn: psycopg.Connection) -> int:
    """How many transactions wrote stage A's non-empty partitions (its build records' seals)."""
    return conn.execute("SELECT count(DISTINCT writer_txid) FROM backfill_control.stage_builds "
                        "WHERE variant = 'a' AND writer_xid IS NOT NULL").fetchone()[0]


def test_partitions_built_together_or_alone_give_the_same_plan(unmoved_db, factory, monkeypatch):
    """Small partitions are built several per statement (engines.postgres.stages.build_batches);
    built one at a time they give the same readings and the same plan id, and either way
    the seals hold for approval and apply. A source without an index on the partition key is
    read by one statement per stage, whatever the batch size (each would scan it whole)."""
    from backfill_assets.core.engines.postgres import stages

    monkeypatch.setattr(stages, "BUILD_BATCH_ROWS", 0)
    unindexed = make_plan(EXPORTED, ALL_DAYS, factory)
    assert _writers(unmoved_db) == 1
    unmoved_db.execute("CREATE INDEX ON public.orders_raw (order_date)")
    alone = make_plan(EXPORTED, ALL_DAYS, factory)
    assert _writers(unmoved_db) >= 5
    monkeypatch.undo()
    together = approved(unmoved_db, factory, EXPORTED)
    assert _writers(unmoved_db) == 1 and together.plan_id == alone.plan_id == unindexed.plan_id
    result = run(EXPORTED, together, factory)
    assert {p["status"] for p in result.partitions} == {"verified"}


@pytest.mark.parametrize("spec", [EXPORTED, COPY], ids=["exported", "copy"])
def test_a_truncate_committed_while_the_snapshot_is_taken_is_seen_whole_or_not_at_all(unmoved_db, factory, db_url,
                                                                                     spec):
    """Another session has emptied the source and put one day back, uncommitted, when the
    plan starts. The plan locks the source before it takes its snapshot, so it waits for that
    commit and then sees the day that was put back: not the empty table that a snapshot taken
    before the TRUNCATE committed would see (TRUNCATE is not MVCC-safe)."""
    unmoved_db.execute("CREATE TABLE public.orders_saved AS SELECT order_date, order_id, customer_id, updated_at, "
                       "ingest_seq, amount, status, note FROM public.orders_raw")
    unmoved_db.commit()
    other = psycopg.connect(db_url.reveal())
    other.execute("TRUNCATE public.orders_raw")
    other.execute("INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
                  "status, note) SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, "
                  "note FROM public.orders_saved WHERE order_date = '2024-01-02'")
    with ThreadPoolExecutor(1) as pool:
        planned = pool.submit(make_plan, spec, ALL_DAYS, factory)
        deadline = time.monotonic() + 20
        while not unmoved_db.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'public.orders_raw'::regclass"
        ).fetchone()[0]:
            assert time.monotonic() < deadline and not planned.done(), "the plan never waited for the TRUNCATE"
            time.sleep(0.05)
        other.commit()
        other.close()
        plan = planned.result(timeout=60)
    assert plan.status == "ready", plan.problems
    rows = {p.partition: p.stage_a.row_count for p in plan.document.partitions}
    assert rows["2024-01-02"] > 0 and all(n == 0 for day, n in rows.items() if day != "2024-01-02")
