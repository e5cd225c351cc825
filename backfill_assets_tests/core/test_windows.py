"""Time windows (core.windows): the calendar of a zone, its daylight-saving days and repeated
hours, half-open boundaries, and what a request on the command line may name."""

from __future__ import annotations

import datetime as dt
import random
import zoneinfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.supports import ENGINE_TYPES, SUPPORTS
from backfill_assets.core.windows import (
    GRAINS,
    UTC,
    Windowing,
    cron_schedule,
    parse_windows,
    window_at,
    windows_between,
    zone,
)
from backfill_assets_tests.support.spec_samples import refused_with, sample_mapping

NEW_YORK = zone("America/New_York")
# Zones whose clocks move by whole hours: New York (DST), Kolkata (+05:30, none), Santiago (its
# day begins in the gap: clocks jump from midnight), Kathmandu (+05:45), UTC.
WHOLE_HOURS = ["America/New_York", "Asia/Kolkata", "America/Santiago", "Asia/Kathmandu", "UTC"]


def utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def test_a_new_york_day_is_23_24_or_25_hours_and_its_hours_say_which_offset():
    spring, fall, june = (parse_windows(d, "day", NEW_YORK)[0] for d in ("2024-03-10", "2024-11-03", "2024-06-01"))
    assert (spring.hours, fall.hours, june.hours) == (23, 25, 24)
    assert (spring.start, spring.end) == (utc(2024, 3, 10, 5), utc(2024, 3, 11, 4))
    hours = parse_windows("2024-11-03", "hour", NEW_YORK)
    assert len(hours) == 25 and [h.label for h in hours[1:3]] == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500"]
    skipped = [h.label for h in parse_windows("2024-03-10", "hour", NEW_YORK)]
    assert len(skipped) == 23 and "2024-03-10T01:00-0500" in skipped and "2024-03-10T03:00-0400" in skipped
    assert not any(label.startswith("2024-03-10T02:") for label in skipped)


def test_a_day_that_begins_in_a_gap_begins_when_the_clock_shows_it():
    santiago = zone("America/Santiago")  # 2024-09-08: the clocks jump from 00:00 to 01:00
    (day,) = parse_windows("2024-09-08", "day", santiago)
    start, end = day.local(santiago)
    assert day.hours == 23 and (start.hour, end.hour) == (1, 0)


def test_weeks_are_iso_weeks_months_and_years_their_calendar():
    weeks = parse_windows("2024-W01..2024-W02", "week", zone("UTC"))
    assert [w.label for w in weeks] == ["2024-01-01", "2024-01-08"] and weeks[0].start == utc(2024, 1, 1)
    # A week is labelled, and may be named, by the Monday it starts on (Dagster's weekly keys).
    assert parse_windows("2024-01-01..2024-01-08", "week", zone("UTC")) == weeks
    months = parse_windows("2024", "month", NEW_YORK)
    assert [m.label for m in months][:2] == ["2024-01", "2024-02"] and len(months) == 12
    assert months[1].end - months[1].start == dt.timedelta(days=29)  # a leap year's February
    assert parse_windows("2023..2024", "year", zone("UTC"))[1].start == utc(2024, 1, 1)


def test_a_year_of_hours_and_a_request_by_coarser_units():
    assert len(parse_windows("2023", "hour", NEW_YORK)) == 8_760
    assert len(parse_windows("2024-03-09..2024-03-11", "hour", NEW_YORK)) == 24 + 23 + 24
    assert len(parse_windows("2024-02", "day", NEW_YORK)) == 29
    assert [w.label for w in parse_windows("2024-11-03T01:00-05:00,2024-11-03T00:00", "hour", NEW_YORK)] == [
        "2024-11-03T00:00-0400", "2024-11-03T01:00-0500"]


@pytest.mark.parametrize("text, grain, says", [
    ("2024-11-03T01:00", "hour", "happens twice in America/New_York (its clocks fall back): write "
                                 "2024-11-03T01:00-0400 or 2024-11-03T01:00-0500"),
    ("2024-03-10T02:00", "hour", "does not happen in America/New_York: its clocks skip that hour"),
    ("2024-03-10T01:00-0400", "hour", "does not happen"),  # that offset is not shown then
    ("2024-03", "week", "names a month, which does not hold whole week windows; name them as 2024-03-04"),
    ("2024-03-05", "week", "is a Tuesday; a week window is named by the Monday it starts on (2024-03-04) or as an "
                           "ISO week (2024-W10)"),
    ("2024-03-10", "month", "names a day, which does not hold whole month windows"),
    ("2024-02-30", "day", "is not a date that exists"),
    ("2024-03-10T01:30", "hour", "is not a time window"),
    ("yesterday", "day", "is not a time window"),
    ("2024-03-11..2024-03-10", "day", "ends before it starts"),
    ("", "day", "empty"),
])
def test_a_request_that_names_no_window_or_two_is_refused_saying_what_to_write(text, grain, says):
    with pytest.raises(SpecError) as raised:
        parse_windows(text, grain, NEW_YORK)
    assert says in str(raised.value)


