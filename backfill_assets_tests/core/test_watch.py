"""The source sensor's gates against a real PostgreSQL: an unchanged tick reads no row of the
source, and each kind of write is found by the gate meant to find it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from backfill_assets.core.engines.postgres.watch import TableReading, WatchState, compare_tables, watch_tick
from backfill_assets.core.errors import SpecError
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.plan import snapshot_step
from backfill_assets.core.vocabulary import PartitionRequest, TableRef
from backfill_assets_tests.support.source_writes import INDEX, NEXT_SEQ, settle, source_reads, write
from backfill_assets_tests.support.specs import DEMO_SPEC, make_spec

SRC = TableRef("public", "orders_raw")
WEEK = PartitionRequest("2024-01-01..2024-01-07")
WATCHED = [f"2024-01-0{d}" for d in range(1, 9)]  # the week, and the day a moved order adds
WATCHING = make_spec(source={**DEMO_SPEC["source"], "change_column": "ingest_seq"})


# --- helpers -----------------------------------------------------------------------------





def tick(factory, spec, before: WatchState | None, conn: psycopg.Connection, **kwargs: Any):
    with factory() as c:
        result = watch_tick(c, spec, before, **kwargs)
    settle(conn)
    return result




@pytest.fixture
def source_db(conn, factory):
    """The demo data, loaded on a connection of its own that has exited, so its inserts are
    counted before the first tick. ``conn`` itself never touches the source: it only reads
    the statistics (a live connection publishes its own counters late)."""
    from backfill_assets.cli import demo

    with factory() as loader:
        demo.load(loader)
    settle(conn)
    return conn


@pytest.fixture
def watched(source_db, factory):
    """The demo week snapshotted (2024-01-08 joins by a moved order), an index for gate 2, and
    a first tick that checked every partition in full."""
    write(factory, source_db, INDEX)
    snapshot_step(WATCHING, WEEK, factory)
    first = tick(factory, WATCHING, None, source_db)
    assert first.mode == "full" and first.changed == {} and first.fingerprinted == WATCHED
    assert sorted(first.state.partitions) == WATCHED and first.pending == ()
    return first.state




# --- gate 1 alone ------------------------------------------------------------------------

def test_an_unchanged_tick_reads_no_row_of_the_source(watched, source_db, factory):
    before = source_reads(source_db)
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.signalled, result.fingerprinted, result.changed) == ("quiet", 0, [], {})
    assert source_reads(source_db) == before
    assert result.state == watched
    # The control: a tick that does read the source moves these counters.
    write(factory, source_db, "UPDATE public.orders_raw SET note = 'x', ingest_seq = " + NEXT_SEQ
          + " WHERE order_id = 738886001 AND status = 'placed'")
    moved = source_reads(source_db)
    tick(factory, WATCHING, result.state, source_db)
    assert source_reads(source_db) != moved


def test_without_a_change_column_an_unchanged_tick_reads_nothing_either(source_db, factory):
    spec = make_spec()
    snapshot_step(spec, WEEK, factory)
    state = tick(factory, spec, None, source_db).state
    before = source_reads(source_db)
    result = tick(factory, spec, state, source_db)
    assert (result.mode, result.fingerprinted) == ("quiet", []) and source_reads(source_db) == before


# --- each kind of write ------------------------------------------------------------------

def test_an_insert_is_flagged_by_the_partitions_newest_change_value(watched, source_db, factory):
    write(factory, source_db, "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, "
          "ingest_seq, amount, status, note) SELECT '2024-01-03', 1, 1, '2024-01-03 09:00+00', "
          + NEXT_SEQ + ", 1.00, 'placed', 'late'")
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.flagged, result.fingerprinted) == ("newer", ["2024-01-03"], ["2024-01-03"])
    assert list(result.changed) == ["2024-01-03"] and result.signalled == len(WATCHED)
    again = tick(factory, WATCHING, result.state, source_db)  # reported once, not again
    assert (again.mode, again.changed) == ("quiet", {})


def test_an_insert_that_commits_after_a_newer_one_is_flagged(watched, source_db, factory):
    # A sequence value (or a timestamp) is taken when the row is written, not when it
    # commits: the slow writer's row is older than the newest value the sensor has seen.
    insert = ("INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, "
              "amount, status, note) SELECT '2024-01-03', %(id)s, 1, '2024-01-03 09:00+00', "
              "(SELECT max(ingest_seq) FROM public.orders_raw) + %(ahead)s, 1.00, 'placed', 'late'")
    with factory() as slow:
        with slow.transaction():
            slow.execute(insert.encode(), {"id": 1, "ahead": 1})
            with factory() as fast:  # commits first, with the newer value
                fast.execute(insert.encode(), {"id": 2, "ahead": 2})
            settle(source_db, keep=slow.info.backend_pid)
            with factory() as c:
                seen = watch_tick(c, WATCHING, watched)
            assert seen.flagged == ["2024-01-03"]  # the newer row
            settle(source_db, keep=slow.info.backend_pid)
        # The slow row commits now; the partition's newest value does not move.
    settle(source_db)
    result = tick(factory, WATCHING, seen.state, source_db)
    assert (result.flagged, list(result.changed)) == (["2024-01-03"], ["2024-01-03"])


def test_a_source_with_an_inheritance_child_is_fingerprinted_every_tick(watched, source_db, factory):
    # A read of the source includes the child's rows; the child's writes are counted on it.
    write(factory, source_db, "CREATE TABLE public.orders_raw_more () INHERITS (public.orders_raw)")
    result = tick(factory, WATCHING, watched, source_db)
    assert result.mode == "full" and "inheritance children" in result.reason
    write(factory, source_db, "INSERT INTO public.orders_raw_more (order_date, order_id, customer_id, updated_at, "
          "ingest_seq, amount, status, note) VALUES ('2024-01-03', 3, 1, '2024-01-03 09:00+00', 1, 1.00, 'placed', 'x')")
    again = tick(factory, WATCHING, result.state, source_db)
    assert again.mode == "full" and list(again.changed) == ["2024-01-03"]


def test_an_update_that_moves_the_change_column_is_flagged(watched, source_db, factory):
    write(factory, source_db, "UPDATE public.orders_raw SET amount = amount + 1, ingest_seq = " + NEXT_SEQ
          + " WHERE order_id = 738887002 AND status = 'placed'")  # a row of 2024-01-02
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.flagged, list(result.changed)) == ("counted", ["2024-01-02"], ["2024-01-02"])


def test_an_update_that_leaves_the_change_column_is_missed_by_gate_2_as_documented(watched, source_db, factory):
    write(factory, source_db, "UPDATE public.orders_raw SET amount = amount + 1 "
          "WHERE order_id = 738887002 AND status = 'placed'")
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.flagged, result.changed) == ("counted", [], {})
    # Without a change column the same write is found, by fingerprinting every partition.
    plain = make_spec()
    result = tick(factory, plain, None, source_db)  # a baseline taken after the write...
    write(factory, source_db, "UPDATE public.orders_raw SET amount = amount + 1 "
          "WHERE order_id = 738887002 AND status = 'placed'")
    found = tick(factory, plain, result.state, source_db)
    assert found.mode == "counted" and found.fingerprinted == WATCHED and "2024-01-02" in found.changed
    assert any("no source.change_column" in n for n in found.notes)


def test_a_delete_is_flagged_by_the_partitions_row_count(watched, source_db, factory):
    write(factory, source_db, "DELETE FROM public.orders_raw WHERE order_id = 738891003 AND status = 'shipped'")
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.flagged, list(result.changed)) == ("counted", ["2024-01-06"], ["2024-01-06"])


def test_a_truncate_sends_every_partition_to_its_fingerprint(watched, source_db, factory):
    write(factory, source_db, "TRUNCATE public.orders_raw")
    result = tick(factory, WATCHING, watched, source_db)
    assert result.mode == "full" and "truncated" in result.reason
    # 2024-01-05 was empty already; every other partition lost its rows.
    assert result.fingerprinted == WATCHED and sorted(result.changed) == [p for p in WATCHED if p != "2024-01-05"]


def test_a_column_added_without_a_rewrite_changes_every_partition(watched, source_db, factory):
    write(factory, source_db, "ALTER TABLE public.orders_raw ADD COLUMN channel text")
    result = tick(factory, WATCHING, watched, source_db)
    assert (result.mode, result.reason) == ("full", "changed its columns")
    assert sorted(result.changed) == WATCHED  # every source hash covers the columns


def test_a_statistics_reset_counts_rows_again_and_finds_nothing_when_nothing_changed(watched, source_db, factory):
    write(factory, source_db, "SELECT pg_stat_reset_single_table_counters('public.orders_raw'::regclass)")
    result = tick(factory, WATCHING, watched, source_db)
    assert result.mode == "counted" and "reset" in result.reason
    assert (result.signalled, result.flagged, result.changed) == (len(WATCHED), [], {})


def test_a_delete_hidden_by_a_statistics_reset_is_still_found(watched, source_db, factory):
    # The reset zeroes the counters after the delete was counted: they cannot say "deleted".
    write(factory, source_db, "DELETE FROM public.orders_raw WHERE order_id = 738891003 AND status = 'shipped'")
    write(factory, source_db, "SELECT pg_stat_reset()")
    result = tick(factory, WATCHING, watched, source_db)
    assert result.mode == "counted" and list(result.changed) == ["2024-01-06"]


def test_a_write_whose_counters_arrive_late_is_found_by_a_later_tick(watched, source_db, factory):
    # The writer stays connected and idle: PostgreSQL publishes its counters when it gets to
    # it (within about 10 s), so early ticks may see nothing; none may lose the write.
    with factory() as writer:
        writer.execute(b"UPDATE public.orders_raw SET status = 'late', ingest_seq = " + NEXT_SEQ.encode()
                       + b" WHERE order_id = 738888001 AND status = 'placed'")
        state, deadline = watched, time.monotonic() + 30
        while True:
            with factory() as c:
                result = watch_tick(c, WATCHING, state)
            state = result.state
            if result.changed:
                break
            assert result.mode == "quiet" and time.monotonic() < deadline
            time.sleep(0.5)
    assert list(result.changed) == ["2024-01-03"]


# --- snapshots taken again, budget ---------------------------------------------------------

def test_a_partition_snapshotted_again_after_its_change_was_reported_is_not_read_again(watched, source_db, factory):
    write(factory, source_db, "UPDATE public.orders_raw SET note = 'n', ingest_seq = " + NEXT_SEQ
          + " WHERE order_id = 738887002 AND status = 'placed'")
    reported = tick(factory, WATCHING, watched, source_db)
    assert list(reported.changed) == ["2024-01-02"]
    snapshot_step(WATCHING, PartitionRequest("2024-01-02"), factory)  # the restage it asked for
    after = tick(factory, WATCHING, reported.state, source_db)
    assert (after.mode, after.fingerprinted, after.changed) == ("quiet", [], {})


def test_a_new_snapshot_of_other_content_is_checked_in_full(watched, source_db, factory):
    # A snapshot whose transaction read the source before a change (here: taken while the
    # sensor did not look) carries a hash the sensor never saw: that partition is checked.
    write(factory, source_db, "UPDATE public.orders_raw SET note = 'n', ingest_seq = " + NEXT_SEQ
          + " WHERE order_id = 738887002 AND status = 'placed'")
    snapshot_step(WATCHING, PartitionRequest("2024-01-02"), factory)
    result = tick(factory, WATCHING, watched, source_db)
    assert "2024-01-02" in result.fingerprinted and result.changed == {}


def test_what_the_budget_leaves_is_fingerprinted_by_the_next_ticks(source_db, factory):
    write(factory, source_db, INDEX)
    snapshot_step(WATCHING, WEEK, factory)
    clock = iter(range(0, 1000, 10)).__next__  # every partition "takes" 10 s
    state, seen = None, []
    for n in range(4):  # a budget of 15 s fits one more partition after the first
        result = tick(factory, WATCHING, state, source_db, budget_s=15, clock=clock)
        assert result.fingerprinted == WATCHED[2 * n:2 * n + 2] and result.pending == tuple(WATCHED[2 * n + 2:])
        state, seen = result.state, seen + result.fingerprinted
    assert seen == WATCHED and tick(factory, WATCHING, state, source_db).fingerprinted == []


def test_the_state_survives_its_json_form(watched):
    assert WatchState.from_json(watched.as_json()) == watched
    assert WatchState.from_json({"format": 0}) is None and WatchState.from_json("junk") is None
    assert WatchState.from_json({"format": 1, "table": None, "partitions": {"2024-01-01": [1]}, "pending": []}) is None
    assert WatchState.from_json({"format": 1, "partitions": []}) is None


# --- gate 1's verdicts as values -----------------------------------------------------------

def reading(ins=10, upd=0, dele=0, node=500, resets=("t0", "t1"), columns="c", blind=None):
    return TableReading(((16384, "r", node, ins, upd, dele),), resets, columns, blind)


@pytest.mark.parametrize(("now", "mode"), [
    (reading(), "quiet"),
    (reading(ins=11), "newer"),
    (reading(upd=1), "counted"),
    (reading(dele=1), "counted"),
    (reading(ins=3), "counted"),  # counters went back: reset
    (reading(resets=("t2", "t1")), "counted"),  # pg_stat_reset, or one table's
    (reading(resets=("t0", "t3")), "counted"),  # crash recovery resets the shared counters' time
    (reading(node=501), "full"),  # TRUNCATE, VACUUM FULL, CLUSTER, a rewriting ALTER
    (reading(columns="d"), "full"),
    (reading(blind="track_counts is off"), "full"),
])
def test_gate_1_verdicts(now, mode):
    assert compare_tables(reading(), now)[0] == mode


def test_gate_1_without_an_earlier_reading_checks_everything():
    assert compare_tables(None, reading())[0] == "full"


def test_a_partitioned_source_is_read_per_leaf_and_a_view_is_not_watchable(conn, factory):
    from backfill_assets.core.engines.postgres.watch import read_table
    conn.execute(b"CREATE TABLE public.p (d date, v int) PARTITION BY RANGE (d)")
    conn.execute(b"CREATE TABLE public.p1 PARTITION OF public.p FOR VALUES FROM ('2024-01-01') TO ('2024-02-01')")
    conn.execute(b"CREATE TABLE public.p2 PARTITION OF public.p FOR VALUES FROM ('2024-02-01') TO ('2024-03-01')")
    conn.execute(b"CREATE VIEW public.pv AS SELECT d, v FROM public.p")
    spec = make_spec(source={"table": "public.p", "snapshot": "immutable"}, records_can_move=False)
    table = read_table(conn, spec)
    assert [r[1] for r in table.relations] == ["r", "r"] and table.blind is None
    view = read_table(conn, make_spec(source={"table": "public.pv", "snapshot": "immutable"}, records_can_move=False))
    assert view.blind == "the source is a view without write counters"


# --- bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize(("change_column", "message"), [
    ("ghost", "source.change_column ghost is not a column of the source public.orders_raw"),
    ("status", "source.change_column status has type text; it must be an integer, numeric, date or timestamp"),
])
def test_a_change_column_that_cannot_serve_is_refused_at_the_tick(change_column, message, source_db, factory):
    spec = make_spec(source={**DEMO_SPEC["source"], "change_column": change_column})
    snapshot_step(make_spec(), WEEK, factory)
    with pytest.raises(SpecError, match=message):
        tick(factory, spec, None, source_db)


@pytest.mark.parametrize(("change_column", "message"), [
    ("order_date", "source.change_column must not be the partition_key"),
    ("x" * 64, "longer than 63 bytes"),
    ("", "may not be empty"),
])
def test_a_change_column_of_the_wrong_shape_is_refused_with_the_spec(change_column, message):
    with pytest.raises(SpecError, match=message):
        make_spec(source={**DEMO_SPEC["source"], "change_column": change_column})


def test_without_the_index_gate_2_says_which_index_to_add(source_db, factory):
    snapshot_step(WATCHING, WEEK, factory)
    state = tick(factory, WATCHING, None, source_db).state
    write(factory, source_db, "DELETE FROM public.orders_raw WHERE order_id = 738891003 AND status = 'shipped'")
    result = tick(factory, WATCHING, state, source_db)
    assert result.fingerprinted == WATCHED and list(result.changed) == ["2024-01-06"]
    assert result.notes == [(
        'no index on (order_date, ingest_seq) of public.orders_raw, so every partition is fingerprinted; '
        'add it with: CREATE INDEX ON "public"."orders_raw" ("order_date", "ingest_seq");'
    )]


# --- the statements as text ----------------------------------------------------------------

def test_partition_signals_walk_the_index_once_per_partition(conn):
    query, params = sqlbuild.partition_signals(SRC, "order_date", "date", "ingest_seq", ["2024-01-01"])
    assert query.as_string(conn) == (
        'SELECT l.label, g.n, g.v, g.z, g.h FROM unnest(CAST(%(labels)s AS pg_catalog.text[])) AS l(label) '
        'CROSS JOIN LATERAL (SELECT count(*), max(s."ingest_seq")::text, count(*) FILTER (WHERE s."ingest_seq" IS NULL), '
        'sum(pg_catalog.hashtextextended(s."ingest_seq"::text, 0))::text '
        'FROM "public"."orders_raw" AS s WHERE s."order_date" = CAST(l.label AS "pg_catalog"."date")) '
        'AS g(n, v, z, h) ORDER BY l.label'
    )
    assert params == {"labels": ["2024-01-01"]}


def test_partition_signals_use_the_index_and_never_the_table(demo_db):
    demo_db.execute(INDEX.encode())
    demo_db.execute(b"VACUUM (ANALYZE) public.orders_raw")  # sets the visibility map, as autovacuum does
    demo_db.execute(b"SET enable_seqscan = off")  # the demo table is tiny; the plan shape is what counts
    query, params = sqlbuild.partition_signals(SRC, "order_date", "date", "ingest_seq", WATCHED)
    plan = "\n".join(r[0] for r in demo_db.execute(b"EXPLAIN " + query.as_bytes(demo_db), params))
    assert "Index Only Scan" in plan and "Seq Scan on orders_raw" not in plan


@pytest.mark.postgres  # starts a server of its own
def test_a_crash_that_discards_the_counters_is_seen_as_a_reset(server_dir):
    """Crash recovery drops every counter and leaves the database's reset time as it was;
    the shared counters' reset time (pg_stat_bgwriter) is what moves."""
    import os

    import pgserver

    if os.environ.get("BACKFILL_TEST_DATABASE_URL"):
        pytest.skip("needs a server of its own to crash")
    # Not under pytest's temporary root (server_dir): the server runs as a user of its own, and
    # any pytest starting on the machine makes that root private again, which cut the restarted
    # server off from its files ("could not open file global/pg_control: Permission denied").
    _crash_and_tick(server_dir / "pgdata", pgserver)


