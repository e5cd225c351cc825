"""Contention and drift: other writers, other backfills, readers during an apply, a statement
past its timeout, and everything that can change between plan and apply."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import ApprovalError, ApprovalOutdatedError, SpecError, TransientDatabaseError
from backfill_assets.core.pg.db import connection_factory
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.flows import ALL_DAYS, DAYS8, all_target_rows, target_hashes
from backfill_assets_tests.support.specs import make_spec

DAY = "2024-01-02"


def approved(conn, factory, spec, request=ALL_DAYS):
    plan = make_plan(spec, request, factory)
    approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "tester")
    return plan


def day_count(conn, day: str = DAY) -> int:
    return conn.execute("SELECT count(*) FROM public.orders_daily WHERE order_date = %s", (day,)).fetchone()[0]


def wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_two_plans_over_one_partition_at_once_serialize_and_the_second_is_refused_under_the_lock(
        unmoved_db, db_url):
    plain = make_spec(records_can_move=False, lock_timeout_ms=30_000)
    factory = connection_factory(db_url, plain.limits)  # the second apply waits up to 30 s
    upper = make_spec(name="orders_upper", records_can_move=False, lock_timeout_ms=30_000, transform_version="upper",
                      transform_sql="SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
                                    "upper(status) AS status, note FROM source")
    request = PartitionRequest(DAY)
    first, second = approved(unmoved_db, factory, plain, request), approved(unmoved_db, factory, upper, request)
    results: dict[str, object] = {}

    def run_second() -> None:
        try:
            results["second"] = apply_plan(upper, second.plan_id, factory, run_id="second")
        except ApprovalOutdatedError as err:
            results["second"] = err

    thread = threading.Thread(target=run_second)

    def hold(step: str, labels: list[str]) -> None:
        if step == "locked":  # the first apply holds the partition; the second must wait for it
            thread.start()
            with psycopg.connect(db_url.reveal(), autocommit=True) as watcher:
                wait_until(lambda: watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'").fetchone()[0] > 0)

    apply_plan(plain, first.plan_id, factory, run_id="first", checkpoint=hold)
    thread.join(timeout=60)
    # The second passed its first check while the first held the partition, waited for the
    # lock, then saw the first one's rows: not the target it was approved against. Refused
    # under the lock, naming the run that changed it; the first one's partition stays whole.
    refused = results["second"]
    assert isinstance(refused, ApprovalOutdatedError), refused
    assert list(refused.reasons) == [DAY] and "a later run first of plan" in refused.reasons[DAY]
    assert target_hashes(unmoved_db, [DAYS8[1]])[DAY] == first.as_json()["partitions"][0]["stage_a"]["content_hash"]
    second_ledger = unmoved_db.execute("SELECT status FROM backfill_control.ledger WHERE run_id = 'second'").fetchall()
    assert second_ledger == [("failed",)]  # it got as far as the lock: refused there, not before
    rows = all_target_rows(unmoved_db)
    assert len(rows) == len({r[1] for r in rows}) and day_count(unmoved_db) == 24


def test_readers_see_the_old_or_the_new_partition_never_a_partial_one(demo_db, factory, db_url):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    old_count, new_count = day_count(demo_db), plan.as_json()["partitions"][1]["stage_a"]["row_count"]
    old_hash = target_hashes(demo_db, [DAYS8[1]])[DAY]
    seen: dict[str, tuple[int, str]] = {}
    counts: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        with psycopg.connect(db_url.reveal(), autocommit=True) as conn:
            while not stop.is_set():
                counts.append(day_count(conn))

    reader_thread = threading.Thread(target=reader)
    reader_thread.start()
    with psycopg.connect(db_url.reveal(), autocommit=True) as observer:
        def look(step: str, labels: list[str]) -> None:
            if DAY in labels:
                seen[step] = (day_count(observer), target_hashes(observer, [DAYS8[1]])[DAY])

        apply_plan(spec, plan.plan_id, factory, run_id="mvcc", checkpoint=look)
    stop.set()
    reader_thread.join(timeout=30)
    for step in ("locked", "deleted", "inserted", "before-commit"):
        assert seen[step] == (old_count, old_hash), step  # the open transaction is invisible
    assert seen["committed"][0] == new_count and seen["committed"][1] != old_hash
    assert counts and set(counts) <= {old_count, new_count}  # never 0, never partial
    assert old_count != new_count


def test_a_statement_past_statement_timeout_is_cancelled_and_rolled_back(demo_db, db_url):
    spec = make_spec(statement_timeout_ms=300)
    factory = connection_factory(db_url, spec.limits)
    plan = approved(demo_db, factory, spec)
    before = target_hashes(demo_db, DAYS8)
    demo_db.execute("CREATE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "PERFORM pg_sleep(2); RETURN NULL; END $$")
    demo_db.execute("CREATE TRIGGER slow AFTER INSERT ON public.orders_daily FOR EACH STATEMENT "
                    "EXECUTE FUNCTION public.slow()")
    started = time.monotonic()
    with pytest.raises(TransientDatabaseError, match="QueryCanceled.*statement timeout"):
        apply_plan(spec, plan.plan_id, factory, run_id="slow")
    assert time.monotonic() - started < 10
    assert target_hashes(demo_db, DAYS8) == before


def test_an_approved_plan_for_another_snapshot_is_refused(unmoved_db, factory):
    spec = make_spec(records_can_move=False)
    old_plan = approved(unmoved_db, factory, spec)
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-03'")
    new_plan = make_plan(spec, ALL_DAYS, factory)  # a new snapshot; its stages replace the old ones
    assert new_plan.as_json()["snapshot"]["id"] != old_plan.as_json()["snapshot"]["id"]
    before = target_hashes(unmoved_db, DAYS8)
    with pytest.raises(ApprovalError, match="2024-01-03"):
        apply_plan(spec, old_plan.plan_id, factory, run_id="stale")
    assert target_hashes(unmoved_db, DAYS8) == before


def test_a_target_that_gained_or_lost_a_column_is_refused(demo_db, factory):
    spec = make_spec()
    plan = approved(demo_db, factory, spec)
    before = target_hashes(demo_db, DAYS8)
    demo_db.execute("ALTER TABLE public.orders_daily ADD COLUMN channel text")
    with pytest.raises(ApprovalError, match="target_table_columns differ"):
        apply_plan(spec, plan.plan_id, factory, run_id="gained")
    demo_db.execute("ALTER TABLE public.orders_daily DROP COLUMN channel")
    assert target_hashes(demo_db, DAYS8) == before
    demo_db.execute("ALTER TABLE public.orders_daily DROP COLUMN note")
    with pytest.raises(SpecError, match="has no column.s. note"):
        apply_plan(spec, plan.plan_id, factory, run_id="lost")
    # Refused before the first write: the ledger has no row at all.
    assert demo_db.execute("SELECT count(*) FROM backfill_control.ledger").fetchone()[0] == 0
