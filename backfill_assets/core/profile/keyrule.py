"""The business key rule: whether a measured candidate key is safe, and which key to propose.

A proposal comes from the data, never from column names (``core.profile.propose``); the candidates
are measured by ``core.profile.keysearch`` and judged here.

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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLOCK_SHARE = 0.5
MIN_NESTED = 2
MIN_VERSION_GROUPS = 3
MIN_VERSION_SHARE = 0.01
DECLARE_HINT = ("; declare business_key yourself after checking which columns identify one entity "
            "(they must not change between its versions), then run profile again")



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


def refines(fine: KeyCandidate, coarse: KeyCandidate) -> bool:
    """Whether every column of ``coarse`` is in ``fine`` or never varies within its groups."""
    return all(c in fine.columns or fine.varying.get(c) == 0 for c in coarse.columns)


def key_parts(columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    return [tuple(c for c in columns if c != left_out) for left_out in columns] if len(columns) > 1 else []


def judge_alone(cand: KeyCandidate, variety: set[str], times: set[str],
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
    parts = [found.get(frozenset(p)) for p in key_parts(cand.columns)]
    fixed = [x for x, n in cand.varying.items() if not n and x in variety and x not in times]
    cand.identity_columns = [x for x in fixed if all(p is not None and p.varying.get(x) for p in parts)]
    if cand.identity_columns:
        verb = "changes" if len(cand.identity_columns) == 1 else "change"
        cand.evidence_for.append(f"{column_list(cand.identity_columns, 4)} never {verb} within a group")
    else:
        top = sorted(((n, x) for x, n in cand.varying.items() if n), key=lambda t: -t[0])[:3]
        cand.evidence_against.append(
            "no other column stays the same within every group"
            + (f" but {column_list(fixed, 3)}, fixed by a part of the key already" if fixed else "")
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


def choose(candidates: list[KeyCandidate], row_ids: list[str], repeating: bool,
            complete: bool) -> tuple[tuple[str, ...] | None, str]:
    """The proposed key and why, or None and why not."""
    safe = sorted((c for c in candidates if c.version_groups and c.safe), key=lambda c: (c.written, len(c.columns)))
    if safe:
        best = safe[0]
        rivals = [c for c in safe[1:] if (c.written, len(c.columns)) == (best.written, len(best.columns))]
        if rivals:
            return None, (f"no single candidate key: {column_list(best.columns)} and "
                          f"{', '.join(column_list(c.columns) for c in rivals)} both look safe and group "
                          f"the rows alike ({best.groups} groups); the data cannot choose" + DECLARE_HINT)
        return best.columns, key_reason(best, row_ids)
    if not repeating and len(row_ids) == 1:
        return (row_ids[0],), (f"{row_ids[0]}: each value carries one distinct row and no key-like "
                               "column shows versions; the data has none to merge")
    if not candidates:
        return None, ("no candidate key is safe: no integer, text, uuid or date/time column outside "
                      "the row ids takes several values in a partition" + _row_id_note(row_ids) + DECLARE_HINT)
    closest = sorted((c for c in candidates if c.version_groups), key=lambda c: (c.spread, c.written))[:2]
    why = "; ".join(f"{column_list(c.columns)}: {c.evidence_against[0]}" for c in closest if c.evidence_against)
    searched = f"{len(candidates)} candidate(s) tried" + ("" if complete else ", search stopped at its query budget")
    return None, f"no candidate key is safe ({searched}): {why}" + _row_id_note(row_ids) + DECLARE_HINT


def key_reason(best: KeyCandidate, row_ids: list[str]) -> str:
    reason = (
        f"{column_list(best.columns)}: {best.groups} group(s) in {best.rows} non-NULL row(s); "
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


def column_list(columns: Any, limit: int = 0) -> str:
    names = list(columns)
    if limit and len(names) > limit:
        return ", ".join(names[:limit]) + f" and {len(names) - limit} more"
    return ", ".join(names)
