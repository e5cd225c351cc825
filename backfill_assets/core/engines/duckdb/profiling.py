"""The DuckDB engine's answers to ``profile`` (core.profiling): the lake source's newest
version read by DuckDB in memory (nothing pinned, nothing written, the spec's DuckDB file not
opened), each question one statement filtered to the profiled partitions, which DuckDB pushes
down to the lake's files.

The questions are PostgreSQL's (core.pg.sqlbuild.profiling and checks) in DuckDB's SQL: a
value's text form is ``CAST(... AS VARCHAR)``, hashed by DuckDB's 64-bit ``hash``, a NULL as 0;
distinct values are DuckDB's (typed, as PostgreSQL's DISTINCT). Statements are composed with
psycopg.sql and rendered to text without a PostgreSQL connection; the partitions are the named
parameter ``$partitions``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo, windowing_of
from backfill_assets.core.duck import connect
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.lake.parts import span_of, spans_table
from backfill_assets.core.pinned.duck_types import column_info, source_types
from backfill_assets.core.pinned.source import SOURCE_ROWS, WINDOWS, LakeSource
from backfill_assets.core.profiling import first_windows
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionValue

_SRC = sql.Identifier(SOURCE_ROWS)
_IN = sql.SQL("{} IN (SELECT unnest($partitions))")
_TEXT_HASH = sql.SQL("CASE WHEN {c} IS NULL THEN 0 ELSE hash(CAST({c} AS VARCHAR)) END")


def _ids(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) for n in names)


def _rows_hash(names: Sequence[str]) -> sql.Composable:
    """A 64-bit hash of the text forms of ``names`` (a NULL apart from every text)."""
    if not names:
        return sql.SQL("0")
    return sql.SQL("hash([{}])").format(sql.SQL(", ").join(
        sql.SQL("CAST({} AS VARCHAR)").format(sql.Identifier(n)) for n in names))


def _keyed(partition_key: str, key: Sequence[str]) -> sql.Composed:
    """The profiled partitions' rows whose ``key`` has no NULL."""
    return sql.SQL(" AND ").join([_IN.format(sql.Identifier(partition_key)),
                                  *(sql.SQL("{} IS NOT NULL").format(sql.Identifier(k)) for k in key)])


def _text(composed: sql.Composable) -> str:
    return composed.as_string(None)


