"""What the PostgreSQL engine's source sensor keeps between ticks (the table's counters, each
partition's signal and the snapshot it was last compared with, what is left for the next
tick) and what one tick found (core.engines.postgres.watch)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns, table_kind
from backfill_assets.core.vocabulary import TableRef

STATE_FORMAT = 1
# Hashes are kept as their first 16 hex digits (64 bits): the state only tells whether a
# snapshot is the one a partition was last compared with; the comparison itself is in full.
SHORT_DIGITS = 16

Mode = Literal["quiet", "newer", "counted", "full"]


@dataclass(frozen=True)
class TableReading:
    """Gate 1: the source as the catalog and the statistics system show it."""

    relations: tuple[tuple[int, str, int, int, int, int], ...]  # oid, relkind, filenode, ins, upd, del
    resets: tuple[str | None, str | None]  # the database's and the shared counters' reset times
    columns: str  # a digest of the source's columns (a column added or dropped changes every hash)
    blind: str | None = None  # why the counters cannot be trusted, or None

    def as_json(self) -> dict[str, Any]:
        return {"relations": [list(r) for r in self.relations], "resets": list(self.resets),
                "columns": self.columns, "blind": self.blind}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableReading:
        return cls(tuple(tuple(r) for r in data["relations"]), tuple(data["resets"]),  # type: ignore[arg-type]
                   data["columns"], data["blind"])


_COUNTED_KINDS = ("r", "m")  # relations whose writes the statistics system counts


def read_relation(conn: psycopg.Connection, rel: TableRef, role: str) -> TableReading | None:
    """A table's counters, file nodes and columns from the catalog and the statistics system
    (no row is read), with why they cannot be trusted where they cannot (``blind``); None when
    the table does not exist. ``role`` names it in those reasons ("source", "target")."""
    kind = table_kind(conn, rel)
    if kind is None:
        return None
    columns = table_columns(conn, rel)
    digest = hashlib.sha256(json.dumps([[c.name, c.type_name] for c in columns]).encode()).hexdigest()
    track, standby, db_reset, shared_reset = conn.execute(*sqlbuild.statistics_state()).fetchone() or (True, False, None, None)
    rows = conn.execute(*sqlbuild.table_counters(rel)).fetchall()
    relations = tuple((int(oid), relkind, int(node or 0), int(ins), int(upd), int(dele))
                      for oid, relkind, node, ins, upd, dele, _ in rows)
    inherited = any(children for *_, children in rows)
    blind = None
    if not track:
        blind = "track_counts is off, so PostgreSQL counts no writes"
    elif standby:
        blind = "the server is a standby, which does not count the writes it replays"
    elif kind not in (*_COUNTED_KINDS, "p"):
        blind = f"the {role} is a {'view' if kind == 'v' else 'foreign table' if kind == 'f' else 'relation'} without write counters"
    elif any(r[1] not in _COUNTED_KINDS for r in relations):
        blind = f"a partition of the {role} is a foreign table, without write counters"
    elif inherited:
        # A read of the table includes its inheritance children (INHERITS, trigger-based
        # partitioning, hypertables); their writes are counted on them, not on the table.
        blind = f"the {role} has inheritance children, whose writes its counters do not show"
    return TableReading(relations, (db_reset, shared_reset), digest[:SHORT_DIGITS], blind)


@dataclass(frozen=True)
class Signal:
    """Gate 2 for one partition: its row count, the newest change value (as text), the NULL
    count and the sum of the change values' hashes (as text)."""

    count: int | None
    newest: str | None
    nulls: int
    digest: str | None = None


@dataclass(frozen=True)
class PartitionWatch:
    """What the sensor knows of one snapshotted partition.

    ``snapshot``: the newest snapshot's hash when last compared; ``seen``: the source's hash
    then, when it differed (the change was reported); ``signal``: gate 2's last reading.
    """

    snapshot: str
    seen: str | None = None
    signal: Signal | None = None

    def as_json(self) -> list[Any]:
        s = self.signal
        return [self.snapshot, self.seen, *((s.count, s.newest, s.nulls, s.digest) if s else (None,) * 4)]

    @classmethod
    def from_json(cls, data: list[Any]) -> PartitionWatch:
        snapshot, seen, count, newest, nulls, digest = data
        return cls(snapshot, seen, None if nulls is None else Signal(count, newest, nulls, digest))


@dataclass(frozen=True)
class WatchState:
    """What a tick leaves for the next: the table reading it started from, each watched
    partition, and the partitions still to fingerprint (oldest first)."""

    table: TableReading | None = None
    partitions: dict[str, PartitionWatch] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    # The spec's other inputs as gate 1 read them (input name -> TableReading's JSON, or None).
    inputs: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT, "table": None if self.table is None else self.table.as_json(),
            "partitions": {k: v.as_json() for k, v in sorted(self.partitions.items())},
            "pending": list(self.pending), **({"inputs": self.inputs} if self.inputs else {}),
        }

    @classmethod
    def from_json(cls, data: object) -> WatchState | None:
        """The state, or None (start again with a full check) when it is of another format or
        not of this shape (a cursor edited by hand in the UI, say)."""
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            return None
        try:
            table = data["table"]
            return cls(
                None if table is None else TableReading.from_json(table),
                {str(k): PartitionWatch.from_json(v) for k, v in data["partitions"].items()},
                tuple(str(p) for p in data["pending"]),
                dict(data.get("inputs", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class Tick:
    """One tick of one spec: what changed, what each gate read, and the state to keep."""

    changed: dict[str, str]  # label -> the source hash that differs from the newest snapshot
    state: WatchState
    mode: Mode  # gate 1's verdict
    reason: str  # gate 1's verdict in words
    signalled: int  # partitions read at gate 2
    flagged: list[str]  # partitions gate 2 sent to gate 3
    fingerprinted: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def pending(self) -> tuple[str, ...]:
        return self.state.pending

    def summary(self) -> str:
        """One line for the sensor's log."""
        parts = [f"source {self.reason}", f"{len(self.state.partitions)} partition(s) watched"]
        if self.signalled:
            parts.append(f"{self.signalled} read at gate 2 ({len(self.flagged)} flagged)")
        parts.append(f"{len(self.fingerprinted)} fingerprinted")
        parts.append(f"{len(self.changed)} changed" + (f": {', '.join(sorted(self.changed))}" if self.changed else ""))
        if self.pending:
            parts.append(f"{len(self.pending)} left for the next tick")
        return "; ".join(parts)
