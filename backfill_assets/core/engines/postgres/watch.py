"""Watching the source between snapshots: which snapshotted partitions moved on, without
reading the data of those that did not.

A tick passes through three gates, cheapest first, and each one only looks at what the one
before it let through:

1. **The table** (:func:`read_table`): the source's change counters in PostgreSQL's
   statistics system (inserted, updated, deleted tuples per relation; for a partitioned table
   per leaf), its file nodes (TRUNCATE and every rewrite give a new one), its columns, and
   when the counters last started from zero. No row is read. Unchanged since the last tick:
   nothing else is read, whatever the number of partitions.
2. **Each partition** (only when the table moved, and only with ``source.change_column``
   declared and an index on (partition key, change column)): the row count, the column's
   newest value, its NULL count and a sum of its values' hashes, in one walk over the
   partition's index entries (no sort, no heap row). A row added or removed moves the count;
   a row whose change value changed moves the sum, whatever order the writers commit in (a
   sequence value or a timestamp is taken when the row is written, not when it commits, so
   "the newest value moved" alone would miss a long transaction that commits after a newer
   one). Without a change column, or without the index, every partition goes to gate 3.
3. **The fingerprint** (:func:`backfill_assets.core.engines.postgres.snapshot.source_changes`), the full
   comparison with the partition's newest snapshot, for the partitions gate 2 flagged, those
   never checked before and those snapshotted again since, within a time budget; what the
   budget leaves is carried to the next tick (``pending``), never dropped.

The spec's other inputs (core.spec_inputs) are watched after the source, by gate 1 alone: an
input whose counters moved (or that is not counted) is read again as each newest snapshot read
it; where its pin no longer holds, every partition of that snapshot is requested (an input
read whole feeds them all).

A first tick (no state kept: a new sensor, a reset cursor) fingerprints every snapshotted
partition once, as the sensor used to at every tick. A source whose writes PostgreSQL does
not count (a view, a foreign table, a table with inheritance children, ``track_counts``
off, a standby) is fingerprinted in full
at every tick.

The state a tick returns is never newer than what the tick checked: the counters are read
first, then the partition signals, then the fingerprints, so a write that lands in between
shows as a difference at a later tick. The counters are not transactional and a backend
publishes them when it goes idle (at most once a second, within about 10 s, up to 60 s
under contention; a long transaction's at its end), so a write can be seen a tick late;
it is not lost: the saved counters do not include it, so it differs at the next tick that
sees it. A reset of the counters (``pg_stat_reset``, one table's reset, crash recovery)
moves a reset time that is part of the reading, and counts as "rows were updated or
deleted".

The contract gate 2 relies on, which the user declares with ``change_column``: every UPDATE
gives the row's change column another value (an ingest sequence, or an ``updated_at`` set by
every write); inserts and deletes need nothing. An UPDATE that leaves the column as it was is
seen by gate 1 and read at gate 2 but not flagged there: it is caught only at the
partition's next full check (after a TRUNCATE, a rewrite, a new snapshot, or a cursor reset). Without a declared column the
sensor never relies on it. Catalog changes other than the source's own columns (renaming an
enum label that a column shows) are not watched.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from backfill_assets.core.catalog import windowing_of
from backfill_assets.core.engines.postgres.inputs import input_pins
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.snapshot import changes_against
from backfill_assets.core.engines.postgres.watch_state import (
    SHORT_DIGITS,
    Mode,
    PartitionWatch,
    Signal,
    TableReading,
    Tick,
    WatchState,
    read_relation,
)
from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint.rows import FORMAT
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import has_ordered_index, table_columns, table_kind
from backfill_assets.core.pg.db import repeatable_read, transient_errors
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.inputs import newest_with_inputs
from backfill_assets.core.windows import Windowing

# Base types (domains resolved) a change column may have: ordered, and exact.
CHANGE_COLUMN_TYPES = ("int2", "int4", "int8", "numeric", "date", "timestamp", "timestamptz")
_KEY_TYPES = ("date", "int2", "int4", "int8", "text", "varchar", "bpchar")


def _short(digest: str) -> str:
    return digest[:SHORT_DIGITS]


def read_table(conn: psycopg.Connection, spec: Spec) -> TableReading:
    """Gate 1: read the source's counters, file nodes and columns (catalog and statistics
    only; no row of the source is read).

    Raises:
        SpecError: the source does not exist, or ``source.change_column`` is not one of its
            columns of an ordered, exact type.
    """
    src = spec.source_ref
    if table_kind(conn, src) is None:
        raise SpecError(f"source table {src} does not exist")
    check_change_column(spec, {c.name: c.base_type for c in table_columns(conn, src)})
    reading = read_relation(conn, src, "source")
    assert reading is not None
    return reading


def check_change_column(spec: Spec, base_types: dict[str, str]) -> None:
    """Raise SpecError unless the declared change column is a source column of an ordered,
    exact type (``base_types``: source column -> base type name)."""
    column = spec.source.change_column
    if column is None:
        return
    if column not in base_types:
        raise SpecError(f"source.change_column {column} is not a column of the source {spec.source_ref}")
    if base_types[column] not in CHANGE_COLUMN_TYPES:
        raise SpecError(
            f"source.change_column {column} has type {base_types[column]}; it must be an integer, "
            "numeric, date or timestamp column that every update changes (an ingest sequence "
            "or updated_at)"
        )


def compare_tables(before: TableReading | None, now: TableReading) -> tuple[Mode, str]:
    """Gate 1's verdict: what kind of change happened to the table since ``before``.

    ``quiet``: nothing; ``newer``: rows were only inserted; ``counted``: rows were updated
    or deleted, or the counters were reset (for both, gate 2's signals tell where); ``full``: no earlier reading, no counters, the columns changed,
    or a relation was truncated, rewritten, attached or detached (every partition is read).
    """
    if before is None:
        return "full", "has no earlier reading (first tick, or the cursor was reset)"
    if now.blind or before.blind:
        return "full", f"cannot be watched cheaply: {now.blind or before.blind}"
    if now.columns != before.columns:
        return "full", "changed its columns"
    if [r[:3] for r in now.relations] != [r[:3] for r in before.relations]:
        return "full", "was truncated, rewritten, or had partitions attached or detached"
    if now.resets != before.resets:
        return "counted", "statistics were reset since the last tick"
    pairs = list(zip(before.relations, now.relations))
    if any(n < b for old, new in pairs for b, n in zip(old[3:], new[3:])):
        return "counted", "counters went back (statistics were reset)"
    if any(new[4:] != old[4:] for old, new in pairs):
        return "counted", "had rows updated or deleted"
    if any(new[3] != old[3] for old, new in pairs):
        return "newer", "had rows inserted"
    return "quiet", "unchanged"


@dataclass(frozen=True)
class _Gate2:
    """How to read partition signals for a spec, or why it cannot."""

    change_column: str | None
    key_type: str | None
    problem: str | None
    windowing: Windowing | None = None  # the partitions are time windows of the key


def _gate2(conn: psycopg.Connection, spec: Spec) -> _Gate2:
    column = spec.source.change_column
    if column is None:
        return _Gate2(None, None, "no source.change_column is declared, so every partition is fingerprinted")
    src = spec.source_ref
    key = next((c for c in table_columns(conn, src) if c.name == spec.partition_key), None)
    windowing = None
    if key is not None and spec.partition_window is not None:
        windowing = windowing_of(spec, key)  # SpecError where the column cannot be windowed
    elif key is None or key.base_type not in _KEY_TYPES:
        raise SpecError(f"partition_key {spec.partition_key} is not a date, integer or text column of {src}")
    if not has_ordered_index(conn, src, spec.partition_key, [(column, False)]):
        ddl = sqlbuild.create_index(src, [sqlbuild.OrderKey(spec.partition_key), sqlbuild.OrderKey(column)])
        return _Gate2(None, None, f"no index on ({spec.partition_key}, {column}) of {src}, so every "
                      f"partition is fingerprinted; add it with: {ddl.as_string(conn)};")
    return _Gate2(column, key.base_type, None, windowing)


def _signals(conn: psycopg.Connection, spec: Spec, gate: _Gate2, labels: list[str]) -> dict[str, Signal]:
    if not labels:
        return {}
    assert gate.change_column is not None and gate.key_type is not None
    if gate.windowing is not None:
        bounds = [(w.label, gate.windowing.bound(w.start), gate.windowing.bound(w.end))
                  for w in map(gate.windowing.window, labels)]
        query, params = sqlbuild.window_signals(spec.source_ref, spec.partition_key, gate.key_type,
                                                gate.change_column, bounds)
    else:
        query, params = sqlbuild.partition_signals(
            spec.source_ref, spec.partition_key, gate.key_type, gate.change_column, labels,
        )
    return {label: Signal(int(n), newest, int(nulls), digest)
            for label, n, newest, nulls, digest in conn.execute(query, params).fetchall()}


def _moved(before: Signal | None, now: Signal) -> bool:
    return before != now


def _fingerprint(
    conn: psycopg.Connection, spec: Spec, known: dict[str, str], labels: list[str],
    budget_s: float | None, clock: Callable[[], float],
) -> tuple[dict[str, str], list[str]]:
    """Full comparison of ``labels`` with their newest snapshots (``known``), in batches sized
    by the time a partition took so far (at most doubling), until the budget is spent; at
    least one partition. The spec is resolved against the catalog once. Returns (changed,
    checked)."""
    if not labels:
        return {}, []
    ctx = resolve(conn, spec, labels)

    def changes(batch: list[str]) -> dict[str, str]:
        return changes_against(conn, dataclasses.replace(ctx, partitions=[ctx.value_of(p) for p in batch]), known)

    if budget_s is None:
        return changes(labels), list(labels)
    start, done, size = clock(), 0, 1
    changed: dict[str, str] = {}
    while done < len(labels):
        batch = labels[done:done + size]
        changed.update(changes(batch))
        done += len(batch)
        elapsed = clock() - start
        if elapsed >= budget_s:
            break
        fits = int((budget_s - elapsed) * done / elapsed) if elapsed > 0 else size * 2
        size = max(1, min(size * 2, fits))
    return changed, labels[:done]


def _already_due(
    before: WatchState, known: dict[str, str], labels: list[str],
) -> tuple[list[str], dict[str, PartitionWatch]]:
    """The partitions to fingerprint whatever the gates say (left over, never checked, or
    snapshotted again with content other than what the source had when last checked), and
    what is known of each watched partition."""
    watched: dict[str, PartitionWatch] = {}
    due: list[str] = [p for p in before.pending if p in known]
    for label in labels:
        old, snap = before.partitions.get(label), _short(known[label])
        if old is not None and old.snapshot != snap and old.seen == snap:
            old = replace(old, snapshot=snap, seen=None)  # restaged from what was reported
        if old is None or old.snapshot != snap:
            due.append(label)
        if old is not None:
            watched[label] = old
    return due, watched


def _gate2_flags(
    conn: psycopg.Connection, spec: Spec, gate: _Gate2, mode: Mode, labels: list[str], due: list[str],
    watched: dict[str, PartitionWatch], known: dict[str, str],
) -> tuple[list[str], int]:
    """Gate 2: the partitions (not already due) whose signal moved, and how many were read.
    Updates ``watched`` with every signal read; whatever is due gets its signal too, read
    before its fingerprint."""
    flagged: list[str] = []
    signalled = 0
    with transient_errors("reading the partitions' change signals"), repeatable_read(conn, read_only=True):
        if mode in ("newer", "counted"):
            due_set = set(due)
            others = [p for p in labels if p not in due_set]
            read = _signals(conn, spec, gate, others)
            signalled = len(read)
            flagged = [p for p in others if _moved(watched[p].signal, read[p])]
            for label in others:
                if label not in flagged:
                    watched[label] = replace(watched[label], signal=read[label])
        for label, signal in _signals(conn, spec, gate, [*due, *flagged]).items():
            watched[label] = replace(watched.get(label) or PartitionWatch(_short(known[label])), signal=signal)
    return flagged, signalled


def _input_moves(conn: psycopg.Connection, spec: Spec, before: dict[str, Any] | None
                ) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """The source sensor's look at the spec's other inputs: each input's change counters
    (core.engines.postgres.watch_state.read_relation: no row read); where they moved since
    ``before`` (or on a first tick, or an input whose writes are not counted), the input read
    again as each newest snapshot read it and compared with that snapshot's pin. Returns the
    partitions an input that differs feeds (label -> ``input <name> <digest>``, every partition
    of that snapshot: an input read whole feeds them all), the readings to keep, and a note
    naming each input that moved."""
    if not spec.inputs:
        return {}, {}, []
    before = before or {}
    readings, moved = {}, []
    for name, given in spec.inputs.items():
        reading = read_relation(conn, given.ref, "input")
        readings[name] = None if reading is None else reading.as_json()
        if reading is None or reading.blind is not None or before.get(name) != readings[name]:
            moved.append(name)
    snapshots = newest_with_inputs(conn, spec.control_schema, str(spec.source_ref), FORMAT) if moved else []
    changed: dict[str, str] = {}
    notes: list[str] = []
    if not snapshots:
        return changed, readings, notes
    ctx = resolve(conn, spec, sorted({label for _, read, _ in snapshots for label in read}))
    ctx = dataclasses.replace(ctx, inputs=tuple(i for i in ctx.inputs if i.name in moved))  # the others held
    whole: dict[str, tuple[int, str]] = {}  # an input read whole is read once, whatever the snapshots
    for newest, read, pins in snapshots:  # each pin read again for every partition its snapshot read
        now = {p["name"]: p for p in input_pins(conn, dataclasses.replace(
            ctx, partitions=[ctx.value_of(label) for label in read]), whole) or ()}
        for pin in pins:
            if pin["name"] in now and now[pin["name"]]["content_hash"] != pin["content_hash"]:
                digest = now[pin["name"]]["content_hash"]
                changed.update({label: f"input {pin['name']} {digest[:16]}" for label in newest})
                shown = ", ".join(newest[:3]) + (f" and {len(newest) - 3} more" if len(newest) > 3 else "")
                notes.append(f"input {pin['name']} ({pin['table']}) moved since the snapshot of {shown}")
    return changed, readings, notes


def watch_tick(
    conn: psycopg.Connection, spec: Spec, before: WatchState | None, *,
    budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
) -> Tick:
    """One tick of the source sensor for one spec: find the snapshotted partitions whose
    source differs from their newest snapshot, reading as little as the gates allow.

    Args:
        before: the state the previous tick returned (None: check every partition in full).
        budget_s: stop starting fingerprints after this many seconds (None: no limit); the
            partitions not reached are kept in ``pending`` for the next tick.
        clock: a monotonic clock in seconds (for the budget).

    Returns:
        The partitions found changed in this tick (a change already reported is not reported
        again until the source moves once more), what each gate did, and the state to keep.

    Raises:
        SpecError: the source is gone, or ``change_column`` is not a usable column.
        TransientDatabaseError: a lock or statement timeout.
    """
    before = before or WatchState()
    schema = spec.control_schema
    if not store.control_ready(conn, schema):
        return Tick({}, WatchState(), "quiet", "has no control schema yet", 0, [], [])
    with transient_errors("reading the source's counters"), repeatable_read(conn, read_only=True):
        table = read_table(conn, spec)  # first: everything after it is at least as new
        known = store.latest_snapshotted(conn, schema, str(spec.source_ref))
    mode, reason = compare_tables(before.table, table)
    labels = sorted(known)
    if not labels:
        return Tick({}, WatchState(table), mode, reason, 0, [], [])

    due, watched = _already_due(before, known, labels)
    notes: list[str] = []
    flagged: list[str] = []
    signalled = 0
    gate = _gate2(conn, spec) if mode != "quiet" or due else None
    if gate is not None and gate.problem is not None:
        if mode in ("newer", "counted"):
            notes.append(gate.problem)
        gate = None
    if mode == "full" or (gate is None and mode != "quiet"):
        due.extend(labels)
    due = list(dict.fromkeys(due))

    if gate is not None:
        flagged, signalled = _gate2_flags(conn, spec, gate, mode, labels, due, watched, known)
        due.extend(flagged)

    found, checked = _fingerprint(conn, spec, known, due, budget_s, clock)
    changed: dict[str, str] = {}
    for label in checked:
        old = watched.get(label) or PartitionWatch(_short(known[label]))
        seen = _short(found[label]) if label in found else None
        if seen is not None and (old.seen != seen or old.snapshot != _short(known[label])):
            changed[label] = found[label]  # not reported yet against this snapshot
        watched[label] = replace(old, snapshot=_short(known[label]), seen=seen)
    done = set(checked)
    pending = tuple(p for p in due if p not in done)
    # The other inputs after the source: a change in one requests every partition it fed.
    moved, inputs, input_notes = _input_moves(conn, spec, before.inputs)
    changed.update({label: found for label, found in moved.items() if label not in changed})
    state = WatchState(table, {k: v for k, v in watched.items() if k in known}, pending, inputs)
    return Tick(changed, state, mode, reason, signalled, flagged, checked, [*notes, *input_notes])