class DuckProfiler:
    """The spec's lake source at its newest version, profiled in DuckDB
    (core.profiling.SourceProfiler)."""

    def __init__(self, spec: Spec, source: LakeSource) -> None:
        config = {k: v for k, v in (("memory_limit", spec.engine.memory_limit), ("threads", spec.engine.threads))
                  if v is not None}
        self.spec, self.name = spec, source.name
        self.duck = connect(config={k: str(v).replace(" ", "") for k, v in config.items()})
        source.attach_newest(self.duck)
        types = source_types(self.duck)
        self._columns = [column_info(n, t) or ColumnInfo(n, t.lower(), "X", False, t.lower()) for n, t in types]
        # Time windows: rows are read with their window's label (of the windows asked about,
        # registered by _all), which every question groups and filters by as by a key's value.
        key = next((c for c in self._columns if c.name == spec.partition_key), None)
        self._windowing = None if spec.partition_window is None or key is None else windowing_of(spec, key)
        self._pk = spec.partition_key if self._windowing is None else statements.WINDOW
        self._src: sql.Composable = _SRC if self._windowing is None else statements.labelled(
            _SRC, spec.partition_key, [n for n, _ in types])

    def close(self) -> None:
        self.duck.close()

    def _all(self, statement: sql.Composable, partitions: Sequence[PartitionValue] | None = None) -> list[tuple]:
        params: dict[str, Any] = {} if partitions is None else {"partitions": list(partitions)}
        if partitions is not None and self._windowing is not None:
            self.duck.register(WINDOWS, spans_table([span_of(self._windowing, str(p)) for p in partitions]))
        return self.duck.execute(_text(statement), params).fetchall()

    def columns(self) -> list[ColumnInfo]:
        return list(self._columns)

    def first_partitions(self, limit: int) -> list[PartitionValue]:
        if self._windowing is not None:
            pk = sql.Identifier(self.spec.partition_key)
            ((first, last),) = self._all(sql.SQL("SELECT min({pk}), max({pk}) FROM {src}").format(pk=pk, src=_SRC))
            return first_windows(self._windowing, first, last, self.partition_counts, limit)
        pk = sql.Identifier(self.spec.partition_key)
        return [r[0] for r in self._all(sql.SQL("SELECT DISTINCT {pk} FROM {src} WHERE {pk} IS NOT NULL "
                                                 "ORDER BY {pk} LIMIT {n}").format(pk=pk, src=_SRC, n=sql.Literal(limit)))]

    def partition_counts(self, partitions: Sequence[PartitionValue]) -> dict[PartitionValue, int]:
        pk = sql.Identifier(self._pk)
        found = self._all(sql.SQL("SELECT {pk}, count(*) FROM {src} WHERE {inside} GROUP BY {pk}").format(
            pk=pk, src=self._src, inside=_IN.format(pk)), partitions)
        return {p: int(n) for p, n in found}

    def column_profile(self, column: str, partitions: Sequence[PartitionValue]) -> tuple[int, int]:
        pk, c = sql.Identifier(self._pk), sql.Identifier(column)
        ((nulls, distinct),) = self._all(sql.SQL(
            "SELECT (SELECT count(*) FROM {src} WHERE {inside} AND {c} IS NULL), "
            "(SELECT count(*) FROM (SELECT DISTINCT {pk}, {c} FROM {src} WHERE {inside} AND {c} IS NOT NULL))").format(
            src=self._src, inside=_IN.format(pk), pk=pk, c=c), partitions)
        return int(nulls), int(distinct)

    def key_evidence(self, key: Sequence[str], others: Sequence[str],
                     partitions: Sequence[PartitionValue]) -> tuple[int, ...]:
        grain = _ids([self._pk, *key])
        flags = [sql.Identifier(f"__v{i}") for i in range(len(others))]
        hashes = sql.SQL("").join(sql.SQL(", {} AS {}").format(_TEXT_HASH.format(c=sql.Identifier(c)), a)
                                  for c, a in zip(others, flags))
        varies = sql.SQL("").join(sql.SQL(", min({a}) <> max({a}) AS {a}").format(a=a) for a in flags)
        varying = sql.SQL("").join(sql.SQL(", count(*) FILTER (WHERE {})").format(a) for a in flags)
        versions = sql.SQL(" OR ").join(flags) if flags else sql.SQL("false")
        ((*row,),) = self._all(sql.SQL(
            "SELECT count(*), coalesce(sum(__n), 0), count(*) FILTER (WHERE __n > 1), "
            "count(*) FILTER (WHERE {versions}){varying} FROM "
            "(SELECT {grain}, count(*) AS __n{varies} FROM (SELECT {grain}{hashes} FROM {src} WHERE {keyed}) "
            "GROUP BY {grain})").format(
            versions=versions, varying=varying, grain=grain, varies=varies, hashes=hashes, src=self._src,
            keyed=_keyed(self._pk, key)), partitions)
        return tuple(int(v) for v in row)

    def key_splits(self, key: Sequence[str], split: Sequence[str], others: Sequence[str],
                   partitions: Sequence[PartitionValue]) -> list[tuple[int, int]]:
        if not split:
            return []
        grain = _ids([self._pk, *key])
        parts = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {grain}, {i} AS __i, {value} AS __c, __h FROM r").format(
                grain=grain, i=sql.Literal(i), value=_TEXT_HASH.format(c=sql.Identifier(c)))
            for i, c in enumerate(split))
        found = self._all(sql.SQL(
            "WITH r AS MATERIALIZED (SELECT {grain}, {split_cols}, {row} AS __h FROM {src} WHERE {keyed}) "
            "SELECT __i, count(*) FROM (SELECT {grain}, __i FROM "
            "(SELECT {grain}, __i, min(__h) <> max(__h) AS __v FROM ({parts}) GROUP BY {grain}, __i, __c) "
            "GROUP BY {grain}, __i HAVING count(*) FILTER (WHERE __v) >= 2) GROUP BY __i ORDER BY __i").format(
            grain=grain, split_cols=_ids(split), row=_rows_hash(others), src=self._src,
            keyed=_keyed(self._pk, key), parts=parts), partitions)
        return [(int(i), int(n)) for i, n in found]

    def ordering_nulls(self, key: Sequence[str], ordering: Sequence[str], partitions: Sequence[PartitionValue]) -> int:
        counts = sql.SQL(" + ").join(sql.SQL("count(*) FILTER (WHERE {} IS NULL)").format(sql.Identifier(c))
                                     for c in ordering)
        ((n,),) = self._all(sql.SQL("SELECT {counts} FROM {src} WHERE {keyed}").format(
            counts=counts, src=self._src, keyed=_keyed(self._pk, key)), partitions)
        return int(n or 0)

    def tied_groups(self, key: Sequence[str], ordering: Sequence[str], others: Sequence[str],
                    partitions: Sequence[PartitionValue]) -> int:
        if not others:
            return 0  # rows equal in every other column are not a tie
        grain = _ids([self._pk, *key, *ordering])
        ((n,),) = self._all(sql.SQL(
            "SELECT count(*) FROM (SELECT {grain} FROM {src} WHERE {keyed} GROUP BY {grain} "
            "HAVING count(*) > 1 AND count(DISTINCT {row}) > 1)").format(
            grain=grain, src=self._src, keyed=_keyed(self._pk, key), row=_rows_hash(others)), partitions)
        return int(n)