def _crash_and_tick(pgdata: Path, pgserver: Any) -> None:
    import os
    import signal

    from backfill_assets.cli import demo
    from backfill_assets.core.pg.db import DatabaseUrl, connection_factory
    from backfill_assets.core.vocabulary import DEFAULT_LIMITS

    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as admin:
            admin.execute(b"CREATE DATABASE watch")
        factory = connection_factory(DatabaseUrl(server.get_uri().replace("/postgres?", "/watch?"), "the crash server"), DEFAULT_LIMITS)
        with factory() as conn:
            with factory() as loader:
                demo.load(loader)
            write(factory, conn, INDEX)
            snapshot_step(WATCHING, WEEK, factory)
            state = tick(factory, WATCHING, None, conn).state
            write(factory, conn, "DELETE FROM public.orders_raw WHERE order_id = 738891003 AND status = 'shipped'")
        os.kill(int((pgdata / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)  # immediate shutdown
        deadline = time.monotonic() + 60
        while (pgdata / "postmaster.pid").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        server.ensure_postgres_running()  # crash recovery: every counter starts from zero
        with factory() as conn:
            counters = conn.execute(b"SELECT n_tup_ins, n_tup_del FROM pg_catalog.pg_stat_user_tables "
                                    b"WHERE relid = 'public.orders_raw'::regclass").fetchone()
            assert counters == (0, 0)
            result = tick(factory, WATCHING, state, conn)
        assert (result.mode, result.reason) == ("counted", "statistics were reset since the last tick")
        assert list(result.changed) == ["2024-01-06"]
    finally:
        server.cleanup()
