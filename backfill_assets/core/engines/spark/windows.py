"""Time windows on the Spark engine (core.windows): a window is a partition like a value, read
by a column of its own. The rows of the windows asked for are kept by a range join of the
partition key with the windows (a small broadcast table of label, start and end: the calendar is
core.windows', never Spark's time zone data), the transform runs on them, and each row of its
output is labelled by its window in :func:`key_column`, which the JDBC copy, the stages and a
Parquet folder target are partitioned by (a folder per window, ``created_at_hour=2024-11-03T01%3A00-0400``,
whose files keep the time stamp itself) and every count, check, fingerprint and comparison groups
by, as by a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.core.context import Context
from backfill_assets.core.lake.parts import Span, span_of
from backfill_assets.core.spec import Spec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_LO, _HI = "__backfill_lo", "__backfill_hi"


def key_column(spec: Spec) -> str:
    """The column a partition is read by: the partition key, or for time windows the window's
    label, named after the key and the grain (``created_at_hour``)."""
    window = spec.partition_window
    return spec.partition_key if window is None else f"{spec.partition_key}_{window.every}"


def label_columns(spec: Spec) -> list[str]:
    """The columns a row carries beside the spec's: for time windows, its window's label."""
    key = key_column(spec)
    return [] if key == spec.partition_key else [key]


def spans(ctx: Context, labels: Sequence[str] | None = None) -> list[Span]:
    """The windows ``labels`` (default: the context's) with their bounds as the column holds them."""
    assert ctx.windowing is not None
    return [span_of(ctx.windowing, label) for label in (ctx.labels if labels is None else labels)]


def windows_frame(session: SparkSession, windows: Sequence[Span], key: str) -> DataFrame:
    """The windows as a small DataFrame (``key``: the label, and the bounds), made in the driver."""
    import datetime as dt

    from pyspark.sql.types import DateType, StringType, StructField, StructType, TimestampType
    bound = TimestampType() if windows and isinstance(windows[0].start, dt.datetime) else DateType()
    schema = StructType([StructField(key, StringType(), False), StructField(_LO, bound, False),
                         StructField(_HI, bound, False)])
    return session.createDataFrame([(w.label, w.start, w.end) for w in windows], schema)


def _in(column: str) -> Any:
    """A row's ``column`` in the window joined with it: at or after its start, before its end."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
    return (F.col(column) >= F.col(_LO)) & (F.col(column) < F.col(_HI))


def restricted(frame: DataFrame, column: str, windows: DataFrame) -> DataFrame:
    """The rows of ``frame`` whose ``column`` lies in one of ``windows``."""
    from pyspark.sql import functions as F  # noqa: N812
    return frame.join(F.broadcast(windows), _in(column), "left_semi")


def labelled(frame: DataFrame, column: str, windows: DataFrame) -> DataFrame:
    """``frame`` with each row's window label (NULL outside ``windows``)."""
    from pyspark.sql import functions as F  # noqa: N812
    return frame.join(F.broadcast(windows), _in(column), "left").drop(_LO, _HI)


def outside(frame: DataFrame, column: str, windows: DataFrame) -> DataFrame:
    """The rows of ``frame`` whose ``column`` lies in none of ``windows`` (a NULL one included)."""
    from pyspark.sql import functions as F  # noqa: N812
    return frame.join(F.broadcast(windows), _in(column), "left_anti")


def collectable(frame: DataFrame, column: str) -> Any:
    """``column`` as the driver can read it exactly: a ``timestamp`` (an instant) as its
    microseconds since the epoch (PySpark would make it a clock reading in the driver's own
    zone), anything else as it is (a ``timestamp_ntz`` is a clock reading already)."""
    from pyspark.sql import functions as F  # noqa: N812
    kind = dict(frame.dtypes)[column]
    return F.unix_micros(F.col(column)) if kind == "timestamp" else F.col(column)


def collected(value: Any, micros: bool) -> Any:
    """A value :func:`collectable` gave back as the column's value (an instant in UTC)."""
    import datetime as dt
    if micros and value is not None:
        return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=value)
    return value
