"""Profile a source to propose a business key and a total newest-wins ordering.

A proposal comes from the data (NULL counts, how rows group under each candidate key, which
columns change within the groups, and whether each candidate ordering leaves ties), never
from column names. When no candidate is safe, it says so and proposes nothing.

The business key rule is in ``core.profile.keyrule``, the search for candidate keys in
``core.profile.keysearch``; this module profiles the columns, runs the key proposal and then the
ordering proposal under the key it chose.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from backfill_assets.core.build import open_reading_engine, refuse_unless_supported
from backfill_assets.core.catalog import ColumnInfo, partition_kind_of, windowing_of
from backfill_assets.core.errors import SpecError
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.profile.keyrule import KeyCandidate, choose
from backfill_assets.core.profile.keysearch import KEY_SAMPLE_ROWS, KeySearch, confirm, judge, search_keys, verify
from backfill_assets.core.profiling import SourceProfiler
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionRequest, PartitionValue, partition_label

# Keys are integers, strings (typcategory S), uuids (U) or date/times (D); orderings are
# date/times or integers. Floats and fractional numerics are values, not identities.
_INTEGERS = {"int2", "int4", "int8"}
# A row id (or a key with no versions) has distinct values for most rows; below this share a
# column is not tested as one, and the single-row-id fallback needs no such column to repeat.
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
    key_candidates: list[KeyCandidate] = field(default_factory=list)
    row_id_columns: list[str] = field(default_factory=list)
    key_queries: int = 0
    key_search_complete: bool = True
    key_partitions: int = 0  # partitions the candidates were measured on
    key_rows: int = 0

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
            "row_id_columns": self.row_id_columns,
            "key_candidates": [c.as_dict() for c in self.key_candidates],
            "key_search": {"queries": self.key_queries, "complete": self.key_search_complete,
                           "partitions": self.key_partitions, "rows": self.key_rows},
        }

    def notable_candidates(self, limit: int = 6) -> list[KeyCandidate]:
        """The candidates worth showing first: the proposal, its one-column-shorter parts (why
        each column is needed), the most distinct single columns (the tempting guesses), then
        the shortest candidates whose groups look most like versions."""
        proposed = [c for c in self.key_candidates if list(c.columns) == self.business_key]
        parts = [c for c in self.key_candidates if proposed and len(c.columns) == len(proposed[0].columns) - 1
                 and set(c.columns) < set(proposed[0].columns)]
        singles = sorted((c for c in self.key_candidates if len(c.columns) == 1), key=lambda c: -c.groups)[:2]
        rest = sorted((c for c in self.key_candidates if c.version_groups),
                      key=lambda c: (len(c.columns), c.spread, c.written))
        shown: list[KeyCandidate] = []
        for cand in [*proposed, *parts, *singles, *rest]:
            if cand not in shown and len(shown) < limit:
                shown.append(cand)
        return shown


def profile_spec(spec: Spec, factory: ConnectionFactory, request: PartitionRequest | None = None,
                 **limits: int) -> Profile:
    """Profile the spec's source where its build engine reads it (:func:`profile_source`), over
    the partitions ``request`` names (default: the first ones present).

    Raises:
        SpecError: the engine cannot profile its source (naming why), the source or its
            partition key does not exist.
    """
    refuse_unless_supported(spec, "profile")
    with open_reading_engine(factory, spec) as engine:  # no PostgreSQL where the engine needs none
        source = engine.profiler()
        partitions = None
        if request is not None:
            key = next((c for c in source.columns() if c.name == spec.partition_key), None)
            problems: list[str] = []
            kind = partition_kind_of(key, problems, spec) if key is not None else None
            if problems:
                raise SpecError(problems[0])
            if kind == "window":
                assert key is not None
                partitions = list(windowing_of(spec, key).request(request.text))
            else:
                partitions = request.resolve(kind or "text")
        return profile_source(source, spec, partitions, **limits)


def _ties(source: SourceProfiler, names: list[str], partition_key: str, key: list[str],
          ordering: tuple[str, ...], partitions: list[PartitionValue]) -> tuple[int, int]:
    """The NULLs in ``ordering`` and the (partition, key, ordering) groups tied under it."""
    others = [c for c in names if c not in {partition_key, *key, *ordering}]
    nulls = source.ordering_nulls(key, ordering, partitions) if ordering else 0
    return nulls, source.tied_groups(key, ordering, others, partitions)


def profile_source(source: SourceProfiler, spec: Spec, partitions: list[PartitionValue] | None,
                   *, max_partitions: int = 31, key_sample_rows: int = KEY_SAMPLE_ROWS) -> Profile:
    """Profile ``source`` (the spec's source, as its build engine reads it) over ``partitions``
    (default: its first ``max_partitions``).

    The declared business key and ordering are ignored for the proposal and tried as
    candidates like any other, so a wrong declaration shows up. The key follows the rule in
    ``core.profile.keyrule``; every candidate measured is kept with its evidence. Candidates
    are measured on the first partitions holding up to ``key_sample_rows`` rows (at least one
    partition), and the key chosen there again on all of them.

    Raises:
        SpecError: the source or its partition key does not exist.
    """
    cols = source.columns()
    if not cols:
        raise SpecError(f"source {source.name} does not exist")
    if spec.partition_key not in {c.name for c in cols}:
        raise SpecError(f"source {source.name} has no partition_key column {spec.partition_key}")
    if partitions is None:
        partitions = source.first_partitions(max_partitions)
    counts = source.partition_counts(partitions)
    row_count = sum(counts.values())
    stats = []
    for c in cols:
        if c.name == spec.partition_key:
            continue
        nulls, distinct = source.column_profile(c.name, partitions)
        stats.append(ColumnStats(c.name, c.type_name, nulls, distinct))
    profile = Profile(source.name, [partition_label(p) for p in partitions], row_count, stats, None, "")
    if row_count == 0:
        profile.key_reason = "the source has no rows in these partitions; nothing to profile"
        return profile
    chosen = _propose_key(profile, source, spec, cols, [(p, counts[p]) for p in partitions if p in counts],
                          key_sample_rows)
    if chosen is None:
        profile.ordering_reason = "none tried: an ordering is proposed for a business key"
        return profile
    profile.business_key = list(chosen)
    _propose_ordering(profile, source, spec, cols, list(chosen), partitions)
    return profile


def _propose_key(profile: Profile, source: SourceProfiler, spec: Spec, cols: list[ColumnInfo],
                 counts: list[tuple[PartitionValue, int]], sample_rows: int) -> tuple[str, ...] | None:
    """Search, judge and choose a business key; fill the profile's key fields."""
    by_name = {c.name: c for c in cols}
    names = [c.name for c in cols]
    distinct_enough = {
        s.name for s in profile.columns
        if s.distinct_per_partition >= MIN_KEY_DISTINCT_SHARE * max(profile.row_count - s.null_count, 1)
    }
    row_ids = [
        s.name for s in profile.columns
        if s.name in distinct_enough and _key_type(by_name[s.name])
        and _ties(source, names, spec.partition_key, [s.name], (), [p for p, _ in counts])[1] == 0
    ]
    profile.row_id_columns = row_ids
    # A column can tell groups apart only if it takes several values (or NULL and a value) in
    # some partition.
    variety = {s.name for s in profile.columns if s.distinct_per_partition + (s.null_count > 0) > len(counts)}
    columns = [c.name for c in cols if c.name != spec.partition_key and c.name not in row_ids]
    times = {c for c in columns if _is_time(by_name[c])}
    # Whole partitions, in order, up to sample_rows rows: groups never straddle partitions.
    sample = [counts[0]]
    for p, n in counts[1:]:
        if sum(m for _, m in sample) + n > sample_rows:
            break
        sample.append((p, n))
    search = KeySearch(source, [p for p, _ in sample], sum(n for _, n in sample), columns)
    search_keys(search, [c for c in columns if _key_type(by_name[c]) and c in variety],
                 {s.name: s.distinct_per_partition for s in profile.columns}, times)
    judge(search, variety, times)
    confirm(search, [c for c in columns if _key_type(by_name[c]) and c in variety], variety, times)
    candidates = list(search.found.values())
    # Versions are seen when a distinct-enough single column repeats, or a candidate meets
    # rules 1 and 2: then a row id is no key.
    repeating = any(c.versions_seen or (c.version_groups and c.columns[0] in distinct_enough and len(c.columns) == 1)
                    for c in candidates)
    chosen, profile.key_reason = choose(candidates, row_ids, repeating, search.complete)
    if chosen is not None and chosen in {c.columns for c in candidates} and len(sample) < len(counts):
        full = KeySearch(source, [p for p, _ in counts], profile.row_count, columns)
        chosen, profile.key_reason = verify(full, candidates, chosen, row_ids, variety, times)
        search.queries += full.queries
    profile.key_candidates = sorted(candidates, key=lambda c: (not c.safe, c.written, len(c.columns), c.columns))
    profile.key_queries, profile.key_search_complete = search.queries, search.complete
    profile.key_partitions, profile.key_rows = len(sample), search.row_count
    return chosen


def _propose_ordering(profile: Profile, source: SourceProfiler, spec: Spec, cols: list[ColumnInfo],
                      key: list[str], partitions: list[PartitionValue]) -> None:
    """Try date/time and integer orderings, alone or in pairs, for totality under ``key``."""
    by_name = {c.name: c for c in cols}
    ordering_cols = sorted(
        (c for c in cols if _ordering_type(c) and c.name not in {spec.partition_key, *key}),
        key=lambda c: (not _is_time(c), c.name),
    )[:MAX_ORDERING_CANDIDATES]
    trials = [(c.name,) for c in ordering_cols]
    trials += [(a.name, b.name) for a, b in itertools.permutations(ordering_cols, 2) if not _is_time(b) or _is_time(a)]
    for trial in trials:
        nulls, ties = _ties(source, [c.name for c in cols], spec.partition_key, key, trial, partitions)
        profile.orderings.append(OrderingTrial(trial, nulls, ties))
    total = [t for t in profile.orderings if t.total]
    # "Newest" is a time when there is one: prefer a total ordering led by a date/time column.
    timed = [t for t in total if _is_time(by_name[t.columns[0]])]
    chosen = (timed or total or [None])[0]
    if chosen is None:
        profile.ordering_reason = (
            "no candidate ordering (date/time and integer columns, alone or in pairs) is "
            "total for this key; add a tiebreak column such as an ingest sequence to the source"
        )
        return
    profile.ordering = list(chosen.columns)
    lead = next((t for t in profile.orderings if t.columns == chosen.columns[:1]), None)
    profile.ordering_reason = f"ordering by {', '.join(chosen.columns)} (newest first) leaves no ties and no NULLs"
    if len(chosen.columns) > 1 and lead is not None:
        profile.ordering_reason += (
            f"; {chosen.columns[0]} alone leaves {lead.tied_keys} tied key(s) and "
            f"{lead.null_count} NULL(s), which {chosen.columns[1]} breaks"
        )


def _key_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or c.category in {"S", "U", "D"}


def _ordering_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or _is_time(c)


def _is_time(c: ColumnInfo) -> bool:
    return c.category == "D"
