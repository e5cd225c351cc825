"""The context of a run: the spec resolved against the catalog with its target's engine,
the clock, and the locks every step takes.

The engine seam is here too. Every step is written once; where it needs the target, it asks
the spec's :class:`TargetEngine` (core.targets, chosen by ``target.format``), and apply's
protocol (core.apply) is written against the :class:`Target` the engine opens: keep other
backfills of the partitions out, open one atomic write, read the target under it (is the
approval still covering it? is it already done?), recheck the approved stage, replace, read
back before the commit, commit, and read the committed state again. Readings are the
canonical fingerprint of core.fingerprint.partition as JSON values (a
:class:`~backfill_assets.core.fingerprint.rows.Reading` per partition), whatever the engine.

A build engine (core.build) inspects read-only and validates everything about a spec (identifiers, the
partitions, the transform) before anything is written; the :class:`Context` it returns is
what the snapshot, the stages, the plan, approval and apply work from.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo, Inspection, windowing_of
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.moves import Scope
from backfill_assets.core.pg.db import ConnectionFactory, advisory_session_lock
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionKind, PartitionRequest, PartitionValue, TableRef, partition_label
from backfill_assets.core.windows import Windowing

Clock = Callable[[], dt.datetime]
_SET_LOCAL = sql.SQL("SELECT set_config(%(name)s, %(value)s, true)")


def utc_now() -> dt.datetime:
    """The default clock; only metadata timestamps read it, never a build."""
    return dt.datetime.now(dt.timezone.utc)


def set_local(conn: psycopg.Connection, name: str, value: str) -> None:
    """Set a setting for the current transaction only."""
    conn.execute(_SET_LOCAL, {"name": name, "value": value})


def spec_lock(control: psycopg.Connection, spec: Spec, *, shared: bool = False):
    """A session lock per spec, on the control store's connection: plan and apply of one spec
    never overlap, so a stage cannot be rebuilt while it is being applied. A second run is
    refused at once.

    ``shared``: the build steps of a spec with ``parallel`` (see :func:`build_lock`) hold it
    shared, so several build at once, each holding its own partitions; apply and a whole plan
    hold it alone."""
    return advisory_session_lock(
        control, f"backfill_assets:plan:{spec.control_schema}:{spec.name}",
        f"a plan or apply of spec {spec.name}", shared=shared,
    )


def build_lock(control: psycopg.Connection, spec: Spec):
    """The spec lock a snapshot or stages step holds: alone, or shared with the other builds
    of a spec with ``parallel`` (which then hold their partitions, :func:`partition_locks`)."""
    return spec_lock(control, spec, shared=spec.parallel is not None)


@contextlib.contextmanager
def partition_locks(control: psycopg.Connection, spec: Spec, labels: list[str]) -> Iterator[None]:
    """For a spec with ``parallel``: a session lock per partition a build step snapshots or
    builds, on the control store's connection, so two builds sharing the spec lock never write the same partition (the second is
    refused at once). Nothing for another spec: it builds alone under its spec lock."""
    with contextlib.ExitStack() as held:
        if spec.parallel is not None:
            for label in labels:
                held.enter_context(advisory_session_lock(
                    control, f"backfill_assets:build:{spec.control_schema}:{spec.name}:{label}",
                    f"a build of partition {label} of spec {spec.name}",
                ))
        yield


Checkpoint = Callable[[str, list[str]], None]


def no_checkpoint(step: str, labels: list[str]) -> None:
    """The default checkpoint: go on."""


class TargetWrite(Protocol):
    """One atomic write of some partitions: everything in it commits together on a clean
    exit of :meth:`Target.writing`, or not at all."""

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        """The partitions as this write sees them (before the replace: as they are, with
        other writers kept out; after it: as they will be committed)."""
        ...

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        """Replace the partitions with the approved stage's rows. ``note``: what the commit's
        own metadata records where the engine keeps such metadata (plan id, content hash)."""
        ...


@dataclass(frozen=True)
class Signals:
    """What each partition of a target is made of, read from metadata only (no row is read):
    ``values`` maps each label to a signal, equal only while the partition's rows are (None:
    this partition has none that is sound, ``why`` says why). ``kind`` names the signal
    (core.audit shows it); ``at`` is what they were read at (a lake table's version), which
    :meth:`Target.readings_at` reads the rows at."""

    kind: str
    values: dict[str, str | None]
    why: str = ""
    at: Any = None


class Target(Protocol):
    """A table whose partitions apply replaces and verifies."""

    def signals(self, labels: list[str]) -> Signals:
        """Each partition's metadata signal now (core.audit's cheap check)."""
        ...

    def signals_at(self, version: str, labels: list[str]) -> dict[str, str | None] | None:
        """Each partition's signal at a version the ledger recorded (a lake's version or snapshot
        id), or None where the target keeps no versions."""
        ...

    def versions_touching(self, version: str, labels: list[str], most: int = 100) -> dict[str, list[str]] | None:
        """Of the versions committed after ``version`` (a lake's), those that touched each
        partition's files; None where the target keeps no versions (or too many came since)."""
        ...

    def readings_at(self, signals: Signals, labels: list[str]) -> dict[str, Reading]:
        """The partitions' readings as of what ``signals`` were read at: at that version for a
        lake; for a PostgreSQL table, now (its counters only grow, so a write after them moves
        them again)."""
        ...

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        """The partitions as they are now, in the caller's transaction where the engine has one."""
        ...

    def locked(self, labels: list[str]) -> contextlib.AbstractContextManager[None]:
        """Keep every other backfill of these partitions out until the committed state has
        been read back."""
        ...

    def writing(self, labels: list[str]) -> contextlib.AbstractContextManager[TargetWrite]:
        """One atomic write of these partitions, with other writers kept out."""
        ...

    def committed_readings(self, labels: list[str]) -> dict[str, Reading]:
        """The partitions as committed, read afresh (not through the write)."""
        ...

    def committed_version(self, labels: list[str]) -> str | None:
        """The table version (Delta) or snapshot id (Iceberg) the last write of ``labels``
        committed (or, when it found them already carrying the approved rows, read them at),
        for the ledger; None where the engine has no such id (PostgreSQL)."""
        ...

    def close(self) -> None:
        """Release what the target opened (apply calls it when it is done)."""
        ...


class TransformGuard(Protocol):
    """A build engine's guard of ``transform_sql``, as a target's inspection asks it."""

    def parsed(self, text: str, inputs: Collection[str] = ()) -> str:
        """The transform re-printed, if the guard's parser accepts it (TransformError); it may
        read ``source`` and the spec's ``inputs`` by name."""
        ...

    def check(self, conn: psycopg.Connection, spec: Spec, inspection: Inspection, transform: str | None) -> None:
        """The (parsed) transform against the catalog the source lives in (TransformError)."""
        ...


class TargetEngine(Protocol):
    """What the steps ask of a spec's target: every step is written once, and where it needs
    the target it asks this. One per resolved spec, chosen by ``target.format``
    (core.targets.engine_for): how inspection reads the target, which partitions it can be
    written with, what the plan records of the table, where a lock may hold it up, and the
    Target apply writes through. What a build engine asks beyond this is that engine's own
    question (the PostgreSQL engine's stage: core.engines.postgres.staged; a lake table:
    core.lake.engine.lake_engine_for)."""

    spec: Spec

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """Partitions the moved-records scope adds must be writable too. Raises SpecError."""
        ...

    def plan_fields(self, ctx: Context) -> dict[str, Any]:
        """What the plan records of the target table: ``target_table_columns`` (every column
        it has or will have) and any field that names it further (an Iceberg catalog)."""
        ...

    def creates_target(self, ctx: Context) -> bool | None:
        """Whether apply will create the table (None: an engine that never creates it)."""
        ...

    def held_elsewhere(self) -> tuple[list[TableRef], list[str]]:
        """Where another session's lock may hold the target up: its tables in the data
        database, and the names of catalog tables kept there (core.waits)."""
        ...

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        """The target apply (or approval) reads and writes: the data on ``conn``, the locks
        that keep other backfills of its partitions out on ``control`` (the control store's
        connection); ``factory`` opens the fresh connection committed readings are read on."""
        ...


@dataclass(frozen=True)
class Context:
    """A spec checked against the catalog, with its partitions and transform resolved: what
    every engine's steps share. What only one build engine asks of it is that engine's own
    subclass, made by its resolve (the PostgreSQL engine's stage tables and SQL:
    core.engines.postgres.context)."""

    spec: Spec
    engine: TargetEngine  # what the steps ask of the target (core.targets, by target.format)
    inspection: Inspection
    partitions: list[PartitionValue]  # requested, plus those moved records add
    transform: str | None  # the re-printed, validated transform_sql
    scope: Scope | None = None  # records_can_move: the added partitions and moves

    @property
    def kind(self) -> PartitionKind:
        assert self.inspection.partition_kind is not None
        return self.inspection.partition_kind

    @functools.cached_property
    def labels(self) -> list[str]:
        """The partitions' labels, computed once (callers look labels up per partition)."""
        return [partition_label(p) for p in self.partitions]

    def value_of(self, label: str) -> PartitionValue:
        """The partition value with this label."""
        return self._values[label]

    @functools.cached_property
    def _values(self) -> dict[str, PartitionValue]:
        return dict(zip(self.labels, self.partitions))

    @functools.cached_property
    def windowing(self) -> Windowing | None:
        """The spec's time windows over its partition key's column, or None: each value is a
        partition."""
        if self.spec.partition_window is None:
            return None
        return windowing_of(self.spec, self.inspection.column(self.spec.partition_key))

    def labels_of(self, request: PartitionRequest) -> list[str]:
        """The labels of the partitions ``request`` names, named as this context names its own."""
        if self.windowing is not None:
            return self.windowing.request(request.text)
        return [partition_label(v) for v in request.resolve(self.kind)]

    @property
    def target_columns(self) -> list[ColumnInfo]:
        return self.inspection.spec_target_columns(self.spec)

    @property
    def source_column_names(self) -> list[str]:
        return [c.name for c in self.inspection.source_columns]
