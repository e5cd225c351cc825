"""Records that can move between partitions (``records_can_move: true``).

The business key is unique across the whole target, and a key's newest version decides its
partition. Rebuilding the requested partitions then also means rebuilding the partition a
moved key leaves and the one it goes to. :func:`close_scope` finds them, to a fixed point,
inside the snapshot's REPEATABLE READ transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from backfill_assets.core.errors import SourceDataError, SpecError
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import (
    MAX_PARTITIONS,
    PartitionKind,
    PartitionValue,
    TableRef,
    parse_labels,
    partition_label,
)
from backfill_assets.core.windows import Windowing

MAX_ROUNDS = 100
EXAMPLES = 3


@dataclass
class Scope:
    """The partitions to rebuild: those requested, those added (with why), and the groups of
    partitions that moved keys link (each group is replaced in one transaction)."""

    partitions: list[PartitionValue]
    added: dict[str, list[str]] = field(default_factory=dict)  # label -> reasons
    moves: list[tuple[str, str, str]] = field(default_factory=list)  # (key, from, to)

    def groups(self) -> list[list[str]]:
        """Partition labels grouped by moved keys; singletons for the others, in order."""
        labels = [partition_label(p) for p in self.partitions]
        parent = {label: label for label in labels}

        def find(x: str) -> str:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for _, old, new in self.moves:
            a, b = find(old), find(new)
            if a != b:
                parent[max(a, b, key=labels.index)] = min(a, b, key=labels.index)
        groups: dict[str, list[str]] = {}
        for label in labels:
            groups.setdefault(find(label), []).append(label)
        return sorted(groups.values(), key=lambda g: labels.index(g[0]))


def _key_text(spec: Spec, values: tuple) -> str:
    return "(" + ", ".join(f"{c}={v}" for c, v in zip(spec.business_key, values)) + ")"


def close_scope(
    conn: psycopg.Connection, spec: Spec, kind: PartitionKind, requested: list[PartitionValue],
    ordering: list[sqlbuild.OrderKey], target: TableRef, by: sqlbuild.PartitionBy | None = None,
) -> Scope:
    """Add to ``requested`` every partition a moved key leaves or enters, to a fixed point.
    ``target``: where the target's keys are read (core.engines.postgres.staged.keys_relation);
    ``by``: how rows fall into partitions (default: the partition key's values). With time
    windows, a key moves when its newest version's time stamp lies in another window than
    the target's row: core.windows places both.

    Raises:
        SourceDataError: a key's newest version, or the target row holding it, has a NULL
            partition, so its old or new partition cannot be identified.
        SpecError: the scope grows past the partition limit.
    """
    by = by or sqlbuild.ValuesBy(spec.partition_key)
    windowing = by.windowing if isinstance(by, sqlbuild.WindowsBy) else None

    def homes(partitions: list[PartitionValue]) -> list[tuple]:
        query, params = sqlbuild.key_homes(spec.source_ref, target, by, spec.business_key, ordering, partitions)
        rows = conn.execute(query, params).fetchall()
        return rows if windowing is None else placed(rows, windowing, {str(p) for p in partitions})

    scope = close_scope_with(spec, kind, requested, homes)
    if windowing is not None:  # in time order (a label's text order is not, where clocks fall back east of UTC)
        scope.partitions = list(windowing.labels([str(p) for p in scope.partitions]))
    return scope


def placed(rows: list[tuple], windowing: Windowing, requested: set[str]) -> list[tuple]:
    """key_homes' rows with the column values placed in windows (labels), less the keys whose
    newest version and target row lie in the same requested window (a time stamp that moved
    within its window)."""
    placed = []
    for home, current, in_source, in_target, *key in rows:
        home_label = None if home is None else windowing.label_at(home)
        current_label = None if current is None else windowing.label_at(current)
        if in_source and in_target and home_label == current_label and home_label in requested:
            continue
        placed.append((home_label, current_label, in_source, in_target, *key))
    return placed


KeyHomes = Callable[[list[PartitionValue]], list[tuple]]


def close_scope_with(spec: Spec, kind: PartitionKind, requested: list[PartitionValue], homes: KeyHomes) -> Scope:
    """:func:`close_scope` over ``homes``, which answers, for the keys of some partitions, the
    rows (home text, current text, in source, in target, key values...) of each key whose
    newest source version lies in another partition than the target holds it in, outside
    those partitions, or on one side only (sqlbuild.key_homes; the DuckDB engine asks DuckDB)."""
    labels = {partition_label(p): p for p in requested}
    added: dict[str, list[str]] = {}
    for _ in range(MAX_ROUNDS):
        rows = homes(sorted(labels.values()))  # type: ignore[type-var]
        unknown = [
            _key_text(spec, tuple(r[4:])) for r in rows
            if (r[2] and r[0] is None) or (r[3] and r[1] is None)
        ]
        if unknown:
            raise SourceDataError(
                f"{len(unknown)} moved key(s) have a NULL partition in the source's newest "
                "version or in the target, so their old or new partition cannot be identified",
                "Fix those rows' partition values, or leave records_can_move off",
                unknown[:EXAMPLES],
            )
        grew = False
        for home, current, in_source, in_target, *key in rows:
            key_text = _key_text(spec, tuple(key))
            reasons = []
            moved = in_source and in_target and home != current
            if in_source:
                reasons.append((home, f"key {key_text} moves here from {current}" if moved
                                else f"the newest version of key {key_text} is here"))
            if in_target and (moved or not in_source):
                reasons.append((current, f"key {key_text} moves from here to {home}" if moved
                                else f"key {key_text} has no source row left"))
            for label, reason in reasons:
                if label not in labels:
                    (labels[label],) = parse_labels([label], kind)
                    added[label] = []
                    grew = True
                if label in added and len(added[label]) < EXAMPLES and reason not in added[label]:
                    added[label].append(reason)
        if len(labels) > MAX_PARTITIONS:
            raise SpecError(f"moved records add more than {MAX_PARTITIONS} partitions")
        if not grew:
            moves = [
                (_key_text(spec, tuple(key)), current, home)
                for home, current, in_source, in_target, *key in rows
                if in_source and in_target and home != current
            ]
            return Scope(sorted(labels.values()), added, moves)  # type: ignore[type-var]
    raise SpecError(f"moved records did not settle after {MAX_ROUNDS} rounds of partitions")
