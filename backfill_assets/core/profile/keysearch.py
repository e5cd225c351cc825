"""The search for candidate keys: measuring them in the source's engine within a query budget, and
judging them by the rule of ``core.profile.keyrule``.

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

from dataclasses import dataclass, field

from backfill_assets.core.profile.keyrule import (
    CLOCK_SHARE,
    DECLARE_HINT,
    MIN_NESTED,
    KeyCandidate,
    column_list,
    judge_alone,
    key_parts,
    key_reason,
    refines,
)
from backfill_assets.core.profiling import SourceProfiler
from backfill_assets.core.vocabulary import PartitionValue

MAX_KEY_COLUMNS = 4
MAX_SEEDS = 8
BEAM = 3
MAX_EXTENSIONS = 5
MAX_KEY_QUERIES = 64
RESERVED_QUERIES = 16
CONFIRM_ROUNDS = 3
KEY_SAMPLE_ROWS = 10_000
SPLIT_CHECKS = 6


@dataclass
class KeySearch:
    """What measuring a candidate needs, the candidates measured and the queries spent."""

    source: SourceProfiler
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
        self.queries += 1
        row = self.source.key_evidence(key, others, self.partitions)
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
            self.queries += 1
            found = self.source.key_splits(cand.columns, split, others, self.partitions)
            self.split_counts[cand.columns] = {split[i]: n for i, n in found}
        return self.split_counts[cand.columns]


def search_keys(search: KeySearch, pool: list[str], distinct: dict[str, int], times: set[str]) -> None:
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


def confirm(search: KeySearch, pool: list[str], variety: set[str], times: set[str]) -> None:
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
        judge(search, variety, times)


def judge(search: KeySearch, variety: set[str], times: set[str]) -> None:
    """Apply rules 1 to 4 of the key rule (``core.profile.keyrule``) to every measured candidate."""
    _measure_parts(search, variety, times)
    candidates = list(search.found.values())
    for cand in candidates:
        cand.clear_verdict()
        judge_alone(cand, variety, times, search.found)
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
        hit = next(((f, x, cand.varying[x]) for f in safe if refines(f, cand)
                    for x in f.identity_columns if cand.varying.get(x, 0) >= MIN_NESTED), None)
        if hit is None:
            safe.append(cand)
            continue
        fine, col, n = hit
        cand.reject(f"{col} never changes within a group of {column_list(fine.columns)} (safe), yet it "
                    f"varies in {n} of its groups: they hold several of that key's entities")


def _judge_splits(search: KeySearch, cand: KeyCandidate, variety: set[str]) -> None:
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


def _measure_parts(search: KeySearch, variety: set[str], times: set[str]) -> None:
    """Measure the one-column-shorter parts of every candidate that may have identity columns,
    so that rule 1 can tell a column fixed by a part of the key (budget permitting)."""
    while True:
        missing = sorted({
            part for cand in search.found.values() if cand.version_groups and len(cand.columns) > 1
            and any(not n and x in variety and x not in times for x, n in cand.varying.items())
            for part in key_parts(cand.columns) if frozenset(part) not in search.found
        })
        if not missing or not any([search.measure(part) for part in missing]):
            return


def verify(full: KeySearch, candidates: list[KeyCandidate], chosen: tuple[str, ...], row_ids: list[str],
            variety: set[str], times: set[str]) -> tuple[tuple[str, ...] | None, str]:
    """Measure a key chosen on the first partitions again on all of them (rules 1 and 2); the
    new measurement replaces the old one among the candidates."""
    cand = full.measure(chosen)
    for part in key_parts(chosen):
        full.measure(part)
    assert cand is not None
    judge_alone(cand, variety, times, full.found)
    if cand.safe and cand.version_groups:
        _judge_splits(full, cand, variety)
    candidates[:] = [cand if c.columns == chosen else c for c in candidates]
    if cand.safe and cand.version_groups:
        return chosen, key_reason(cand, row_ids)
    why = cand.evidence_against[0] if cand.evidence_against else "it shows no versions there"
    return None, (f"no candidate key is safe: {column_list(chosen)} looked safe on the first partitions "
                  f"but not on all {len(full.partitions)}: {why}" + DECLARE_HINT)
