"""Time windows on engine postgres: hours and days of a time stamp, in a zone with daylight
saving, planned, approved and applied against a real server; the rows written are the naive
newest-wins of each window, computed here in Python with zoneinfo."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from decimal import Decimal

import psycopg
import pytest

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.audit import audit_spec
from backfill_assets.core.diff import diff_plan
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.watch import watch_tick
from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint import rows as fingerprint_rows
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.plan import make_plan, snapshot_step
from backfill_assets.core.profile.propose import profile_spec
from backfill_assets.core.store import ledger
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest, TableRef
from backfill_assets.core.windows import Windowing, cron_schedule, window_at, zone
from backfill_assets_tests.support.source_writes import settle
from backfill_assets_tests.support.windows import (
    EVENT_COLUMNS,
    FALL,
    UTC_CLOCK_ROWS,
    create_events,
    events_spec,
    naive_newest,
    plan_approve_apply,
    utc,
)

NY = zoneinfo.ZoneInfo("America/New_York")
TARGET = TableRef("public", "events_hourly")
COLUMNS = EVENT_COLUMNS


def _spec(**changes: object):
    return events_spec(**changes)


@pytest.mark.parametrize("snapshot", ["copy", "exported", "immutable"])
def test_hours_of_a_fall_back_day_plan_approve_and_apply_as_the_naive_newest_wins(conn, factory, url_env, snapshot):
    create_events(conn, FALL)
    conn.execute("INSERT INTO public.events_hourly VALUES ('2024-11-03 06:30+00', 99, now(), 1, 1, 'stale')")
    spec = _spec(source={"table": "public.events_raw", "snapshot": snapshot})
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03")
    labels = [p["partition"] for p in plan.as_json()["partitions"]]
    assert len(labels) == 25  # a day of 25 hours
    assert labels[:3] == ["2024-11-03T00:00-0400", "2024-11-03T01:00-0400", "2024-11-03T01:00-0500"]
    assert labels[-1] == "2024-11-03T23:00-0500"
    windowing = Windowing("hour", zone("America/New_York"), "timestamptz")
    expected = naive_newest(FALL, windowing, labels)
    # An empty window already holds what it should (nothing) and is skipped; the stale row's is replaced.
    changed = {label for label, rows in expected.items() if rows} | {"2024-11-03T01:00-0500"}
    assert {p["partition"]: p["status"] for p in result.partitions} == {
        label: "verified" if label in changed else "skipped-already-verified" for label in labels}
    cols = table_columns(conn, TARGET)
    for p in result.partitions:
        want = expected[p["partition"]]
        assert p["content_hash"] == fingerprint_rows.reference_readings(cols, want, ["event_id"], "amount").content_hash
    got = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM public.events_hourly ORDER BY created_at, event_id").fetchall()
    assert got == sorted((r for rs in expected.values() for r in rs), key=lambda r: (r[0], r[1]))
    # The repeated hour is two windows: event 2's versions both stay, one in each.
    assert [r[0] for r in got if r[1] == 2] == [utc(2024, 11, 3, 5), utc(2024, 11, 3, 6)]
    # The window that held only the stale row (01:00 EST) now holds event 2's row, and the stale one is gone.
    assert 99 not in [r[1] for r in got]
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(conn, spec)}
    assert len(states) == 25 and {states[label] for label in changed} == {"verified"}
    # The ledger names each window by its label and holds its instants: the repeated hour's two.
    bounds = {r[0]: r[1:] for r in conn.execute(psycopg.sql.SQL(
        "SELECT partition, window_start, window_end FROM {}.ledger WHERE run_id = 'r1'").format(
        psycopg.sql.Identifier(spec.control_schema))).fetchall()}
    assert bounds["2024-11-03T01:00-0400"] == (utc(2024, 11, 3, 5), utc(2024, 11, 3, 6))
    assert bounds["2024-11-03T01:00-0500"] == (utc(2024, 11, 3, 6), utc(2024, 11, 3, 7))

    # The same source again: the same plan, and nothing to replace.
    again = make_plan(spec, PartitionRequest("2024-11-03T00:00..2024-11-03T23:00"), factory)
    assert again.plan_id == plan.plan_id


def test_a_timestamp_without_time_zone_is_read_in_its_declared_zone_by_days_of_another(conn, factory, url_env):
    """A `timestamp` column holding UTC clock readings, windowed by New York days: the spring
    day (2024-03-10) is 23 hours, and a row a microsecond before 05:00 UTC is still 9 March."""
    create_events(conn, UTC_CLOCK_ROWS, "timestamp")
    spec = _spec(partition_window={"every": "day", "time_zone": "America/New_York", "column_time_zone": "UTC"})
    plan, result = plan_approve_apply(conn, factory, spec, "2024-03-09..2024-03-11")
    counts = {p["partition"]: p["stage_a"]["row_count"] for p in plan.as_json()["partitions"]}
    assert counts == {"2024-03-09": 1, "2024-03-10": 2, "2024-03-11": 1}
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    assert conn.execute("SELECT count(*) FROM public.events_hourly").fetchone()[0] == 4


def test_a_window_is_read_by_a_range_its_index_serves(conn):
    """No function over the column: the source's index on it reads each window's rows."""
    create_events(conn, FALL)
    windowing = Windowing("hour", NY, "timestamptz")
    by = sqlbuild.WindowsBy("created_at", windowing)
    labels = windowing.request("2024-11-03T01:00-0500,2024-11-03T05:00")  # two windows with a gap
    query, params = sqlbuild.partition_counts(TableRef("public", "events_raw"), by, labels)
    conn.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in conn.execute(psycopg.sql.SQL("EXPLAIN ") + query, params).fetchall())
    assert "Index" in plan and "created_at >=" in plan, plan
    assert dict(conn.execute(query, params).fetchall()) == {"2024-11-03T01:00-0500": 1}


@pytest.mark.parametrize(("changes", "message"), [
    ({"partition_window": {"every": "fortnight", "time_zone": "UTC"}}, "every"),
    ({"partition_window": {"every": "hour", "time_zone": "Mars/Olympus"}}, "not an IANA time zone"),
])
def test_a_spec_of_windows_is_refused_before_anything_is_read(changes, message):
    with pytest.raises(SpecError, match=message):
        _spec(**changes)


@pytest.mark.parametrize(("ts_type", "window", "message"), [
    ("text", {"every": "day", "time_zone": "UTC"}, "needs a date or time stamp partition_key"),
    ("date", {"every": "hour", "time_zone": "UTC"}, "a date column holds days"),
    ("timestamp", {"every": "day", "time_zone": "UTC"}, "declare it for such a column"),
    ("timestamptz", {"every": "day", "time_zone": "UTC", "column_time_zone": "UTC"}, "needs none: remove it"),
])
def test_a_window_over_a_column_that_cannot_hold_it_is_refused_by_inspection(conn, factory, url_env, ts_type,
                                                                                window, message):
    create_events(conn, [], ts_type)
    with pytest.raises(SpecError, match=message):
        make_plan(_spec(partition_window=window), PartitionRequest("2024-11-03"), factory)
    assert conn.execute("SELECT to_regnamespace('backfill_control') IS NULL").fetchone()[0]


def test_a_repeated_hour_a_naive_column_cannot_tell_apart_is_refused():
    windowing = Windowing("hour", NY, "timestamp", NY)
    with pytest.raises(SpecError, match="cannot be told from the one before"):
        windowing.buckets(windowing.request("2024-11-03"))
    assert window_at(utc(2024, 11, 3, 6), "hour", NY).label == "2024-11-03T01:00-0500"


def test_a_late_row_in_a_window_verified_weeks_before_is_flagged_by_the_sensor_alone(conn, factory, url_env):
    """The source sensor reads each window's rows by its range of the index on (column, change
    column): a row that arrives weeks late moves exactly its own window, however old."""
    weeks = [(n, utc(2024, 10, 1) + dt.timedelta(hours=7 * n), utc(2024, 11, 1), n, "1.00", None) for n in range(120)]
    with factory() as loader:
        create_events(loader, weeks)
        loader.execute("CREATE INDEX events_watch ON public.events_raw (created_at, seq)")
    settle(conn)
    spec = _spec(source={"table": "public.events_raw", "snapshot": "copy", "change_column": "seq"})
    snapshot_step(spec, PartitionRequest("2024-10-01..2024-10-31"), factory)
    with factory() as c:
        first = watch_tick(c, spec, None)
    settle(conn)
    assert first.mode == "full" and first.changed == {} and len(first.fingerprinted) == 744  # 31 days of hours
    late = "2024-10-02T13:00-0400"
    with factory() as w:
        w.execute("INSERT INTO public.events_raw VALUES ('2024-10-02 17:15+00', 1000, now(), 1000, 1.00, 'late')")
    settle(conn)
    with factory() as c:
        result = watch_tick(c, spec, first.state)
    assert (result.flagged, list(result.changed)) == ([late], [late])


def test_diff_audit_and_profile_name_windows_by_their_labels(conn, factory, url_env):
    """Before apply, diff names each changed window; after it, audit holds every verified
    window by its signal and finds a hand fix in one; profile samples the windows with rows."""
    create_events(conn, FALL)
    spec = _spec()
    plan = make_plan(spec, PartitionRequest("2024-11-03"), factory)
    with factory.control(conn) as store:
        approve_plan(conn, factory, spec, find_plan(store, spec, plan.plan_id), "alice")
    repeated = diff_plan(spec, plan.plan_id, factory, request=PartitionRequest("2024-11-03T01:00-0500"))
    (part,) = repeated.partitions
    assert (part.partition, part.added, part.removed, part.changed) == ("2024-11-03T01:00-0500", 1, 0, 0)
    apply_plan(spec, plan.plan_id, factory, run_id="r1")

    conn.execute("UPDATE public.events_hourly SET note = 'hand fix' WHERE event_id = 4")
    found = {p.partition: p.result for p in audit_spec(spec, factory, full=True).partitions}
    assert len(found) == 25 and found.pop("2024-11-03T02:00-0500") == "drifted"
    assert set(found.values()) == {"holds"}
    # UNIQUE (created_at, event_id) lets a key in twice within a window: the readings count it.
    conn.execute("INSERT INTO public.events_hourly VALUES ('2024-11-03 04:10+00', 1, now(), 1, 1, 'twice')")
    ctx = resolve(conn, spec, ["2024-11-03T00:00-0400"])
    assert ctx.readings(conn, TARGET, "2024-11-03T00:00-0400").duplicate_key_count == 1

    profile = profile_spec(spec, factory)
    # The first windows that hold rows, from the earliest row's (the day before's last hour) on.
    assert profile.partitions == ["2024-11-02T23:00-0400", "2024-11-03T00:00-0400", "2024-11-03T01:00-0400",
                                  "2024-11-03T01:00-0500", "2024-11-03T02:00-0500", "2024-11-03T23:00-0500",
                                  "2024-11-04T00:00-0500"]
    assert profile.row_count == len(FALL)
    assert profile.key_partitions == 7 and profile.key_search_complete  # keys measured per window


def test_a_time_stamp_that_moves_to_another_window_is_a_moved_record(conn, factory, url_env):
    """records_can_move: a key's newest version decides its window. A correction that moves
    an event's time stamp three hours on adds the window it lands in, both replaced in one
    transaction; a time stamp that moves within its window adds nothing."""
    rows = [
        (1, utc(2024, 11, 3, 5, 10), utc(2024, 11, 4), 1, "1.00", "first"),
        (1, utc(2024, 11, 3, 9, 20), utc(2024, 11, 5), 2, "1.50", "corrected: 04:20 EST, another window"),
        (2, utc(2024, 11, 3, 5, 30), utc(2024, 11, 4), 1, "2.00", None),
        (3, utc(2024, 11, 3, 6, 5), utc(2024, 11, 4), 1, "3.00", None),
        (3, utc(2024, 11, 3, 6, 45), utc(2024, 11, 5), 2, "3.50", "corrected within its window"),
    ]
    create_events(conn, rows)
    conn.execute("ALTER TABLE public.events_hourly DROP CONSTRAINT events_hourly_created_at_event_id_key")
    conn.execute("ALTER TABLE public.events_hourly ADD UNIQUE (event_id)")
    conn.execute("INSERT INTO public.events_hourly VALUES ('2024-11-03 05:10+00', 1, now(), 1, 1.00, 'first'), "
                 "('2024-11-03 06:05+00', 3, now(), 1, 3.00, NULL)")
    spec = _spec(records_can_move=True)
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400,2024-11-03T01:00-0500")
    doc = plan.document
    assert [a.partition for a in doc.added_partitions] == ["2024-11-03T04:00-0500"]
    assert "key (event_id=1) moves here from 2024-11-03T01:00-0400" in doc.added_partitions[0].reasons[0]
    assert [list(g) for g in doc.replace_groups] == [["2024-11-03T01:00-0400", "2024-11-03T04:00-0500"],
                                                     ["2024-11-03T01:00-0500"]]
    assert {p["partition"]: p["status"] for p in result.partitions} == dict.fromkeys(
        ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500", "2024-11-03T04:00-0500"], "verified")
    got = conn.execute("SELECT event_id, created_at, amount FROM public.events_hourly ORDER BY event_id").fetchall()
    assert got == [(1, utc(2024, 11, 3, 9, 20), Decimal("1.50")), (2, utc(2024, 11, 3, 5, 30), Decimal("2.00")),
                   (3, utc(2024, 11, 3, 6, 45), Decimal("3.50"))]


def test_hours_from_minute_30_of_a_cron_schedule_plan_approve_and_apply_as_the_naive_newest_wins(conn, factory,
                                                                                                url_env):
    """partition_window.cron: the windows between the ticks of `30 * * * *` in New York, named
    by their starts; the plan records the cron; the rows written are the naive newest-wins."""
    create_events(conn, FALL)
    # The NULL-key row is alone in its window here (02:30-03:30 EST): a partition it would empty.
    conn.execute("DELETE FROM public.events_raw WHERE event_id IS NULL")
    spec = _spec(partition_window={"cron": "30 * * * *", "time_zone": "America/New_York"})
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03")
    labels = [p["partition"] for p in plan.as_json()["partitions"]]
    assert len(labels) == 25 and labels[:3] == ["2024-11-03T00:30-0400", "2024-11-03T01:30-0400",
                                                "2024-11-03T01:30-0500"]
    assert plan.document.partition_window == {"every": "hour", "time_zone": "America/New_York",
                                              "column_time_zone": None, "cron": "30 * * * *"}
    assert {p["status"] for p in result.partitions} <= {"verified", "skipped-already-verified"}
    windowing = Windowing("hour", NY, "timestamptz", offset=cron_schedule("30 * * * *")[1])
    expected = naive_newest(FALL, windowing, labels)
    got = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM public.events_hourly ORDER BY created_at, event_id").fetchall()
    assert got == sorted((r for rows in expected.values() for r in rows), key=lambda r: (r[0], r[1]))
    # Event 1's version at 00:00 EDT lies in the window from 23:30 the day before, which was not
    # asked for; its 00:30 version starts the day's first window.
    assert [r[0] for r in got if r[1] == 1] == [utc(2024, 11, 3, 4, 30)]
