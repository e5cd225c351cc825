"""The PostgreSQL engine's answers to ``profile`` (core.profiling), in SQL on the
spec's own server (core.pg.sqlbuild's profiling and check statements)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import psycopg

from backfill_assets.core.catalog import ColumnInfo, windowing_of
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.profiling import first_windows
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionValue


class PostgresProfiler:
    """The spec's PostgreSQL source table, profiled on ``conn`` (core.profiling.SourceProfiler)."""

    def __init__(self, conn: psycopg.Connection, spec: Spec) -> None:
        self.conn, self.spec, self.src = conn, spec, spec.source_ref
        self.name = str(self.src)

    def columns(self) -> list[ColumnInfo]:
        return table_columns(self.conn, self.src)

    @functools.cached_property
    def by(self) -> sqlbuild.PartitionBy:
        """Which partition a source row is in: its value, or its window (of the source's column)."""
        column = next((c for c in self.columns() if c.name == self.spec.partition_key), None)
        if self.spec.partition_window is None or column is None:
            return sqlbuild.ValuesBy(self.spec.partition_key)
        return sqlbuild.WindowsBy(self.spec.partition_key, windowing_of(self.spec, column))

    def first_partitions(self, limit: int) -> list[PartitionValue]:
        by = self.by
        if isinstance(by, sqlbuild.WindowsBy):
            return self._first_windows(by, limit)
        query, params = sqlbuild.distinct_partitions(self.src, self.spec.partition_key, limit)
        return [r[0] for r in self.conn.execute(query, params).fetchall()]

    def _first_windows(self, by: sqlbuild.WindowsBy, limit: int) -> list[PartitionValue]:
        """The first ``limit`` windows holding rows, each next few counted by their ranges
        (which an index serves): core.profiling.first_windows."""
        first, last = self.conn.execute(*sqlbuild.column_range(self.src, by.column)).fetchone() or (None, None)
        return first_windows(by.windowing, first, last, self.partition_counts, limit)

    def partition_counts(self, partitions: Sequence[PartitionValue]) -> dict[PartitionValue, int]:
        query, params = sqlbuild.partition_counts(self.src, self.by, list(partitions))
        return {p: int(n) for p, n in self.conn.execute(query, params).fetchall()}

    def column_profile(self, column: str, partitions: Sequence[PartitionValue]) -> tuple[int, int]:
        query, params = sqlbuild.column_profile(self.src, self.by, column, list(partitions))
        nulls, distinct = self.conn.execute(query, params).fetchone() or (0, 0)
        return int(nulls), int(distinct)

    def key_evidence(self, key: Sequence[str], others: Sequence[str],
                     partitions: Sequence[PartitionValue]) -> tuple[int, ...]:
        query, params = sqlbuild.key_evidence(self.src, self.by, key, others, list(partitions))
        return tuple(int(v) for v in self.conn.execute(query, params).fetchall()[0])

    def key_splits(self, key: Sequence[str], split: Sequence[str], others: Sequence[str],
                   partitions: Sequence[PartitionValue]) -> list[tuple[int, int]]:
        query, params = sqlbuild.key_splits(self.src, self.by, key, split, others, list(partitions))
        return [(int(i), int(n)) for i, n in self.conn.execute(query, params).fetchall()]

    def _input(self) -> object:
        names = [c.name for c in self.columns()]
        return sqlbuild.input_relation(self.src, names, self.by, names, None, filtered=True)

    def ordering_nulls(self, key: Sequence[str], ordering: Sequence[str], partitions: Sequence[PartitionValue]) -> int:
        query, params = sqlbuild.ordering_null_counts(self._input(), list(key), list(ordering),  # type: ignore[arg-type]
                                                      self.by.bind(partitions))
        return sum(int(n) for n in (self.conn.execute(query, params).fetchone() or ()))

    def tied_groups(self, key: Sequence[str], ordering: Sequence[str], others: Sequence[str],
                    partitions: Sequence[PartitionValue]) -> int:
        query, params = sqlbuild.ordering_ties(self._input(), self.by, list(key),  # type: ignore[arg-type]
                                               list(ordering), list(others), self.by.bind(partitions))
        rows = self.conn.execute(query, params).fetchall()
        return int(rows[0][-1]) if rows else 0
