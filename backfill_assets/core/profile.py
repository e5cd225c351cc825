"""Profile a source to propose a business key and a total newest-wins ordering.

A proposal comes from the data (NULL counts, how rows group under each candidate key, which
columns change within the groups, and whether each candidate ordering leaves ties), never
from column names. When no candidate is safe, it says so and proposes nothing.

The business key rule
---------------------
A candidate key K groups the rows per partition; rows with a NULL in K are left out (the
build drops them). Terms:

- *Row-id columns*: key-like columns none of whose values carries two different rows (an
  ingest sequence). They are tiebreaks, never key parts; rows that differ only in them are
  re-ingested copies.
- A column *varies* in a group when its text forms differ, or it is NULL in some rows only.
- A *version group* holds rows that differ in a column outside K and the row ids. A group
  of copies is harmless: whichever row wins, the result is the same.
- K' *refines* K when every column of K is in K' or never varies within K''s groups.

K is *safe* when it merges nothing but copies, or when all of these hold:

1. Identity. A column outside K varies in no version group, takes several values in a
   partition, is not a date/time (a load's timestamp is shared by different entities) and
   varies within the groups of every one-column-shorter part of K (a distance fixed by
   origin and destination stays fixed whatever the rest of the key is). Versions of one
   entity keep what identifies it; different entities sharing K differ in it. Zero
   tolerance: one merged group is a lost row.
2. Written at different times. In at least CLOCK_SHARE (half) of the version groups the rows
   differ in one date/time column outside K: versions are successive states, and rows that
   differ yet share their times were written together, like different entities of one load.
   Half, not all: a correction may keep its timestamp (the demo breaks such ties by its
   ingest sequence). When every date/time column is in K this fails; it is not checked when
   the source has no date/time column besides the partition key and the row ids.
3. No split into histories. No column c outside K and the row ids divides MIN_NESTED (2) or
   more groups into at least two parts that each still hold rows that differ. Split by a
   column that changes between versions (a status, an amount, a time), one entity's versions
   fall apart into single rows; two parts with histories of their own need c to take two
   values for two versions each, while a key that merges entities leaves several entities
   in its parts (a route split by carrier still holds several flights). Two groups, not one,
   so that a single odd entity does not reject a key; a key whose entities often flip a
   column back and forth is rejected, which is the conservative side.
4. Not merging a safe key's entities. No safe key K' (rules 1 to 4) that refines K has an
   identity column (rule 1) that varies in MIN_NESTED or more groups of K: fixed within each
   of K''s entities, it can only vary where K's groups hold several of them. This catches
   merges of a few entities that agree on every identity column of K but one (two carriers'
   flights with one number, from one airport at one time), which rules 1 and 3 cannot see.
   Judged finest first.

Rules 1 to 4 need evidence: at least MIN_VERSION_GROUPS (3) version groups, and at least
MIN_VERSION_SHARE (1%) of the groups; fewer cannot tell versions from entities.

The proposal is the safe candidate with version groups that writes the fewest rows (groups,
plus NULL-key rows dropped), then has the fewest columns: it merges the most versions while
merging no entities. Two candidates tied on both are ambiguous and nothing is proposed. When
no key-like column with distinct values for at least half of the rows shows versions and no
candidate meets rules 1 and 2, a single row-id column is proposed as before (the data shows
no versions to merge).

The search
----------
Candidates are single columns and composites of up to MAX_KEY_COLUMNS (4) key-like columns
(integers, text, uuid, date/times; not floats or fractional numerics), each measured with one
GROUP BY query over whole partitions, in order, up to KEY_SAMPLE_ROWS rows (groups never
straddle partitions). It is a beam: the MAX_SEEDS most distinct columns alone; then, per size,
the BEAM candidates whose groups look most like versions (rule 2 first, then the smallest
*spread*: the share of (version group, other column) pairs in which the column varies) are
extended by up to MAX_EXTENSIONS columns that vary within their groups, those varying in the
most groups first; a column that groups the rows exactly as an earlier one does is left out.
Then, up to CONFIRM_ROUNDS times, the one-column extensions of the coarsest safe candidate
are measured (rarest varying first: what a nearly right key lacks varies only in its merged
groups) and everything is judged again, so that a finer safe key the beam missed can reject
it by rule 4. At most MAX_KEY_QUERIES such queries (RESERVED_QUERIES of them kept for the parts
rule 1 needs and the confirmation), plus one rule 3 query per candidate meeting rules 1 and 2,
coarsest first, at most SPLIT_CHECKS per judgement (a candidate beyond them is not proposed).
A key chosen on fewer than all the profiled partitions is measured and judged (rules 1 to 3)
again on all of them before it is proposed.

Limits: a key the search never measures cannot be proposed, and a merge of entities that
agree on every identity column but a key column is seen only through the finer safe key
(rule 4); when the search does not find that key, the coarser key that merges them can be
proposed. The tests hold sources where each rule is needed. A column
derived from the key itself (a delay's delay group) counts as an identity column under rule 1;
rule 3 is what rejects such a key when its groups hold several entities.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import psycopg

from backfill_assets.core import sqlbuild
from backfill_assets.core.catalog import ColumnInfo, table_columns
from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import PartitionValue, Spec, TableRef, partition_label

# Keys are integers, strings (typcategory S), uuids (U) or date/times (D); orderings are
# date/times or integers. Floats and fractional numerics are values, not identities.
_INTEGERS = {"int2", "int4", "int8"}
# A row id (or a key with no versions) has distinct values for most rows; below this share a
# column is not tested as one, and the single-row-id fallback needs no such column to repeat.
MIN_KEY_DISTINCT_SHARE = 0.5
MAX_ORDERING_CANDIDATES = 6
MAX_KEY_COLUMNS = 4
MAX_SEEDS = 8
BEAM = 3
MAX_EXTENSIONS = 5
MAX_KEY_QUERIES = 64
RESERVED_QUERIES = 16
CONFIRM_ROUNDS = 3
KEY_SAMPLE_ROWS = 10_000
CLOCK_SHARE = 0.5
MIN_NESTED = 2
SPLIT_CHECKS = 6
MIN_VERSION_GROUPS = 3
MIN_VERSION_SHARE = 0.01
_DECLARE = ("; declare business_key yourself after checking which columns identify one entity "
            "(they must not change between its versions), then run profile again")


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
class KeyCandidate:
    """A candidate business key: how the rows group by it, and the verdict with its evidence."""

    columns: tuple[str, ...]
    rows: int  # rows with no NULL in the key
    null_key_rows: int
    groups: int  # (partition, key) groups
    multi_row_groups: int
    version_groups: int  # groups whose rows differ outside the key and the row ids
    varying: dict[str, int]  # each column outside the key and the row ids: version groups it varies in
    identity_columns: list[str] = field(default_factory=list)
    clock: str | None = None  # the date/time column that differs in the most version groups
    clock_groups: int = 0
    safe: bool = False
    versions_seen: bool = False  # rules 1 and 2 hold: its groups look like versions, before rules 3 and 4
    evidence_for: list[str] = field(default_factory=list)
    evidence_against: list[str] = field(default_factory=list)

    @property
    def written(self) -> int:
        """Rows the build would write, plus the NULL-key rows it would drop."""
        return self.groups + self.null_key_rows

    @property
    def spread(self) -> float:
        """Share of (version group, other column) pairs in which the column varies."""
        if not self.version_groups or not self.varying:
            return 0.0
        return sum(self.varying.values()) / (self.version_groups * len(self.varying))

    def clear_verdict(self) -> None:
        self.identity_columns, self.clock, self.clock_groups = [], None, 0
        self.safe, self.evidence_for, self.evidence_against = False, [], []
        self.versions_seen = False

    def reject(self, reason: str) -> None:
        self.safe = False
        self.evidence_against.append(reason)

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns), "rows": self.rows, "null_key_rows": self.null_key_rows,
            "groups": self.groups, "groups_with_several_rows": self.multi_row_groups,
            "version_groups": self.version_groups,
            "copy_groups": self.multi_row_groups - self.version_groups,
            "varying": {c: n for c, n in self.varying.items() if n}, "spread": round(self.spread, 4),
            "identity_columns": self.identity_columns,
            "clock": {"column": self.clock, "groups": self.clock_groups} if self.clock else None,
            "safe": self.safe, "for": self.evidence_for, "against": self.evidence_against,
        }


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


@dataclass
class _Search:
    """What measuring a candidate needs, the candidates measured and the queries spent."""

    conn: psycopg.Connection
    src: TableRef
    partition_key: str
    partitions: list[PartitionValue]
    row_count: int
    columns: list[str]  # every column but the partition key and the row ids, in table order
    queries: int = 0
    complete: bool = True
    found: dict[frozenset[str], KeyCandidate] = field(default_factory=dict)
    split_counts: dict[tuple[str, ...], dict[str, int]] = field(default_factory=dict)

    def measure(self, key: tuple[str, ...], *, reserve: int = 0) -> KeyCandidate | None:
        """Measure ``key`` once (None if measured already, or if fewer than ``reserve``
        queries of the budget would be left)."""
        key = tuple(c for c in self.columns if c in key)
        if frozenset(key) in self.found:
            return None
        if self.queries >= MAX_KEY_QUERIES - reserve:
            self.complete = False
            return None
        others = [c for c in self.columns if c not in key]
        query, params = sqlbuild.key_evidence(self.src, self.partition_key, key, others, self.partitions)
        row = self._fetch(query, params)[0]
        groups, rows, multi, versions = (int(v) for v in row[:4])
        varying = dict(zip(others, (int(v) for v in row[4:])))
        cand = KeyCandidate(key, rows, self.row_count - rows, groups, multi, versions, varying)
        self.found[frozenset(key)] = cand
        return cand

    def splits(self, cand: KeyCandidate, split: list[str]) -> dict[str, int]:
        """For each column of ``split``: the groups of ``cand`` it divides into two or more
        parts that each hold rows that differ."""
        if cand.columns not in self.split_counts:
            others = [c for c in self.columns if c not in cand.columns]
            query, params = sqlbuild.key_splits(
                self.src, self.partition_key, cand.columns, split, others, self.partitions
            )
            self.split_counts[cand.columns] = {split[int(i)]: int(n) for i, n in self._fetch(query, params)}
        return self.split_counts[cand.columns]

    def _fetch(self, query: Any, params: dict[str, Any]) -> list[tuple]:
        self.queries += 1
        return self.conn.execute(query, params).fetchall()


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
                   *, max_partitions: int = 31, key_sample_rows: int = KEY_SAMPLE_ROWS) -> Profile:
    """Profile the spec's source over ``partitions`` (default: its first ``max_partitions``).

    The declared business key and ordering are ignored for the proposal and tried as
    candidates like any other, so a wrong declaration shows up. The key follows the rule in
    this module's docstring; every candidate measured is kept with its evidence. Candidates
    are measured on the first partitions holding up to ``key_sample_rows`` rows (at least one
    partition), and the key chosen there again on all of them.

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
    counts = {p: int(n) for p, n in conn.execute(query, params).fetchall()}
    row_count = sum(counts.values())
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
    chosen = _propose_key(profile, conn, spec, cols, [(p, counts[p]) for p in partitions if p in counts],
                          key_sample_rows)
    if chosen is None:
        profile.ordering_reason = "none tried: an ordering is proposed for a business key"
        return profile
    profile.business_key = list(chosen)
    _propose_ordering(profile, conn, spec, cols, list(chosen), partitions)
    return profile


