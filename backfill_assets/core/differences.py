"""What a replacement changes, as values every engine and front-end shares: a partition's
counts of keys added, removed, changed and unchanged, with example keys (core.diff compares;
an engine finds them, render shows them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from backfill_assets.core.fingerprint.rows import Reading

Against = Literal["target", "stage_b"]
KINDS = ("added", "removed", "changed", "unchanged")
DEFAULT_LIMIT = 10


class FirstKey(TypedDict):
    """One differing key of a change preview: its key as text, its kind and the columns that
    differ (none for a key added or removed; no values)."""

    key: dict[str, str | None]
    kind: str
    columns: list[str]


class Change(TypedDict):
    """What replacing one target partition with the approved stage changes: the keys added,
    removed, changed and unchanged, and, when asked for, the first differing keys."""

    added: int
    removed: int
    changed: int
    unchanged: int
    first: NotRequired[list[FirstKey]]


@dataclass(frozen=True)
class Example:
    """One differing key: its kind, the columns whose text forms differ, and both values of
    each (``[approved stage, other side]``; None is NULL)."""

    key: dict[str, str | None]
    kind: str
    columns: list[str]
    values: dict[str, list[str | None]]

    def as_json(self) -> dict[str, Any]:
        return {"key": self.key, "kind": self.kind, "columns": self.columns, "values": self.values}


def example_text(example: Example, *, values: bool = False) -> str:
    """One line: the key, and which side has it or the columns that differ (with their two
    values only when asked: what is stored, in plans, ledgers and run metadata, names keys
    and columns but copies no other value out of the tables)."""
    key = ", ".join(f"{k}={v}" for k, v in example.key.items())
    if example.kind != "changed":
        return f"({key}) {'only in the first' if example.kind == 'added' else 'only in the second'}"
    if not values:
        return f"({key}) differs in {', '.join(example.columns)}"
    return f"({key}) " + ", ".join(f"{c} {example.values[c][0]!r} vs {example.values[c][1]!r}" for c in example.columns)


@dataclass(frozen=True)
class PartitionDiff:
    partition: str
    added: int = 0
    removed: int = 0
    changed: int = 0
    unchanged: int = 0
    examples: list[Example] = field(default_factory=list)

    @property
    def differs(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def as_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "added": self.added, "removed": self.removed,
                "changed": self.changed, "unchanged": self.unchanged,
                "examples": [e.as_json() for e in self.examples]}


@dataclass(frozen=True)
class DiffResult:
    plan_id: str
    against: Against
    partitions: list[PartitionDiff]

    def as_json(self) -> dict[str, Any]:
        return {"plan_id": self.plan_id, "against": self.against,
                "partitions": [p.as_json() for p in self.partitions]}


def equal_by_fingerprint(label: str, readings: Reading) -> PartitionDiff:
    """Stage A's partition against a stage B that was hashed as it was built and not written,
    with stage A's readings: no row differs (their fingerprints are equal; docs/fingerprint.md)."""
    return PartitionDiff(label, unchanged=int(readings["row_count"]))
