"""What ``profile`` asks of a source, wherever it lives: each build engine answers the same
questions in its own engine (the PostgreSQL engine in SQL on its server, the DuckDB engine in
DuckDB over the lake's newest version, the Spark engine in Spark), and the proposal
(core.profile.propose) is made from the answers alone, so the same rows give the same profile
on every engine.

Every answer is about the rows of ``partitions`` only. Values are compared as each engine's
text forms of them (by a 64-bit hash where a query says so; a NULL apart from every value), and
a row with a NULL in a candidate key is left out of that candidate's groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.vocabulary import PartitionValue
from backfill_assets.core.windows import Bound, Windowing

# At most this many counts look for the first windows holding rows (profile's sample).
WINDOW_SCANS = 20


def first_windows(windowing: Windowing, first: Bound | None, last: Bound | None,
                  counts: Callable[[list[str]], dict], limit: int) -> list[PartitionValue]:
    """The first ``limit`` windows holding rows, for a column whose least and greatest values
    are ``first`` and ``last``: from the window of the earliest value, ``counts`` (label ->
    rows) of each next ``limit`` windows, up to the latest value or :data:`WINDOW_SCANS` counts."""
    if first is None or last is None:
        return []
    window, found = windowing.window(windowing.label_at(first)), []
    end = windowing.window(windowing.label_at(last)).end
    for _ in range(WINDOW_SCANS):
        windows = []
        while window.start < end and len(windows) < limit:
            windows.append(window)
            window = windowing.at(window.end)
        if not windows:
            break
        found_now = counts([w.label for w in windows])
        found += [w.label for w in windows if found_now.get(w.label)]
        if len(found) >= limit:
            break
    return found[:limit]


class SourceProfiler(Protocol):
    """A source to profile, read-only (see the module docstring)."""

    # What the profile names as its table.
    name: str

    def columns(self) -> list[ColumnInfo]:
        """The source's columns, in order (empty: there is no such source)."""
        ...

    def first_partitions(self, limit: int) -> list[PartitionValue]:
        """The first ``limit`` partition values present, in order (no NULL)."""
        ...

    def partition_counts(self, partitions: Sequence[PartitionValue]) -> dict[PartitionValue, int]:
        """The rows of each partition that has any."""
        ...

    def column_profile(self, column: str, partitions: Sequence[PartitionValue]) -> tuple[int, int]:
        """A column's NULL count, and its distinct (partition, value) pairs among non-NULL values."""
        ...

    def key_evidence(self, key: Sequence[str], others: Sequence[str],
                     partitions: Sequence[PartitionValue]) -> tuple[int, ...]:
        """How the rows group by (partition, ``key``): groups, rows, groups of several rows,
        groups in which some column of ``others`` varies, then per column of ``others`` the
        groups in which it varies (its values' hashes differ, or it is NULL in some rows only)."""
        ...

    def key_splits(self, key: Sequence[str], split: Sequence[str], others: Sequence[str],
                   partitions: Sequence[PartitionValue]) -> list[tuple[int, int]]:
        """(index in ``split``, groups) for each column of ``split`` that divides some
        (partition, ``key``) groups into two or more parts each holding rows that differ in
        ``others`` (by a hash of their text forms), with the number of such groups."""
        ...

    def ordering_nulls(self, key: Sequence[str], ordering: Sequence[str], partitions: Sequence[PartitionValue]) -> int:
        """The NULLs in the ``ordering`` columns of the rows whose ``key`` has no NULL."""
        ...

    def tied_groups(self, key: Sequence[str], ordering: Sequence[str], others: Sequence[str],
                    partitions: Sequence[PartitionValue]) -> int:
        """The (partition, ``key``, ``ordering``) groups whose rows differ in ``others`` (by
        their text forms): ties that newest-wins by ``ordering`` would break by chance."""
        ...
