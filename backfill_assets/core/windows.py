"""Time windows: partitions that are the hours, days, weeks, months or years of a time stamp
(or date) column, in a declared time zone.

A window is a half-open interval of instants, ``[start, end)``: a row belongs to it when its
column is ``>= start`` and ``< end``, so a row exactly on a boundary lands in one window only.
Windows follow the zone's calendar: a day in America/New_York is 23, 24 or 25 hours long; an
hour is an hour of instants, so the hour a clock repeats when it falls back is two windows,
told apart by their UTC offsets, and the hour it skips is none. Weeks are ISO weeks (from
Monday). Nothing here reads a row; the engines turn a window into a range predicate on the
column, which an index or a file's statistics can serve.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import zoneinfo
from dataclasses import dataclass
from typing import Literal

from backfill_assets.core.errors import SpecError
from backfill_assets.core.vocabulary import MAX_PARTITIONS, request_items
from backfill_assets.core.window_calendar import (
    GRAINS,
    UTC,
    Grain,
    Offset,
    Window,
    at_local,
    cron_schedule,
    offset_text,
    unit_after,
    window_at,
    window_label,
    windows_between,
    zone,
)

# What callers name from here: the calendar's own words, and the requests and windowings.
__all__ = ["GRAINS", "UTC", "Bound", "ColumnKind", "Grain", "Offset", "Window", "Windowing", "cron_schedule",
           "parse_windows", "window_at", "windows_between", "zone"]

# What a request may name; a window is requested by its own label or by a label
# of a unit that holds whole windows of its grain (the hours of a day, the days of a month).
_UNITS: dict[Grain, str] = {
    "hour": r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):00(Z|[+-]\d{2}:?\d{2})?",
    "day": r"(\d{4})-(\d{2})-(\d{2})",
    "week": r"(\d{4})-W(\d{2})",
    "month": r"(\d{4})-(\d{2})",
    "year": r"(\d{4})",
}
_HOLDS: dict[Grain, tuple[Grain, ...]] = {
    "hour": ("hour", "day", "week", "month", "year"),
    "day": ("day", "week", "month", "year"),
    "week": ("week",),
    "month": ("month", "year"),
    "year": ("year",),
}
_EXAMPLES = {"hour": "2024-03-10T01:00", "day": "2024-03-10", "week": "2024-03-04", "month": "2024-03", "year": "2024"}


def _unit_of(text: str) -> tuple[Grain, re.Match[str]]:
    for unit, pattern in _UNITS.items():
        match = re.fullmatch(pattern, text)
        if match:
            return unit, match
    raise SpecError(f"partition {text!r} is not a time window: write an hour (2024-03-10T01:00), a day "
                    "(2024-03-10), a week (its Monday, 2024-03-04, or 2024-W10), a month (2024-03) or a year (2024), "
                    "or a range a..b of them")


def _span(text: str, grain: Grain, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """The instants ``text`` names (a label of a unit that holds whole windows of ``grain``)."""
    unit, match = _unit_of(text)
    monday = grain == "week" and unit == "day"  # a week window is named by the Monday it starts on
    if unit not in _HOLDS[grain] and not monday:
        units = " or ".join(_EXAMPLES[u] for u in _HOLDS[grain])
        raise SpecError(f"partition {text!r} names a {unit}, which does not hold whole {grain} windows; "
                        f"name them as {units}")
    first = _unit_start(text, unit, match)
    if unit == "hour":
        return _hour_span(text, first, match.group(5), tz)
    if monday:
        if first.weekday():
            start = first - dt.timedelta(days=first.weekday())
            raise SpecError(f"partition {text!r} is a {first:%A}; a week window is named by the Monday it starts on "
                            f"({start:%Y-%m-%d}) or as an ISO week ({start:%G-W%V})")
        unit = "week"
    return at_local(first, tz), at_local(unit_after(first, unit), tz)


def _unit_start(text: str, unit: Grain, match: re.Match[str]) -> dt.datetime:
    """The clock reading a unit named by ``text`` (matched as ``unit``) starts at."""
    numbers = [int(g) for g in match.groups()[:4] if g is not None]  # the fifth is an hour's offset
    try:
        if unit == "week":
            return dt.datetime.combine(dt.date.fromisocalendar(numbers[0], numbers[1], 1), dt.time())
        return dt.datetime(*numbers, *([1] * (3 - len(numbers))))  # type: ignore[misc]
    except ValueError:
        raise SpecError(f"partition {text!r} is not a date that exists") from None


def _hour_span(text: str, first: dt.datetime, offset: str | None, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """The hour of local time ``first``: it must happen, once, or its offset must say which."""
    at = {(first.replace(tzinfo=tz, fold=f)).astimezone(UTC) for f in (0, 1)}
    at = {a for a in at if a.astimezone(tz).replace(tzinfo=None) == first}
    if offset is not None:
        wanted = dt.timedelta(0) if offset == "Z" else (
            (-1 if offset[0] == "-" else 1) * dt.timedelta(hours=int(offset[1:3]), minutes=int(offset[-2:])))
        at = {a for a in at if a.astimezone(tz).utcoffset() == wanted}
    if not at:
        raise SpecError(f"partition {text!r} does not happen in {tz}: its clocks skip that hour "
                        "(or never show that offset)")
    if len(at) > 1:
        labels = " or ".join(sorted(window_label(a, "hour", tz) for a in at))
        raise SpecError(f"partition {text!r} happens twice in {tz} (its clocks fall back): write {labels}")
    (start,) = at
    return start, start + dt.timedelta(hours=1)


_START = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(Z|[+-]\d{2}:?\d{2})?")


def _offset_span(text: str, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """What ``text`` names of windows that start at an offset: the windows starting at the
    instant a label gives (``2024-11-03T01:30-0500``), or in a day, week, month or year."""
    match = _START.fullmatch(text)
    if match is None:
        unit, found = _unit_of(text)
        if unit == "hour":  # an hour's label is a start: _START reads it
            raise AssertionError(unit)
        first = _unit_start(text, unit, found)
        return at_local(first, tz), at_local(unit_after(first, unit), tz)
    numbers = [int(g) for g in match.groups()[:5]]
    try:
        first = dt.datetime(*numbers)  # type: ignore[misc]
    except ValueError:
        raise SpecError(f"partition {text!r} is not a date and time that exists") from None
    start, _ = _hour_span(text, first, match.group(6), tz)
    return start, start + dt.timedelta(microseconds=1)


def parse_windows(text: str, grain: Grain, tz: dt.tzinfo, offset: Offset | None = None) -> list[Window]:
    """The windows ``--partitions`` names, sorted and distinct: a comma list of labels and
    ranges ``a..b`` (inclusive), each a window of ``grain`` or a unit that holds whole ones
    (windows starting at an ``offset``: a window's label, or a unit naming the windows that
    start in it)."""
    example = _EXAMPLES[grain]
    items = request_items(text, f"{example} or a range {example}..{example}")
    found: dict[dt.datetime, Window] = {}
    for item in items:
        lo_text, dots, hi_text = item.partition("..")
        if offset is None:
            lo, hi = _span(lo_text.strip(), grain, tz), _span(hi_text.strip(), grain, tz) if dots else None
        else:
            lo, hi = _offset_span(lo_text.strip(), tz), _offset_span(hi_text.strip(), tz) if dots else None
        end = hi[1] if hi else lo[1]
        if end <= lo[0]:
            raise SpecError(f"partition range {item!r} ends before it starts")
        between = windows_between(lo[0], end, grain, tz, offset)
        if offset is not None and not between:
            raise SpecError(f"partition {item!r} names no window: each starts at {offset_text(grain, offset)}; "
                            "name one by its start (its label) or a day, month or year they start in")
        for window in between:
            found[window.start] = window
        if len(found) > MAX_PARTITIONS:
            raise SpecError(f"--partitions names more than {MAX_PARTITIONS} windows")
    return [found[k] for k in sorted(found)]


# What a window column holds: instants (timestamptz), a clock's readings in a declared zone
# (timestamp without time zone), or calendar days (date).
ColumnKind = Literal["timestamptz", "timestamp", "date"]
Bound = dt.datetime | dt.date


@dataclass(frozen=True)
class Windowing:
    """The windows of a spec's ``partition_window`` over a column of ``column_kind``: what a
    request names, each label's window, and a window's bounds as the column's own values
    (instants; the clock's readings in ``column_tz``; local dates), which the engines compare
    the column with, so that an index or a file's statistics serve the comparison."""

    grain: Grain
    tz: zoneinfo.ZoneInfo
    column_kind: ColumnKind
    column_tz: zoneinfo.ZoneInfo | None = None
    offset: Offset | None = None  # where each window starts (a cron schedule's), None: its unit's start

    def __post_init__(self) -> None:
        if self.column_kind == "date" and self.grain == "hour":
            raise SpecError("partition_window every hour needs a time stamp column; a date column holds days: "
                            "declare `every: day` or longer, or window a time stamp column")
        if self.column_kind == "date" and self.offset is not None and (self.offset.hour or self.offset.minute):
            raise SpecError("partition_window.cron starts each window at a time of day; a date column holds whole "
                            "days: start at 00:00 (`0 0 * * 0`, `0 0 15 * *`), or window a time stamp column")
        if (self.column_kind == "timestamp") != (self.column_tz is not None):
            raise SpecError(
                "partition_window.column_time_zone says which zone a `timestamp without time zone` column's "
                "clock reads in: declare it for such a column (UTC if it holds UTC), and only for one"
                if self.column_kind == "timestamp" else
                f"partition_window.column_time_zone is for a `timestamp without time zone` column; a {self.column_kind} "
                "column needs none: remove it")

    def request(self, text: str) -> list[str]:
        """The labels of the windows a ``--partitions`` request names, in time order."""
        return [w.label for w in parse_windows(text, self.grain, self.tz, self.offset)]

    def window(self, label: str) -> Window:
        """The window labelled ``label``; SpecError if no window of this grain and zone is."""
        found = _window_of(label, self.grain, self.tz, self.offset)
        if found is None:
            starts = "" if self.offset is None else f" starting at {offset_text(self.grain, self.offset)}"
            raise SpecError(f"partition {label!r} is not the label of a {self.grain} window{starts} in {self.tz}; "
                            f"write it as {_EXAMPLES[self.grain] if self.offset is None else 'its start'}")
        return found

    def at(self, instant: dt.datetime) -> Window:
        """The window that holds ``instant``."""
        return window_at(instant, self.grain, self.tz, self.offset)

    def labels(self, labels: list[str]) -> list[str]:
        """Stored labels, each checked to be a window's own, in time order."""
        return sorted(dict.fromkeys(labels), key=lambda label: self.window(label).start)

    def bound(self, instant: dt.datetime) -> Bound:
        """An instant as the column holds it (a window's start or end)."""
        if self.column_kind == "timestamptz":
            return instant
        if self.column_kind == "date":
            return instant.astimezone(self.tz).date()
        assert self.column_tz is not None
        return instant.astimezone(self.column_tz).replace(tzinfo=None)

    def buckets(self, labels: list[str]) -> tuple[list[Bound], list[str | None]]:
        """The windows of ``labels`` as buckets for a row's column: ascending bounds, and for
        each bound the label of the window starting there (None where a gap between the
        windows or the end of the last starts). A value ``v`` is in window ``labels[i]`` when
        ``bounds[i] <= v < bounds[i + 1]``: SQL's ``width_bucket(v, bounds)`` finds ``i + 1``.

        SpecError where the column cannot tell two windows apart: a ``timestamp without time
        zone`` read in a zone whose clock repeats the hour between them."""
        bounds: list[Bound] = []
        names: list[str | None] = []
        for window in sorted((self.window(label) for label in dict.fromkeys(labels))):
            start, end = self.bound(window.start), self.bound(window.end)
            if not bounds or bounds[-1] != start:
                if bounds:  # a gap since the window before
                    names.append(None)
                bounds.append(start)
            if not end > bounds[-1] or (len(bounds) > 1 and not bounds[-1] > bounds[-2]):
                raise SpecError(
                    f"window {window.label} cannot be told from the one before it in column clock time "
                    f"({self.column_tz}): the clock repeats that hour, and a `timestamp without time zone` does not "
                    "say which reading is which; store the column as timestamptz (or in UTC with "
                    "column_time_zone: UTC), or choose windows that do not split the repeated hour")
            names.append(window.label)
            bounds.append(end)
        names.append(None)
        return bounds, names

    def label_at(self, value: Bound) -> str:
        """The label of the window that holds a column value."""
        if isinstance(value, dt.datetime):
            if value.tzinfo is None:
                assert self.column_tz is not None
                value = value.replace(tzinfo=self.column_tz)
            return self.at(value).label
        return self.at(dt.datetime.combine(value, dt.time(), self.tz)).label


@functools.lru_cache(maxsize=1 << 16)
def _window_of(label: str, grain: Grain, tz: zoneinfo.ZoneInfo, offset: Offset | None = None) -> Window | None:
    try:
        found = parse_windows(label, grain, tz, offset)
    except SpecError:
        return None
    return found[0] if len(found) == 1 and found[0].label == label else None