def _propose_key(profile: Profile, conn: psycopg.Connection, spec: Spec, cols: list[ColumnInfo],
                 counts: list[tuple[PartitionValue, int]], sample_rows: int) -> tuple[str, ...] | None:
    """Search, judge and choose a business key; fill the profile's key fields."""
    by_name = {c.name: c for c in cols}
    distinct_enough = {
        s.name for s in profile.columns
        if s.distinct_per_partition >= MIN_KEY_DISTINCT_SHARE * max(profile.row_count - s.null_count, 1)
    }
    row_ids = [
        s.name for s in profile.columns
        if s.name in distinct_enough and _key_type(by_name[s.name])
        and _ties(conn, spec, cols, [s.name], (), [p for p, _ in counts])[1] == 0
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
    search = _Search(conn, spec.source_ref, spec.partition_key, [p for p, _ in sample],
                     sum(n for _, n in sample), columns)
    _search_keys(search, [c for c in columns if _key_type(by_name[c]) and c in variety],
                 {s.name: s.distinct_per_partition for s in profile.columns}, times)
    _judge(search, variety, times)
    _confirm(search, [c for c in columns if _key_type(by_name[c]) and c in variety], variety, times)
    candidates = list(search.found.values())
    # Versions are seen when a distinct-enough single column repeats, or a candidate meets
    # rules 1 and 2: then a row id is no key.
    repeating = any(c.versions_seen or (c.version_groups and c.columns[0] in distinct_enough and len(c.columns) == 1)
                    for c in candidates)
    chosen, profile.key_reason = _choose(candidates, row_ids, repeating, search.complete)
    if chosen is not None and chosen in {c.columns for c in candidates} and len(sample) < len(counts):
        full = _Search(conn, spec.source_ref, spec.partition_key, [p for p, _ in counts], profile.row_count, columns)
        chosen, profile.key_reason = _verify(full, candidates, chosen, row_ids, variety, times)
        search.queries += full.queries
    profile.key_candidates = sorted(candidates, key=lambda c: (not c.safe, c.written, len(c.columns), c.columns))
    profile.key_queries, profile.key_search_complete = search.queries, search.complete
    profile.key_partitions, profile.key_rows = len(sample), search.row_count
    return chosen


def _search_keys(search: _Search, pool: list[str], distinct: dict[str, int], times: set[str]) -> None:
    """Measure single columns, then extend the candidates whose groups look most like
    versions: mostly written at different times (rule 2), then with the smallest spread."""

    def rank(cand: KeyCandidate) -> tuple:
        clock = max((n for x, n in cand.varying.items() if x in times), default=cand.version_groups)
        return clock < CLOCK_SHARE * cand.version_groups, cand.spread, cand.written

    seeds = sorted(pool, key=lambda c: -distinct[c])[:MAX_SEEDS]
    level = [c for c in (search.measure((s,), reserve=RESERVED_QUERIES) for s in seeds) if c is not None]
    # A column that groups the rows exactly as an earlier one does (a copy, a timestamp shifted
    # by a constant) would only repeat that column's candidates.
    singles = {c.columns[0]: c for c in level}
    pool = [c for c in pool if not any(
        o in singles and c in singles and pool.index(o) < pool.index(c)
        and not singles[o].varying.get(c) and not singles[c].varying.get(o) for o in pool
    )]
    for _ in range(MAX_KEY_COLUMNS - 1):
        parents = sorted((c for c in level if c.version_groups), key=rank)[:BEAM]
        level = []
        for parent in parents:
            # The columns that vary in the most of the parent's groups first; a column that
            # varies in none would split nothing.
            extensions = sorted(
                (c for c in pool if c not in parent.columns and parent.varying.get(c)),
                key=lambda c: -parent.varying[c],
            )
            for col in extensions[:MAX_EXTENSIONS]:
                cand = search.measure(parent.columns + (col,), reserve=RESERVED_QUERIES)
                if cand is not None:
                    level.append(cand)


def _confirm(search: _Search, pool: list[str], variety: set[str], times: set[str]) -> None:
    """Measure the one-column extensions of the coarsest safe candidate, which the beam may
    have missed, and judge again, so that a finer safe key can reject it (rule 4). The column
    a nearly right key lacks varies in few of its groups (the merged ones): rarest first."""
    for _ in range(CONFIRM_ROUNDS):
        best = min((c for c in search.found.values() if c.safe and c.version_groups),
                   key=lambda c: (c.written, len(c.columns), c.columns), default=None)
        if best is None or len(best.columns) == MAX_KEY_COLUMNS:
            return
        extensions = sorted((c for c in pool if c not in best.columns and best.varying.get(c)),
                            key=lambda c: best.varying[c])
        added = [search.measure(best.columns + (c,)) for c in extensions[:MAX_EXTENSIONS]]
        if not any(added):
            return
        _judge(search, variety, times)


def _judge(search: _Search, variety: set[str], times: set[str]) -> None:
    """Apply rules 1 to 4 of the module docstring to every measured candidate."""
    _measure_parts(search, variety, times)
    candidates = list(search.found.values())
    for cand in candidates:
        cand.clear_verdict()
        _judge_alone(cand, variety, times, search.found)
    # Rule 3, coarsest first: the candidates that could be proposed.
    contenders = sorted((c for c in candidates if c.safe and c.version_groups),
                        key=lambda c: (c.written, len(c.columns), c.columns))
    for n, cand in enumerate(contenders):  # split counts are kept: judging again costs nothing
        if n < SPLIT_CHECKS:
            _judge_splits(search, cand, variety)
        else:
            cand.reject("not checked for rule 3 (splits into histories): its query budget is spent")
    # Rule 4, finest first: against the finer keys already found safe.
    safe: list[KeyCandidate] = []
    for cand in sorted((c for c in contenders if c.safe), key=lambda c: (-c.written, -len(c.columns), c.columns)):
        hit = next(((f, x, cand.varying[x]) for f in safe if _refines(f, cand)
                    for x in f.identity_columns if cand.varying.get(x, 0) >= MIN_NESTED), None)
        if hit is None:
            safe.append(cand)
            continue
        fine, col, n = hit
        cand.reject(f"{col} never changes within a group of {_names(fine.columns)} (safe), yet it "
                    f"varies in {n} of its groups: they hold several of that key's entities")


def _refines(fine: KeyCandidate, coarse: KeyCandidate) -> bool:
    """Whether every column of ``coarse`` is in ``fine`` or never varies within its groups."""
    return all(c in fine.columns or fine.varying.get(c) == 0 for c in coarse.columns)


def _judge_splits(search: _Search, cand: KeyCandidate, variety: set[str]) -> None:
    """Rule 3: no other column divides two or more groups into parts with histories."""
    split = [c for c in search.columns if c not in cand.columns and c in variety and cand.varying.get(c)]
    counts = search.splits(cand, split) if split else {}
    worst = sorted(((n, c) for c, n in counts.items() if n >= MIN_NESTED), key=lambda t: -t[0])
    if worst:
        n, col = worst[0]
        cand.reject(f"split by {col}, {n} of its groups hold two or more parts that each have rows "
                    "that differ: different entities, each with versions of its own")
    else:
        cand.evidence_for.append("no other column splits its groups into parts with histories of their own")


def _measure_parts(search: _Search, variety: set[str], times: set[str]) -> None:
    """Measure the one-column-shorter parts of every candidate that may have identity columns,
    so that rule 1 can tell a column fixed by a part of the key (budget permitting)."""
    while True:
        missing = sorted({
            part for cand in search.found.values() if cand.version_groups and len(cand.columns) > 1
            and any(not n and x in variety and x not in times for x, n in cand.varying.items())
            for part in _parts(cand.columns) if frozenset(part) not in search.found
        })
        if not missing or not any([search.measure(part) for part in missing]):
            return


def _parts(columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [tuple(c for c in columns if c != left_out) for left_out in columns] if len(columns) > 1 else []


def _judge_alone(cand: KeyCandidate, variety: set[str], times: set[str],
                 found: dict[frozenset[str], KeyCandidate]) -> None:
    """Rules 1 and 2 (or: it merges nothing but copies)."""
    vg = cand.version_groups
    if not vg:
        cand.safe = True
        what = (f"its {cand.multi_row_groups} group(s) with several rows hold only re-ingested copies"
                if cand.multi_row_groups else "each group holds one row")
        cand.evidence_for.append(f"{what}: it merges nothing that differs, nor any version")
        return
    if vg < max(MIN_VERSION_GROUPS, MIN_VERSION_SHARE * cand.groups):
        cand.reject(f"only {vg} of its {cand.groups} groups hold rows that differ: too few to tell "
                    "versions of one entity from different entities")
        return
    parts = [found.get(frozenset(p)) for p in _parts(cand.columns)]
    fixed = [x for x, n in cand.varying.items() if not n and x in variety and x not in times]
    cand.identity_columns = [x for x in fixed if all(p is not None and p.varying.get(x) for p in parts)]
    if cand.identity_columns:
        verb = "changes" if len(cand.identity_columns) == 1 else "change"
        cand.evidence_for.append(f"{_names(cand.identity_columns, 4)} never {verb} within a group")
    else:
        top = sorted(((n, x) for x, n in cand.varying.items() if n), key=lambda t: -t[0])[:3]
        cand.evidence_against.append(
            "no other column stays the same within every group"
            + (f" but {_names(fixed, 3)}, fixed by a part of the key already" if fixed else "")
            + ": " + ", ".join(f"{x} varies in {n} of {vg}" for n, x in top)
        )
    _judge_clock(cand, times)
    cand.safe = cand.versions_seen = not cand.evidence_against


def _judge_clock(cand: KeyCandidate, times: set[str]) -> None:
    """Rule 2: most version groups differ in one date/time column outside the key."""
    if not times:
        return
    vg = cand.version_groups
    clocks = [(n, x) for x, n in cand.varying.items() if x in times]
    if not clocks:
        cand.evidence_against.append(
            f"every date/time column is in the key, so the rows of each of its {vg} groups were "
            "written at the same time: different entities of one load, not successive versions"
        )
        return
    cand.clock_groups, cand.clock = max(clocks, key=lambda t: t[0])
    if cand.clock_groups >= CLOCK_SHARE * vg:
        cand.evidence_for.append(f"in {cand.clock_groups} of {vg} the rows differ in {cand.clock}, as successive versions do")
    else:
        cand.evidence_against.append(
            f"in only {cand.clock_groups} of {vg} do the rows differ in a date/time column "
            f"({cand.clock}); the others were written at the same time, like different "
            "entities of one load"
        )


def _choose(candidates: list[KeyCandidate], row_ids: list[str], repeating: bool,
            complete: bool) -> tuple[tuple[str, ...] | None, str]:
    """The proposed key and why, or None and why not."""
    safe = sorted((c for c in candidates if c.version_groups and c.safe), key=lambda c: (c.written, len(c.columns)))
    if safe:
        best = safe[0]
        rivals = [c for c in safe[1:] if (c.written, len(c.columns)) == (best.written, len(best.columns))]
        if rivals:
            return None, (f"no single candidate key: {_names(best.columns)} and "
                          f"{', '.join(_names(c.columns) for c in rivals)} both look safe and group "
                          f"the rows alike ({best.groups} groups); the data cannot choose" + _DECLARE)
        return best.columns, _key_reason(best, row_ids)
    if not repeating and len(row_ids) == 1:
        return (row_ids[0],), (f"{row_ids[0]}: each value carries one distinct row and no key-like "
                               "column shows versions; the data has none to merge")
    if not candidates:
        return None, ("no candidate key is safe: no integer, text, uuid or date/time column outside "
                      "the row ids takes several values in a partition" + _row_id_note(row_ids) + _DECLARE)
    closest = sorted((c for c in candidates if c.version_groups), key=lambda c: (c.spread, c.written))[:2]
    why = "; ".join(f"{_names(c.columns)}: {c.evidence_against[0]}" for c in closest if c.evidence_against)
    searched = f"{len(candidates)} candidate(s) tried" + ("" if complete else ", search stopped at its query budget")
    return None, f"no candidate key is safe ({searched}): {why}" + _row_id_note(row_ids) + _DECLARE


def _verify(full: _Search, candidates: list[KeyCandidate], chosen: tuple[str, ...], row_ids: list[str],
            variety: set[str], times: set[str]) -> tuple[tuple[str, ...] | None, str]:
    """Measure a key chosen on the first partitions again on all of them (rules 1 and 2); the
    new measurement replaces the old one among the candidates."""
    cand = full.measure(chosen)
    for part in _parts(chosen):
        full.measure(part)
    assert cand is not None
    _judge_alone(cand, variety, times, full.found)
    if cand.safe and cand.version_groups:
        _judge_splits(full, cand, variety)
    candidates[:] = [cand if c.columns == chosen else c for c in candidates]
    if cand.safe and cand.version_groups:
        return chosen, _key_reason(cand, row_ids)
    why = cand.evidence_against[0] if cand.evidence_against else "it shows no versions there"
    return None, (f"no candidate key is safe: {_names(chosen)} looked safe on the first partitions "
                  f"but not on all {len(full.partitions)}: {why}" + _DECLARE)


def _key_reason(best: KeyCandidate, row_ids: list[str]) -> str:
    reason = (
        f"{_names(best.columns)}: {best.groups} group(s) in {best.rows} non-NULL row(s); "
        f"{best.version_groups} hold rows that differ and look like versions of one entity: "
        + "; ".join(best.evidence_for)

    )
    copies = best.multi_row_groups - best.version_groups
    if copies:
        reason += f"; {copies} group(s) hold only re-ingested copies"
    return reason + f"; {best.null_key_rows} row(s) with a NULL key would be dropped" + _row_id_note(row_ids)


def _row_id_note(row_ids: list[str]) -> str:
    if not row_ids:
        return ""
    return (f". Each value of {', '.join(row_ids)} carries one distinct row (a row id: a tiebreak "
            "candidate, not a key part)")


def _propose_ordering(profile: Profile, conn: psycopg.Connection, spec: Spec, cols: list[ColumnInfo],
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
        nulls, ties = _ties(conn, spec, cols, key, trial, partitions)
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


def _names(columns: Any, limit: int = 0) -> str:
    names = list(columns)
    if limit and len(names) > limit:
        return ", ".join(names[:limit]) + f" and {len(names) - limit} more"
    return ", ".join(names)


def _key_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or c.category in {"S", "U", "D"}


def _ordering_type(c: ColumnInfo) -> bool:
    return c.base_type in _INTEGERS or _is_time(c)


def _is_time(c: ColumnInfo) -> bool:
    return c.category == "D"