def test_hours_are_refused_in_a_zone_whose_clocks_move_by_half_an_hour():
    with pytest.raises(SpecError, match="moves its clocks by part of an hour"):
        parse_windows("2024-10-06", "hour", zone("Australia/Lord_Howe"))
    assert parse_windows("2024-10-06", "day", zone("Australia/Lord_Howe"))[0].hours == 23.5


@given(st.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2040, 1, 1)),
       st.sampled_from(WHOLE_HOURS), st.sampled_from(GRAINS))
def test_every_instant_lies_in_exactly_one_window_and_the_windows_tile_time(naive, name, grain):
    tz = zone(name)
    instant = naive.replace(tzinfo=UTC)
    window = window_at(instant, grain, tz)
    assert window.start <= instant < window.end
    after, before = window_at(window.end, grain, tz), window_at(window.start - dt.timedelta(microseconds=1), grain, tz)
    assert after.start == window.end and before.end == window.start  # no gap, no overlap
    assert window_at(window.start, grain, tz) == window  # a boundary belongs to the window it starts
    assert len({after.label, window.label, before.label}) == 3
    assert windows_between(before.start, after.end, grain, tz) == [before, window, after]


CRONS = ["15 * * * *", "30 6 * * *", "30 1 * * *", "0 2 * * *", "0 6 * * 0", "30 2 * * 6", "0 6 15 * *"]


@given(st.datetimes(min_value=dt.datetime(1990, 1, 1), max_value=dt.datetime(2040, 1, 1)),
       st.sampled_from(WHOLE_HOURS), st.sampled_from(CRONS))
def test_the_windows_of_a_cron_schedule_tile_time_too(naive, name, cron):
    grain, offset = cron_schedule(cron)
    tz = zone(name)
    instant = naive.replace(tzinfo=UTC)
    window = window_at(instant, grain, tz, offset)
    assert window.start <= instant < window.end
    after = window_at(window.end, grain, tz, offset)
    before = window_at(window.start - dt.timedelta(microseconds=1), grain, tz, offset)
    assert after.start == window.end and before.end == window.start
    assert window_at(window.start, grain, tz, offset) == window
    assert parse_windows(window.label, grain, tz, offset) == [window]  # a label names its window


def test_a_cron_schedule_names_its_windows_by_their_starts_and_a_day_names_those_starting_in_it():
    grain, offset = cron_schedule("30 6 * * *")
    days = parse_windows("2024-11-03", grain, NEW_YORK, offset)
    assert [(w.label, w.start, w.hours) for w in days] == [("2024-11-03", utc(2024, 11, 3, 11, 30), 24.0)]
    # The day from 01:30 on the night the clocks fall back starts at the later 01:30 (Dagster's rule).
    grain, offset = cron_schedule("30 1 * * *")
    (fall,) = parse_windows("2024-11-03", grain, NEW_YORK, offset)
    assert fall.start == utc(2024, 11, 3, 6, 30)
    # ...and where they skip 02:00, the day starts when the gap ends (03:00).
    grain, offset = cron_schedule("0 2 * * *")
    (spring,) = parse_windows("2024-03-10", grain, NEW_YORK, offset)
    assert spring.start == utc(2024, 3, 10, 7) and spring.hours == 23
    grain, offset = cron_schedule("15 * * * *")
    hours = parse_windows("2024-11-03", grain, NEW_YORK, offset)
    assert len(hours) == 25 and hours[0].label == "2024-11-03T00:15-0400"
    assert [w.label for w in parse_windows("2024-11-03T01:15-0500", grain, NEW_YORK, offset)] == ["2024-11-03T01:15-0500"]
    with pytest.raises(SpecError, match="happens twice"):
        parse_windows("2024-11-03T01:15", grain, NEW_YORK, offset)
    with pytest.raises(SpecError, match="names no window: each starts at minute 15 of each hour"):
        parse_windows("2024-11-03T01:00-0400", grain, NEW_YORK, offset)


