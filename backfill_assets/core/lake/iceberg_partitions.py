"""An Iceberg table's partitions (core.lake.iceberg): the row filter that selects some (values
of the key, or time windows' ranges), and its hidden partitioning as time windows' own
partitions: which transform of the column (``hour``, ``day``, ``month``, ``year``, in UTC for a time
stamp) cuts time where a spec's windows do, the one a new table is partitioned by, and the
refusal of a table partitioned otherwise.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Sequence
from typing import Any

from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.parts import Part, Span
from backfill_assets.core.lake.tables import TableShape
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionValue
from backfill_assets.core.windows import UTC, Bound, Windowing, windows_between


def iceberg_literal(value: PartitionValue | Bound) -> object:
    return value.isoformat() if isinstance(value, dt.date) else value


def iceberg_filter(column: str, values: Sequence[Part]) -> Any:
    """The rows of some partitions as a pyiceberg row filter: the value equal to one of the
    values, or in one of the windows' ranges (which hidden partitioning and file metrics prune by)."""
    from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, In, LessThan, Or
    spans = [v for v in values if isinstance(v, Span)]
    if spans:
        ranges = [And(GreaterThanOrEqual(column, iceberg_literal(s.start)), LessThan(column, iceberg_literal(s.end)))
                  for s in spans]
        return ranges[0] if len(ranges) == 1 else Or(*ranges)
    literals = [iceberg_literal(v) for v in values if not isinstance(v, Span)]
    return EqualTo(column, literals[0]) if len(literals) == 1 else In(column, literals)


def window_partitioning(spec: Spec, windowing: Windowing, shape: TableShape | None) -> list[str]:
    """Native partitions of the windows: the table's hidden partitioning (``hour``, ``day``,
    ``month``, ``year`` of the column, in UTC for a time stamp) must cut time where the
    windows do, so that a window's overwrite deletes whole partitions' files. A missing
    table is created partitioned by the coarsest such transform (:func:`window_transform`).

    Raises:
        SpecError: the table is not partitioned by the column, or by a transform that splits
            a window (an Iceberg ``day(ts)`` is a day in UTC, not in New York), naming what
            to declare instead.
    """
    column = spec.partition_key
    if shape is None:
        return [f"{window_transform(windowing)}({column})"]
    fits = _fitting_transform(windowing)
    instead = (f"write it to a new table (apply creates one partitioned by {fits}({column})), or "
               if fits else "")
    if not shape.partitioned_by:
        raise SpecError(
            f"{spec.target_name} is not partitioned, so a window's overwrite would rewrite files holding "
            f"other windows' rows; {instead}partition it by {fits or 'hour'}({column})")
    for field in shape.partitioned_by:
        transform, _, source = field.removesuffix(")").partition("(")
        if not source:
            transform, source = "identity", transform
        if source != column:
            raise SpecError(
                f"{spec.target_name} is partitioned by {field}, not by the windows' column {column}: a "
                f"window's overwrite would not be one of its partitions; {instead}partition it by "
                f"{fits or 'hour'}({column}) alone")
        if not _aligned(windowing, transform):
            raise SpecError(
                f"{spec.target_name} is partitioned by {field}, {_cuts(transform)}, which cannot hold the "
                f"{windowing.grain}s of {windowing.tz} as its own partitions (a window would take part of "
                f"one); declare partition_window.time_zone: UTC, or {instead}partition it by "
                f"{fits or 'hour'}({column})")
    return list(shape.partitioned_by)


# Iceberg's transforms of a time stamp or date that a window can be a union of, finest first.
_TRANSFORMS = ("hour", "day", "month", "year")
_GRAIN_TRANSFORM = {"hour": "hour", "day": "day", "week": "day", "month": "month", "year": "year"}


def _cuts(transform: str) -> str:
    return "values" if transform == "identity" else f"{transform}s in UTC"


def _on_boundary(bound: Bound, transform: str) -> bool:
    """Whether ``transform``'s partitions of the column start at ``bound`` (an instant in UTC
    for a time stamp, as Iceberg computes its transforms; a date)."""
    if isinstance(bound, dt.datetime):
        at = bound.astimezone(UTC)
        if at.minute or at.second or at.microsecond:
            return False
        if transform == "hour":
            return True
        if at.hour:
            return False
        day = at.date()
    elif transform == "hour":
        return False  # Iceberg has no hour of a date
    else:
        day = bound
    return transform == "day" or (day.day == 1 and (transform == "month" or day.month == 1))


_SAMPLE = (dt.datetime(2000, 1, 1, tzinfo=UTC), dt.datetime(2040, 1, 1, tzinfo=UTC))


@functools.lru_cache(maxsize=64)
def _aligned(windowing: Windowing, transform: str) -> bool:
    """Whether every window is a union of ``transform``'s partitions: its bounds fall on the
    transform's, over the windows of 2000 to 2040 (an hour's bounds are whole hours in UTC
    where the zone's offset from UTC is whole hours, which its days' bounds show)."""
    if transform == "identity":
        return True
    if transform not in _TRANSFORMS:
        return False
    if windowing.grain == "hour":  # hours from a minute past the hour are no UTC hours
        if transform != "hour" or (windowing.offset is not None and windowing.offset.minute):
            return False
        return all(_on_boundary(windowing.bound(w.start), transform)
                   for w in windows_between(*_SAMPLE, "day", windowing.tz))
    return all(_on_boundary(windowing.bound(w.start), transform)
               for w in windows_between(*_SAMPLE, windowing.grain, windowing.tz, windowing.offset))


def _fitting_transform(windowing: Windowing) -> str | None:
    """The coarsest transform the windows are unions of (the grain's own, else hours), or None."""
    for transform in dict.fromkeys((_GRAIN_TRANSFORM[windowing.grain], "hour")):
        if not (windowing.column_kind == "date" and transform == "hour") and _aligned(windowing, transform):
            return transform
    return None


def window_transform(windowing: Windowing) -> str:
    """The transform a new table's windows are partitioned by (:func:`_fitting_transform`).

    Raises:
        SpecError: none fits (a zone whose offset from UTC is not whole hours)."""
    found = _fitting_transform(windowing)
    if found is None:
        raise SpecError(
            f"no Iceberg partition transform (hour, day, month or year, in UTC) cuts time where the "
            f"{windowing.grain}s of {windowing.tz} start (its offset from UTC is not whole hours), so an Iceberg "
            "table cannot hold them as its own partitions; declare partition_window.time_zone: UTC, or write a "
            "Delta or PostgreSQL target")
    return found


def window_transform_of(name: str) -> Any:
    """pyiceberg's transform named ``name`` (hour, day, month, year)."""
    from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform
    return {"hour": HourTransform, "day": DayTransform, "month": MonthTransform, "year": YearTransform}[name]()
