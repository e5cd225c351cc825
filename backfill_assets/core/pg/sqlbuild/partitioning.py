"""Which partition a row is in, in SQL: a value of the partition key (:class:`ValuesBy`), or
a time window of it (:class:`WindowsBy`, core.windows).

Every statement that reads some partitions asks the spec's :class:`PartitionBy` for the
predicate that keeps their rows (``among``, ``at``), the expression that tells a row's
partition apart (``key``: the value itself, or the number of the window's bucket, cheap to
group and sort by), the partition's name for a grouped key (``name``: the value, or the
window's label) and the parameters those need (``bind``, ``bind_one``), so that it is written
once for both kinds. A window's rows are a range of the column (``>= start AND < end``), which
its index serves; the bucket of each row comes from ``width_bucket`` over the windows' bounds,
bound as parameters, so the calendar is core.windows' alone, never the server's time zone data.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg import sql

from backfill_assets.core.windows import Windowing


class PartitionBy(Protocol):
    """How rows fall into partitions, as SQL over a relation aliased ``alias`` (None: the
    column unqualified, for a DELETE's own table). ``param`` names the statement parameter
    that holds the partitions (``bind``) or the one partition (``bind_one``)."""

    column: str

    def key(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        """What tells the partition of a row among ``%(param)s`` apart (a row ``among`` keeps):
        group, sort and join by it."""
        ...

    def name(self, key: sql.Composable, param: str = "partitions") -> sql.Composable:
        """The partition's value or label, from its ``key`` (grouped by, or carried as a column)."""
        ...

    def value(self, column: sql.Composable) -> sql.Composable:
        """A row's partition column as the caller places it in a partition: a value
        partition's text; a window's column value, which core.windows places (rows outside
        any bound window, such as a moved key's other versions)."""
        ...

    def among(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        """Whether a row is in one of the partitions ``%(param)s``."""
        ...

    def at(self, alias: str | None, param: str = "partition") -> sql.Composable:
        """Whether a row is in the partition ``%(param)s``."""
        ...

    def bind(self, partitions: Sequence[object], param: str = "partitions") -> dict[str, Any]:
        """The parameters ``key`` and ``among`` read for ``partitions``."""
        ...

    def bind_one(self, partition: object, param: str = "partition") -> dict[str, Any]:
        """The parameters ``at`` reads for ``partition``."""
        ...


def _column(alias: str | None, column: str) -> sql.Identifier:
    return sql.Identifier(column) if alias is None else sql.Identifier(alias, column)


@dataclass(frozen=True)
class ValuesBy:
    """Each value of ``column`` is a partition."""

    column: str

    def key(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        return _column(alias, self.column)

    def name(self, key: sql.Composable, param: str = "partitions") -> sql.Composable:
        return key

    def value(self, column: sql.Composable) -> sql.Composable:
        return sql.SQL("{}::text").format(column)

    def among(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        return sql.SQL("{} = ANY({})").format(_column(alias, self.column), sql.Placeholder(param))

    def at(self, alias: str | None, param: str = "partition") -> sql.Composable:
        return sql.SQL("{} = {}").format(_column(alias, self.column), sql.Placeholder(param))

    def bind(self, partitions: Sequence[object], param: str = "partitions") -> dict[str, Any]:
        return {param: list(partitions)}

    def bind_one(self, partition: object, param: str = "partition") -> dict[str, Any]:
        return {param: partition}


_TYPES = {"timestamptz": sql.SQL("timestamptz"), "timestamp": sql.SQL("timestamp"), "date": sql.SQL("date")}
_RANGE = sql.SQL("({c} >= {lo}::{t} AND {c} < {hi}::{t})")
_BUCKET = sql.SQL("width_bucket({c}, {bounds}::{t}[])")
_LABEL = sql.SQL("({labels}::text[])[{key}]")


@dataclass(frozen=True)
class WindowsBy:
    """Each window of ``windowing`` over ``column`` is a partition, named by its label."""

    column: str
    windowing: Windowing

    def _p(self, param: str, part: str) -> sql.Placeholder:
        return sql.Placeholder(f"{param}__{part}")

    def _range(self, alias: str | None, param: str) -> sql.Composed:
        return _RANGE.format(c=_column(alias, self.column), lo=self._p(param, "lo"), hi=self._p(param, "hi"),
                             t=_TYPES[self.windowing.column_kind])

    def key(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        return _BUCKET.format(c=_column(alias, self.column), bounds=self._p(param, "bounds"),
                              t=_TYPES[self.windowing.column_kind])

    def name(self, key: sql.Composable, param: str = "partitions") -> sql.Composable:
        return _LABEL.format(labels=self._p(param, "labels"), key=key)

    def value(self, column: sql.Composable) -> sql.Composable:
        return column

    def among(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        # The range first, which an index serves; the bucket drops rows in a gap between windows,
        # and is not looked up at all for windows without gaps (a custom plan folds the flag).
        return sql.SQL("({} AND ({}::boolean OR {} IS NOT NULL))").format(
            self._range(alias, param), self._p(param, "gapless"), self.name(self.key(alias, param), param))

    def at(self, alias: str | None, param: str = "partition") -> sql.Composable:
        return self._range(alias, param)

    def bind(self, partitions: Sequence[object], param: str = "partitions") -> dict[str, Any]:
        labels = [str(p) for p in partitions]
        if not labels:  # nothing: an empty range, and one bucket that names no window
            least = self.windowing.bound(dt.datetime(1, 1, 2, tzinfo=dt.timezone.utc))
            return {param: [], f"{param}__lo": least, f"{param}__hi": least, f"{param}__labels": [None],
                    f"{param}__bounds": [least], f"{param}__gapless": True}
        bounds, names = self.windowing.buckets(labels)
        return {param: labels, f"{param}__lo": bounds[0], f"{param}__hi": bounds[-1],
                f"{param}__labels": names, f"{param}__bounds": bounds, f"{param}__gapless": None not in names[:-1]}

    def bind_one(self, partition: object, param: str = "partition") -> dict[str, Any]:
        window = self.windowing.window(str(partition))
        return {param: window.label, f"{param}__lo": self.windowing.bound(window.start),
                f"{param}__hi": self.windowing.bound(window.end)}


_WIDE = sql.SQL("({c} >= {lo}::{t} - {before}::interval AND {c} < {hi}::{t} + {after}::interval)")


@dataclass(frozen=True)
class WidenedBy:
    """The windows of ``windows`` widened by ``before`` and ``after`` (an input whose rows can
    lie before or after a partition's own window): the rows of the windows' whole range, so
    widened; read by ``among`` alone (an input's rows are only ever kept, never grouped)."""

    windows: WindowsBy
    before: dt.timedelta
    after: dt.timedelta

    @property
    def column(self) -> str:
        return self.windows.column

    def among(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        w = self.windows
        # In seconds: an interval of days moves a timestamptz by the session zone's calendar
        # (23 or 25 hours across a clock change), one of seconds by exactly that long.
        return _WIDE.format(c=_column(alias, w.column), lo=w._p(param, "lo"), hi=w._p(param, "hi"),
                            t=_TYPES[w.windowing.column_kind],
                            before=sql.Literal(f"{self.before.total_seconds():.6f} seconds"),
                            after=sql.Literal(f"{self.after.total_seconds():.6f} seconds"))


@dataclass(frozen=True)
class WholeBy:
    """Every row of the relation is the one partition asked for: a table that holds a single
    partition's rows already (a lake window's rows rendered as text, whose column's text is
    not the window's label)."""

    column: str

    def key(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        return sql.Placeholder(param)

    def name(self, key: sql.Composable, param: str = "partitions") -> sql.Composable:
        return key

    def value(self, column: sql.Composable) -> sql.Composable:
        return column

    def among(self, alias: str | None, param: str = "partitions") -> sql.Composable:
        return sql.SQL("true")

    def at(self, alias: str | None, param: str = "partition") -> sql.Composable:
        return sql.SQL("true")

    def bind(self, partitions: Sequence[object], param: str = "partitions") -> dict[str, Any]:
        return {param: str(partitions[0]) if partitions else None}

    def bind_one(self, partition: object, param: str = "partition") -> dict[str, Any]:
        return {}


def as_by(by: PartitionBy | str) -> PartitionBy:
    """``by``, or the value partitions of the column it names (the simple case, spelled as
    the partition key's name)."""
    return ValuesBy(by) if isinstance(by, str) else by
