"""The one partitions definition a spec's snapshot, stages and target share."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import Spec
from backfill_assets.core.windows import UTC, Grain, Window, window_at, zone


def partitions_def(spec: Spec) -> dg.PartitionsDefinition:
    """Daily or monthly time windows (keys are ISO dates), a static list, or the spec's own
    time windows (keys are their labels), from the spec.

    Raises:
        SpecError: the spec has no ``partitions`` section.
    """
    p = spec.partitions
    if p is None:
        raise SpecError(
            f"spec {spec.name} has no `partitions` section; the Dagster code location needs one, "
            "for example `partitions: {type: daily, start: 2024-01-01}`"
        )
    if p.type == "static":
        return dg.StaticPartitionsDefinition(list(p.values or []))
    assert p.start is not None
    if p.type == "window":
        return _windows_def(spec)
    end = p.end.isoformat() if p.end else None
    if p.type == "daily":
        return dg.DailyPartitionsDefinition(start_date=p.start.isoformat(), end_date=end)
    return dg.MonthlyPartitionsDefinition(start_date=p.start.isoformat(), end_date=end)


# Per grain: the schedule each window starts on, in the spec's zone, and the format of its key,
# which is the window's label (core.windows): one name in the UI and on the command line.
_WINDOW_SCHEDULES: dict[Grain, tuple[str, str]] = {
    "hour": ("0 * * * *", "%Y-%m-%dT%H:%M%z"),
    "day": ("0 0 * * *", "%Y-%m-%d"),
    "week": ("0 0 * * 1", "%Y-%m-%d"),
    "month": ("0 0 1 * *", "%Y-%m"),
    "year": ("0 0 1 1 *", "%Y"),
}


def _windows_def(spec: Spec) -> dg.TimeWindowPartitionsDefinition:
    """The spec's time windows from ``partitions.start`` (the first window at or after the
    zone's midnight of that day) to ``partitions.end``, keyed by their labels."""
    window, p = spec.partition_window, spec.partitions
    assert window is not None and window.every is not None and p is not None and p.start is not None
    tz, grain, offset = zone(window.time_zone), window.every, window.offset

    def first_at(day: dt.date) -> Window:
        midnight = dt.datetime.combine(day, dt.time(), tz)
        found = window_at(midnight, grain, tz, offset)
        return found if found.start >= midnight.astimezone(UTC) else window_at(found.end, grain, tz, offset)

    cron, fmt = _WINDOW_SCHEDULES[grain]
    if offset is not None:  # the spec's own schedule; each key the window's start (core.windows)
        cron, fmt = " ".join((window.cron or "").split()), "%Y-%m-%dT%H:%M%z" if grain == "hour" else "%Y-%m-%d"
    # Offset windows are bounded by instants: a day's label alone would read as its midnight.
    def bound(day: dt.date) -> str | dt.datetime:
        first = first_at(day)
        return first.label if offset is None else first.start.astimezone(tz)

    return dg.TimeWindowPartitionsDefinition(
        cron_schedule=cron, fmt=fmt, timezone=window.time_zone, start=bound(p.start),
        end=None if p.end is None else bound(p.end),
    )


def contiguous_segments(parts: dg.PartitionsDefinition, labels: list[str]) -> list[list[str]]:
    """Split partition keys into runs of neighbours in the definition's order.

    Raises:
        SpecError: a key is not a partition of the definition.
    """
    keys = parts.get_partition_keys()
    index = {k: i for i, k in enumerate(keys)}
    unknown = [label for label in labels if label not in index]
    if unknown:
        raise SpecError(
            f"partition(s) {', '.join(unknown)} are outside the Dagster partitions of this spec; "
            "widen its `partitions` section"
        )
    segments: list[list[str]] = []
    for label in sorted(set(labels), key=index.__getitem__):
        if segments and index[label] == index[segments[-1][-1]] + 1:
            segments[-1].append(label)
        else:
            segments.append([label])
    return segments


def run_segments(spec: Spec, segments: list[list[str]]) -> list[list[str]]:
    """The runs a sensor requests for contiguous ``segments``: one per segment, or with the
    spec's ``parallel``, runs of at most ``max_partitions_per_run`` partitions, as a multi-run
    backfill splits them."""
    if spec.parallel is None:
        return segments
    most = spec.parallel.max_partitions_per_run
    return [segment[i:i + most] for segment in segments for i in range(0, len(segment), most)]