@pytest.mark.parametrize(("cron", "grain", "plain"), [
    ("0 * * * *", "hour", True), ("0 0 * * *", "day", True), ("0 0 * * 1", "week", True), ("0 0 1 * *", "month", True),
    ("15 * * * *", "hour", False), ("0 6 * * 0", "week", False), ("30 6 15 * *", "month", False),
])
def test_a_cron_schedule_is_a_grain_and_where_its_windows_start(cron, grain, plain):
    found, offset = cron_schedule(cron)
    assert found == grain and (offset is None) == plain


@pytest.mark.parametrize(("cron", "says"), [
    ("*/15 * * * *", "is not a schedule of windows this tool reads"),
    ("0 6 * * 1-5", "is not a schedule of windows"), ("0 6 31 * *", "is not a schedule of windows"),
    ("61 * * * *", "is not a schedule"), ("0 0 1 1 *", "is not a schedule"),
])
def test_a_cron_schedule_that_is_no_such_windows_is_refused_with_the_forms_it_may_take(cron, says):
    refusal = refused_with(sample_mapping("postgres", "postgres", "postgres",
                                          partition_window={"cron": cron, "time_zone": "UTC"}))
    assert says in refusal and "`30 6 * * *`" in refusal


def test_a_date_column_takes_no_time_of_day_from_a_cron():
    with pytest.raises(SpecError, match="a date column holds whole days"):
        Windowing("day", NEW_YORK, "date", offset=cron_schedule("30 6 * * *")[1])
    assert Windowing("week", NEW_YORK, "date", offset=cron_schedule("0 0 * * 0")[1])


def _moved_by_part_of_an_hour(tz: dt.tzinfo) -> bool:
    offsets = [(utc(1995, 1, 1) + dt.timedelta(days=30 * n)).astimezone(tz).utcoffset() for n in range(548)]
    return any((b - a) % dt.timedelta(hours=1) for a, b in zip(offsets, offsets[1:]))


def test_in_every_zone_the_machine_knows_the_windows_of_every_grain_tile_time():
    """Ten instants between 1995 and 2040 per zone and grain (about 30,000 windows): each lies
    in its window, which meets its neighbours with no gap or overlap. Not the hours of a zone
    whose clocks once moved by part of an hour in those years (Lord Howe Island's every year,
    Caracas, Colombo, Pyongyang, Norfolk Island, Pitcairn once): those are refused (above)."""
    pick = random.Random(49)
    failed = []
    for name in sorted(zoneinfo.available_timezones()):
        tz = zone(name)
        for grain in [g for g in GRAINS if not (g == "hour" and _moved_by_part_of_an_hour(tz))]:
            for _ in range(10):
                instant = utc(1995, 1, 1) + dt.timedelta(seconds=pick.randrange(45 * 365 * 86_400))
                window = window_at(instant, grain, tz)
                after = window_at(window.end, grain, tz)
                before = window_at(window.start - dt.timedelta(microseconds=1), grain, tz)
                if not (window.start <= instant < window.end and after.start == window.end
                        and before.end == window.start):
                    failed.append((name, grain, instant))
    assert failed == []


@pytest.mark.parametrize("every, zone_name, says", [
    ("fortnight", "UTC", "partition_window.every"),
    ("hour", "Mars/Olympus", "time zone 'Mars/Olympus' is not an IANA time zone name"),
])
def test_the_spec_refuses_an_unknown_grain_or_zone_before_anything_is_read(every, zone_name, says):
    refusal = refused_with(sample_mapping("postgres", "postgres", "postgres",
                                          partition_window={"every": every, "time_zone": zone_name}))
    assert refusal is not None and says in refusal


def test_every_engine_takes_a_window_spec_from_each_source_into_each_target():
    window = {"every": "hour", "time_zone": "America/New_York"}
    for engine in ENGINE_TYPES:
        for source in SUPPORTS[engine].sources:
            for target in SUPPORTS[engine].targets:
                assert spec_from_mapping(sample_mapping(engine, source, target, partition_window=window))


def test_engine_postgres_takes_windows_for_a_postgresql_delta_or_iceberg_target():
    window = {"every": "hour", "time_zone": "America/New_York"}
    for target in ("postgres", "delta", "iceberg"):
        assert spec_from_mapping(sample_mapping("postgres", "postgres", target, partition_window=window))
