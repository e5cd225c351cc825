"""The calendar of time windows (core.windows): what a window is, the window of a grain
(hour, day, week, month, year) in a zone that holds an instant, and the windows between two
instants; with an offset, the windows between the ticks of a cron schedule as Dagster's
time-window partitions compute them. Nothing here reads a request or a row.
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from dataclasses import dataclass
from typing import Literal, get_args

from backfill_assets.core.errors import SpecError
from backfill_assets.core.vocabulary import MAX_PARTITIONS

Grain = Literal["hour", "day", "week", "month", "year"]
GRAINS: tuple[Grain, ...] = get_args(Grain)
UTC = dt.timezone.utc


def zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (``America/New_York``, ``UTC``); SpecError if there is none."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise SpecError(f"time zone {name!r} is not an IANA time zone name; write one such as UTC, "
                        "Europe/Berlin or America/New_York") from None


@dataclass(frozen=True, order=True)
class Window:
    """One window: its first instant, the first instant after it (both in UTC) and its label
    (``2024-03-10T01:00-0500`` an hour, ``2024-03-10`` a day, ``2024-03-04`` the week that starts
    on that Monday, ``2024-03`` a month, ``2024`` a year: local times, an hour with its offset;
    the keys of Dagster's time-window partitions in the same zone, so that a window has one name
    on the command line and in the UI)."""

    start: dt.datetime
    end: dt.datetime
    label: str

    @property
    def hours(self) -> float:
        return (self.end - self.start) / dt.timedelta(hours=1)

    def local(self, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
        """Its start and end as the zone's clock reads them (a ``timestamp without time zone``
        column that reads in ``tz`` holds rows from the first up to, not including, the second)."""
        return self.start.astimezone(tz), self.end.astimezone(tz)


@dataclass(frozen=True)
class Offset:
    """Where each window starts within its unit, as a cron schedule says it (``30 6 * * *``:
    days from 06:30): the minute (hours), the minute and hour (days), and the day too (a week's
    day, 0 Sunday to 6 Saturday as cron counts; a month's day, 1 to 28)."""

    minute: int = 0
    hour: int = 0
    day: int | None = None


# The schedules a cron may say, as Dagster's time-window partitions compute them (its hourly,
# daily, weekly and monthly kinds): a grain and where its windows start.
_CRON_FORMS = (
    ("hour", re.compile(r"(\d{1,2}) \* \* \* \*")),
    ("day", re.compile(r"(\d{1,2}) (\d{1,2}) \* \* \*")),
    ("week", re.compile(r"(\d{1,2}) (\d{1,2}) \* \* (\d)")),
    ("month", re.compile(r"(\d{1,2}) (\d{1,2}) (\d{1,2}) \* \*")),
)


def cron_schedule(cron: str) -> tuple[Grain, Offset | None]:
    """The grain and offset of a cron schedule (None: the grain's own start, the windows of
    ``every``: ``0 * * * *``, ``0 0 * * *``, ``0 0 * * 1``, ``0 0 1 * *``).

    Raises:
        SpecError: not one of the four forms, or a field out of range, naming the forms.
    """
    text = " ".join(cron.split())
    for grain, form in _CRON_FORMS:
        match = form.fullmatch(text)
        if match is None:
            continue
        numbers = [int(g) for g in match.groups()]
        minute, hour = numbers[0], numbers[1] if len(numbers) > 1 else 0
        day = numbers[2] if len(numbers) > 2 else None
        if minute > 59 or hour > 23 or (grain == "week" and day is not None and day > 6) or \
                (grain == "month" and day is not None and not 1 <= day <= 28):
            break
        offset = Offset(minute, hour, day)
        plain = {"hour": Offset(), "day": Offset(), "week": Offset(0, 0, 1), "month": Offset(0, 0, 1)}[grain]
        return grain, (None if offset == plain else offset)  # type: ignore[return-value]
    raise SpecError(
        f"partition_window.cron {cron!r} is not a schedule of windows this tool reads: write hours from a "
        "minute (`15 * * * *`), days from a time (`30 6 * * *`), weeks from a day and time (`0 6 * * 0`, "
        "0 Sunday to 6 Saturday) or months from a day (1 to 28) and time (`0 6 15 * *`)")


# Hours in which Dagster reads an ambiguous clock time as its later reading (its schedules'
# rule, kept so that a window has the same instants in the UI).
_FOLD_HOURS = frozenset({1, 2, 3})


def _at_offset(naive: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """The instant a window starting at the clock reading ``naive`` starts, as Dagster's
    schedules read it: a reading the clock skips is the instant the gap ends; a reading it
    shows twice (in the hours 1 to 3) is the later one; any other is the one it shows."""
    first = naive.replace(tzinfo=tz, fold=0)
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != naive:  # skipped: the gap's end
        return at_local(naive.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1), tz)
    later = naive.replace(tzinfo=tz, fold=1)
    if naive.hour in _FOLD_HOURS and later.utcoffset() != first.utcoffset():
        return later.astimezone(UTC)
    return first.astimezone(UTC)


def _floor_offset(local: dt.datetime, grain: Grain, offset: Offset) -> dt.datetime:
    """The clock reading a window of ``grain`` starting at ``offset`` starts at, for the
    window whose unit holds the clock reading ``local`` (naive)."""
    start = local.replace(hour=offset.hour, minute=offset.minute, second=0, microsecond=0)
    if grain == "week":
        wanted = ((offset.day or 0) - 1) % 7  # cron's Sunday 0 as Python's weekday 6
        start -= dt.timedelta(days=(start.weekday() - wanted) % 7)
        return start - dt.timedelta(days=7) if start > local else start
    if grain == "month":
        start = start.replace(day=offset.day or 1)
        if start > local:  # that day of the month before (the last day before the 1st, then the day)
            start = (start.replace(day=1) - dt.timedelta(days=1)).replace(day=offset.day or 1)
        return start
    return start - dt.timedelta(days=1) if start > local else start


def _next_offset(start: dt.datetime, grain: Grain, offset: Offset) -> dt.datetime:
    """The clock reading the window after the one starting at ``start`` (naive) starts at."""
    if grain == "week":
        return start + dt.timedelta(days=7)
    if grain == "month":
        return unit_after(start.replace(day=1), "month").replace(day=offset.day or 1)
    return start + dt.timedelta(days=1)


def at_local(naive: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    """The instant the zone's clock first reads ``naive`` (a unit's start, on the hour): the
    earlier one when the clock reads it twice; where the clock skips it (a day that begins
    in a gap), the instant the gap ends, when the unit's first reading shows."""
    return naive.replace(tzinfo=tz, fold=0).astimezone(UTC)


def _floor(local: dt.datetime, grain: Grain) -> dt.datetime:
    """The start of the calendar unit holding ``local`` (naive, the zone's clock)."""
    if grain == "hour":
        return local.replace(minute=0, second=0, microsecond=0)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if grain == "day":
        return day
    if grain == "week":
        return day - dt.timedelta(days=day.weekday())
    if grain == "month":
        return day.replace(day=1)
    return day.replace(month=1, day=1)


def unit_after(local: dt.datetime, grain: Grain) -> dt.datetime:
    """The start of the calendar unit after the one starting at ``local`` (naive)."""
    if grain == "hour":
        return local + dt.timedelta(hours=1)
    if grain == "day":
        return local + dt.timedelta(days=1)
    if grain == "week":
        return local + dt.timedelta(days=7)
    if grain == "month":
        return local.replace(year=local.year + local.month // 12, month=local.month % 12 + 1)
    return local.replace(year=local.year + 1)


def window_label(start: dt.datetime, grain: Grain, tz: dt.tzinfo, offset: Offset | None = None) -> str:
    local = start.astimezone(tz)
    if offset is not None:  # a window named by its start: an hour's minute, another's day
        return f"{local:%Y-%m-%dT%H:%M%z}" if grain == "hour" else f"{local:%Y-%m-%d}"
    if grain == "hour":
        return f"{local:%Y-%m-%dT%H:%M%z}"
    if grain == "day":
        return f"{local:%Y-%m-%d}"
    if grain == "week":  # the Monday it starts on
        return f"{local:%Y-%m-%d}"
    return f"{local:%Y-%m}" if grain == "month" else f"{local:%Y}"


def window_at(instant: dt.datetime, grain: Grain, tz: dt.tzinfo, offset: Offset | None = None) -> Window:
    """The window of ``grain`` in ``tz`` (starting at ``offset``: a cron schedule's) that
    holds ``instant`` (an aware datetime)."""
    if offset is not None:
        return _window_with_offset(instant, grain, tz, offset)
    if grain == "hour":  # an hour of instants: the repeated hour is two windows, the skipped none
        local = instant.astimezone(tz)
        start = local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
        return Window(start, start + dt.timedelta(hours=1), window_label(start, grain, tz))
    first = _floor(instant.astimezone(tz).replace(tzinfo=None), grain)
    start = at_local(first, tz)
    if start > instant:  # the unit began in a gap and the instant is in the one before
        first = _floor(first - dt.timedelta(microseconds=1), grain)
        start = at_local(first, tz)
    return Window(start, at_local(unit_after(first, grain), tz), window_label(start, grain, tz))


def _window_with_offset(instant: dt.datetime, grain: Grain, tz: dt.tzinfo, offset: Offset) -> Window:
    """:func:`window_at` for windows that start at ``offset`` (Dagster's rules: an hour from a
    minute is an hour of instants; a day, week or month from a clock time starts where
    :func:`_at_offset` reads that time)."""
    if grain == "hour":
        local = instant.astimezone(tz)
        start = local.replace(minute=offset.minute, second=0, microsecond=0).astimezone(UTC)
        if start > instant:
            start -= dt.timedelta(hours=1)
        return Window(start, start + dt.timedelta(hours=1), window_label(start, grain, tz, offset))
    first = _floor_offset(instant.astimezone(tz).replace(tzinfo=None), grain, offset)
    start = _at_offset(first, tz)
    while start > instant:  # its reading was skipped or read later: the window before
        first = _floor_offset(first - dt.timedelta(microseconds=1), grain, offset)
        start = _at_offset(first, tz)
    end = _at_offset(_next_offset(first, grain, offset), tz)
    while end <= instant:  # the next window's reading came earlier than the instant's clock showed
        first = _next_offset(first, grain, offset)
        start, end = end, _at_offset(_next_offset(first, grain, offset), tz)
    return Window(start, end, window_label(start, grain, tz, offset))


def windows_between(start: dt.datetime, end: dt.datetime, grain: Grain, tz: dt.tzinfo,
                    offset: Offset | None = None) -> list[Window]:
    """The windows whose first instant is at or after ``start`` and before ``end``."""
    found: list[Window] = []
    window = window_at(start, grain, tz, offset)
    if window.start < start:
        window = window_at(window.end, grain, tz, offset)
    while window.start < end:
        found.append(window)
        if len(found) > MAX_PARTITIONS:
            raise SpecError(f"--partitions names more than {MAX_PARTITIONS} windows")
        window = window_at(window.end, grain, tz, offset)
        if window.start != found[-1].end:  # hours, where a zone's clock moves by part of one
            raise SpecError(f"time zone {tz} moves its clocks by part of an hour near {found[-1].end:%Y-%m-%d}, "
                            "so its hours do not tile the day; hour windows need a zone whose clocks move by "
                            "whole hours (UTC, or a zone such as Australia/Sydney)")
    return found


def offset_text(grain: Grain, offset: Offset) -> str:
    """Where windows of ``grain`` start, in words (``minute 30 of each hour``)."""
    if grain == "hour":
        return f"minute {offset.minute} of each hour"
    at = f"{offset.hour:02d}:{offset.minute:02d}"
    if grain == "week":
        day = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")[offset.day or 0]
        return f"{at} each {day}"
    return f"{at} on day {offset.day} of each month" if grain == "month" else f"{at} each day"
