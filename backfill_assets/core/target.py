"""The engine seam: the table whose partitions apply replaces.

apply's protocol (core.apply) is written once against :class:`Target`: keep other backfills
of the partitions out, open one atomic write, read the target under it (is the approval
still covering it? is it already done?), recheck the approved stage, replace, read back
before the commit, commit, and read the committed state again. An engine supplies only these
operations; PostgreSQL (:class:`PostgresTarget`) is the first. A lake format (Delta, Iceberg)
adds another implementation: its ``writing`` is a native partition overwrite committed on
exit, and its ``committed_readings`` reads the version it committed.

Readings are the canonical fingerprint of core.fingerprint as dicts, whatever the engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import psycopg

from backfill_assets.core import sqlbuild
from backfill_assets.core.context import Context
from backfill_assets.core.db import ConnectionFactory, read_committed, repeatable_read, transient_errors
from backfill_assets.core.fingerprint import business_key_order

Readings = dict[str, Any]
Checkpoint = Callable[[str, list[str]], None]


def no_checkpoint(step: str, labels: list[str]) -> None:
    """The default checkpoint: go on."""


class TargetWrite(Protocol):
    """One atomic write of some partitions: everything in it commits together on a clean
    exit of :meth:`Target.writing`, or not at all."""

    def readings(self, labels: list[str]) -> dict[str, Readings]:
        """The partitions as this write sees them (before the replace: as they are, with
        other writers kept out; after it: as they will be committed)."""
        ...

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        """Replace the partitions with the approved stage's rows. ``note``: what the commit's
        own metadata records where the engine keeps such metadata (plan id, content hash)."""
        ...


class Target(Protocol):
    """A table whose partitions apply replaces and verifies."""

    def readings(self, labels: list[str]) -> dict[str, Readings]:
        """The partitions as they are now, in the caller's transaction where the engine has one."""
        ...

    def locked(self, labels: list[str]) -> contextlib.AbstractContextManager[None]:
        """Keep every other backfill of these partitions out until the committed state has
        been read back."""
        ...

    def writing(self, labels: list[str]) -> contextlib.AbstractContextManager[TargetWrite]:
        """One atomic write of these partitions, with other writers kept out."""
        ...

    def committed_readings(self, labels: list[str]) -> dict[str, Readings]:
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


def target_for(conn: psycopg.Connection, factory: ConnectionFactory | None, ctx: Context,
               checkpoint: Checkpoint = no_checkpoint) -> Target:
    """The target of a spec, on apply's (or approval's) connection: where another engine
    plugs in. ``factory`` opens the fresh connection committed readings are read on."""
    if ctx.spec.target.is_lake:
        from backfill_assets.core.lake_target import LakeTarget
        return LakeTarget(conn, ctx, checkpoint)
    return PostgresTarget(conn, factory, ctx, checkpoint)


@contextlib.contextmanager
def partition_advisory_locks(conn: psycopg.Connection, ctx: Context, labels: list[str]) -> Iterator[None]:
    """A session advisory lock per (target, partition), taken in one order by every run, so
    that no other backfill of these partitions runs until the caller is done. Each waits at
    most the connection's lock timeout (db.Limits)."""
    spec = ctx.spec
    keys = [f"backfill_assets:target:{spec.target_name}:{label}" for label in sorted(labels)]
    taken: list[str] = []
    try:
        with transient_errors(f"locking partition(s) {', '.join(labels)} of {spec.target_name}"):
            for key in keys:
                conn.execute(*sqlbuild.advisory_lock(key))
                taken.append(key)
        yield
    finally:
        if not conn.closed and not conn.broken:
            for key in taken:
                conn.execute(*sqlbuild.advisory_unlock(key))


class AdvisoryLocked:
    """``Target.locked`` by session advisory locks on apply's connection (every engine's: the
    control schema, and so the locks, live in PostgreSQL). Needs ``conn`` and ``ctx``."""

    conn: psycopg.Connection
    ctx: Context

    @contextlib.contextmanager
    def locked(self, labels: list[str]) -> Iterator[None]:
        with partition_advisory_locks(self.conn, self.ctx, labels):
            yield


class PostgresTarget(AdvisoryLocked):
    """A PostgreSQL table, written on apply's own connection (the stage lives in the same
    database, so its recheck runs in the same transaction as the replace).

    Locks: a session advisory lock per (target, partition), taken in one order by every run
    and held until the committed state is read back; inside the write, ``LOCK TABLE ... IN
    SHARE ROW EXCLUSIVE MODE``, which conflicts with every other writer (row locks cannot
    cover rows not yet inserted) and blocks no reader. Finite lock and statement timeouts.
    """

    def __init__(self, conn: psycopg.Connection, factory: ConnectionFactory | None, ctx: Context,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        self.conn, self.factory, self.ctx, self.checkpoint = conn, factory, ctx, checkpoint
        self._reader: psycopg.Connection | None = None

    def _values(self, labels: list[str]) -> list[object]:
        return [self.ctx.value_of(label) for label in labels]

    def read(self, conn: psycopg.Connection, labels: list[str]) -> dict[str, Readings]:
        rel = self.ctx.spec.target_ref
        return {label: self.ctx.readings(conn, rel, value).as_dict()
                for value, label in zip(self._values(labels), labels)}

    def readings(self, labels: list[str]) -> dict[str, Readings]:
        return self.read(self.conn, labels)

    @contextlib.contextmanager
    def writing(self, labels: list[str]) -> Iterator[TargetWrite]:
        spec = self.ctx.spec
        # READ COMMITTED whatever the server's default: every read after the lock sees every
        # write the lock waited for.
        with transient_errors(f"replacing partition(s) {', '.join(labels)} of {spec.target_name}"), \
                read_committed(self.conn):
            self.conn.execute(sqlbuild.lock_for_replace(spec.target_ref))
            yield _PostgresWrite(self)

    def committed_readings(self, labels: list[str]) -> dict[str, Readings]:
        # A second connection, opened once per apply, and a new transaction on it for each
        # read: it sees only what was committed, never the write's own view.
        if self.factory is None:
            raise TypeError("committed readings need a connection factory")
        try:
            return self._read_committed(labels)
        except psycopg.OperationalError:
            # Dropped while it sat idle (idle_session_timeout, a proxy, a restart): a partition
            # just committed is read again on a new connection, once.
            if self._reader is None or not self._reader.broken:
                raise
            self._reader = None
            return self._read_committed(labels)

    def _read_committed(self, labels: list[str]) -> dict[str, Readings]:
        assert self.factory is not None
        if self._reader is None or self._reader.closed or self._reader.broken:
            self._reader = self.factory()
        with repeatable_read(self._reader, read_only=True):
            return self.read(self._reader, labels)

    def committed_version(self, labels: list[str]) -> str | None:
        return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class _PostgresWrite:
    def __init__(self, target: PostgresTarget) -> None:
        self.target = target

    def readings(self, labels: list[str]) -> dict[str, Readings]:
        return self.target.readings(labels)

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        # PostgreSQL keeps no commit metadata: the ledger row in the control schema, written
        # on the same server, records the plan and the readings.
        t = self.target
        spec, conn = t.ctx.spec, t.conn
        values = t._values(labels)
        for value in values:
            conn.execute(*sqlbuild.delete_partition(spec.target_ref, spec.partition_key, value))
        t.checkpoint("deleted", labels)
        order = business_key_order(t.ctx.target_columns, spec.business_key)
        for value in values:
            conn.execute(*sqlbuild.insert_from_stage(
                spec.target_ref, t.ctx.stage("a"), spec.columns, spec.partition_key, order, value))
        t.checkpoint("inserted", labels)
