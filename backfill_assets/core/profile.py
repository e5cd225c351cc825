"""Profile a source to propose a business key and a total newest-wins ordering.

A proposal comes from the data (NULL counts, distinctness per partition, and whether each
candidate ordering leaves ties), never from column names. When nothing works, it says so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import psycopg

from backfill_assets.core import sqlbuild
from backfill_assets.core.catalog import ColumnInfo, table_columns
from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import PartitionValue, Spec, partition_label

# Keys are integers, strings (typcategory S) or uuids (U); orderings are date/times (D) or
# integers. Floats and fractional numerics are values, not identities or versions.
_INTEGERS = {"int2", "int4", "int8"}
# A business key identifies an entity with a few versions per partition, so most of its
# values are distinct; below this share it is more likely an attribute (customer, status).
MIN_KEY_DISTINCT_SHARE = 0.5
MAX_ORDERING_CANDIDATES = 6


@dataclass(frozen=True)
class ColumnStats:
    name: str
    type_name: str
    null_count: int
    distinct_per_partition: int  # distinct (partition, value) pairs among non-NULL values


@dataclass(frozen=True)
class OrderingTrial:
    columns: tuple[str, ...]
    null_count: int
    tied_keys: int

    @property
    def total(self) -> bool:
        return self.null_count == 0 and self.tied_keys == 0


@dataclass
class Profile:
    table: str
    partitions: list[str]
    row_count: int
    columns: list[ColumnStats]
    business_key: list[str] | None
    key_reason: str
    orderings: list[OrderingTrial] = field(default_factory=list)
    ordering: list[str] | None = None
    ordering_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table, "partitions": self.partitions, "row_count": self.row_count,
            "columns": [vars(c) for c in self.columns],
            "proposal": {
                "business_key": self.business_key, "key_reason": self.key_reason,
                "ordering": [{"column": c, "direction": "desc"} for c in self.ordering] if self.ordering else None,
                "ordering_reason": self.ordering_reason,
            },
            "orderings_tried": [
                {"columns": list(t.columns), "null_count": t.null_count, "tied_keys": t.tied_keys, "total": t.total}
                for t in self.orderings
            ],
        }


def _ties(conn: psycopg.Connection, spec: Spec, cols: list[ColumnInfo], key: list[str],
          ordering: tuple[str, ...], partitions: list[PartitionValue]) -> tuple[int, int]:
    src = spec.source_ref
    names = [c.name for c in cols]
    input_rel = sqlbuild.input_relation(src, names, spec.partition_key, names, None, filtered=True)
    params = {"partitions": partitions}
    query, qp = sqlbuild.ordering_null_counts(input_rel, key, list(ordering), params)
    nulls = sum(int(n) for n in (conn.execute(query, qp).fetchone() or ()))
    others = [c for c in names if c not in {spec.partition_key, *key, *ordering}]
    query, qp = sqlbuild.ordering_ties(input_rel, spec.partition_key, key, list(ordering), others, params)
    rows = conn.execute(query, qp).fetchall()
    return nulls, int(rows[0][-1]) if rows else 0


def profile_source(conn: psycopg.Connection, spec: Spec, partitions: list[PartitionValue] | None,
                   *, max_partitions: int = 31) -> Profile:
    """Profile the spec's source over ``partitions`` (default: its first ``max_partitions``).

    The declared business key and ordering are ignored for the proposal and tried as
    candidates like any other, so a wrong declaration shows up.

    Raises:
        SpecError: the source or its partition key does not exist.
    """
    src = spec.source_ref
    cols = table_columns(conn, src)
    if not cols:
        raise SpecError(f"source table {src} does not exist")
    if spec.partition_key not in {c.name for c in cols}:
        raise SpecError(f"source {src} has no partition_key column {spec.partition_key}")
    if partitions is None:
        query, params = sqlbuild.distinct_partitions(src, spec.partition_key, max_partitions)
        partitions = [r[0] for r in conn.execute(query, params).fetchall()]
    query, params = sqlbuild.partition_counts(src, spec.partition_key, partitions)
    row_count = sum(int(n) for _, n in conn.execute(query, params).fetchall())
    stats = []
    for c in cols:
        if c.name == spec.partition_key:
            continue
        query, params = sqlbuild.column_profile(src, spec.partition_key, c.name, partitions)
        nulls, distinct = conn.execute(query, params).fetchone() or (0, 0)
        stats.append(ColumnStats(c.name, c.type_name, int(nulls), int(distinct)))
    profile = Profile(str(src), [partition_label(p) for p in partitions], row_count, stats, None, "")
    if row_count == 0:
        profile.key_reason = "the source has no rows in these partitions; nothing to profile"
        return profile

    by_name = {c.name: c for c in cols}
    key_candidates = [
        s for s in stats
        if _key_type(by_name[s.name])
        and s.distinct_per_partition >= MIN_KEY_DISTINCT_SHARE * max(row_count - s.null_count, 1)
    ]
    # A key groups versions of an entity: some of its values carry several different rows.
    # A column whose every value carries one distinct row is a row id (or a key with no
    # versions); the data cannot tell which, so it is proposed only when nothing else fits.
    with_versions = []
    row_ids = []
    for cand in key_candidates:
        _, versions = _ties(conn, spec, cols, [cand.name], (), partitions)
        (with_versions if versions else row_ids).append((cand, versions))
    if with_versions:
        best, versions = max(with_versions, key=lambda cv: (cv[0].distinct_per_partition, -cv[0].null_count))
    elif len(row_ids) == 1:
        best, versions = row_ids[0]
    else:
        names = ", ".join(c.name for c, _ in row_ids) or "none"
        profile.key_reason = (
            "no single integer, text or uuid column has distinct values for at least half of "
            "the rows of each partition and several versions per value"
            + (f"; these identify every row: {names}" if row_ids else "")
            + "; declare the (composite) business_key yourself and run profile again"
        )
        return profile
    key = [best.name]
    share = best.distinct_per_partition / max(row_count - best.null_count, 1)
    profile.business_key = key
    profile.key_reason = (
        f"{best.name}: {best.distinct_per_partition} distinct values (summed over partitions) in "
        f"{row_count - best.null_count} non-NULL rows ({share:.0%}), {versions} with several "
        f"versions; {best.null_count} row(s) with a NULL key would be dropped"
    )
    if row_ids and with_versions:
        profile.key_reason += (
            f". Each value of {', '.join(c.name for c, _ in row_ids)} carries one distinct row (a row id, "
            "a tiebreak candidate rather than a key)"
        )

    ordering_cols = sorted(
        (c for c in cols if _ordering_type(c) and c.name not in {spec.partition_key, *key}),
        key=lambda c: (not _is_time(c), c.name),
    )[:MAX_ORDERING_CANDIDATES]
    trials = [(c.name,) for c in ordering_cols]
    trials += [(a.name, b.name) for a, b in itertools.permutations(ordering_cols, 2) if not _is_time(b) or _is_time(a)]
    for trial in trials:
        nulls, ties = _ties(conn, spec, cols, key, trial, partitions)
        profile.orderings.append(OrderingTrial(trial, nulls, ties))
    total = [t for t in profile.orderings if t.total]
    # "Newest" is a time when there is one: prefer a total ordering led by a date/time column.
    timed = [t for t in total if _is_time(by_name[t.columns[0]])]
    chosen = (timed or total or [None])[0]
    if chosen is not None:
        profile.ordering = list(chosen.columns)
        lead = next((t for t in profile.orderings if t.columns == chosen.columns[:1]), None)
        profile.ordering_reason = (
            f"ordering by {', '.join(chosen.columns)} (newest first) leaves no ties and no NULLs"
        )
        if len(chosen.columns) > 1 and lead is not None:
            profile.ordering_reason += (
                f"; {chosen.columns[0]} alone leaves {lead.tied_keys} tied key(s) and "
                f"{lead.null_count} NULL(s), which {chosen.columns[1]} breaks"
            )
    else:
        profile.ordering_reason = (
            "no candidate ordering (date/time and integer columns, alone or in pairs) is "
            "total for this key; add a tiebreak column such as an ingest sequence to the source"
        )
    return profile


def _key_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or c.category in {"S", "U"}


def _ordering_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or _is_time(c)


def _is_time(c: ColumnInfo) -> bool:
    return c.category == "D"
