"""A partition as a lake table is asked for it (core.lake.tables): a value of the partition
key, or a time window as the column holds its bounds (:class:`Span`), with what every format
and engine makes of one: its label, an Arrow dataset filter, and windows as rows to join with.
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from backfill_assets.core.vocabulary import PartitionValue, partition_label
from backfill_assets.core.windows import Bound, Windowing


@dataclass(frozen=True)
class Span:
    """A time window (core.windows) as a lake column holds its bounds: the partition's rows
    are those with ``start <= column < end`` (an instant in UTC for a timestamptz column, the
    clock's reading for a ``timestamp``, a date for a date column)."""

    start: Bound
    end: Bound
    label: str


# A partition as a lake table is asked for it: a value of the partition column, or a window.
Part = PartitionValue | Span


def part_label(part: Part) -> str:
    """The partition's label: a window's own, or the value's (vocabulary.partition_label)."""
    return part.label if isinstance(part, Span) else partition_label(part)


def span_of(windowing: Windowing, label: str) -> Span:
    """The window ``label`` as the column holds its bounds (core.windows.Windowing.bound)."""
    window = windowing.window(label)
    return Span(windowing.bound(window.start), windowing.bound(window.end), label)


def bound_type(bound: Bound) -> pa.DataType:
    """The Arrow type of a lake column holding ``bound``: a UTC-adjusted time stamp, a plain
    one, or a date."""
    if isinstance(bound, dt.datetime):
        return pa.timestamp("us", tz="UTC") if bound.tzinfo is not None else pa.timestamp("us")
    return pa.date32()


def spans_table(spans: Sequence[Span]) -> pa.Table:
    """Windows as rows (``label``, ``lo``, ``hi``) for an engine to join a column with: a row is
    in the window whose ``lo <= column < hi``."""
    t = bound_type(spans[0].start) if spans else pa.timestamp("us", tz="UTC")
    return pa.table({"label": pa.array([s.label for s in spans], pa.string()),
                     "lo": pa.array([s.start for s in spans], t), "hi": pa.array([s.end for s in spans], t)})


def arrow_filter(column: str, parts: Sequence[Part]) -> pads.Expression:
    """The rows of ``parts`` as a dataset filter: the value among the values, or in one of the
    windows' ranges (which a file's and a row group's statistics prune by)."""
    values = [p for p in parts if not isinstance(p, Span)]
    field = pads.field(column)
    terms = [field.isin(values)] if values else []
    for span in (p for p in parts if isinstance(p, Span)):
        t = bound_type(span.start)
        terms.append((field >= pa.scalar(span.start, t)) & (field < pa.scalar(span.end, t)))
    if not terms:
        return pads.scalar(False)
    return functools.reduce(operator.or_, terms)


def _as_file_holds(span: Span, field: pa.Field) -> Span | None:
    """``span`` with its bounds as the file's column holds them: a file's time stamp without a
    zone (INT96, or Spark's without ``isAdjustedToUTC``) read as UTC where the bound is an
    instant; None where the file cannot be compared (another type: its rows are read)."""
    bound = bound_type(span.start)
    if field.type == bound:
        return span
    if pa.types.is_timestamp(field.type) and pa.types.is_timestamp(bound):
        if field.type.tz is None and bound.tz is not None:
            def naive(b: dt.datetime) -> dt.datetime:
                return b.astimezone(dt.timezone.utc).replace(tzinfo=None)
            return Span(naive(span.start), naive(span.end), span.label)  # type: ignore[arg-type]
        if (field.type.tz is None) == (bound.tz is None):
            return span  # another unit only
    return None


def window_files(column: str, spans: Sequence[Span], paths: Sequence[str]) -> dict[str, list[str]]:
    """Per window, the Parquet files among ``paths`` with a row group whose statistics of
    ``column`` can hold one of its rows (read from each file's footer, no row read); a file
    without statistics of the column, or holding it as another type, is kept for every window."""
    found: dict[str, list[str]] = {s.label: [] for s in spans}
    fmt, local = pads.ParquetFileFormat(), pafs.LocalFileSystem()
    for path in paths:
        fragment = fmt.make_fragment(path, filesystem=local)
        schema = fragment.physical_schema
        index = schema.get_field_index(column)
        for span in spans:
            held = None if index < 0 else _as_file_holds(span, schema.field(index))
            if held is None or fragment.split_by_row_group(filter=arrow_filter(column, [held]), schema=schema):
                found[span.label].append(path)
    return found
