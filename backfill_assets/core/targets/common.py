"""What every engine shares: the locks that keep other backfills of a target's partitions
out (session advisory locks in the control store, the PostgreSQL that keeps plans, approvals
and the ledger, whatever the target's engine)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from backfill_assets.core.context import Context
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.db import transient_errors


@contextlib.contextmanager
def partition_advisory_locks(control: psycopg.Connection, ctx: Context, labels: list[str]) -> Iterator[None]:
    """A session advisory lock per (target, partition), taken in one order by every run, so
    that no other backfill of these partitions runs until the caller is done. Each waits at
    most the connection's lock timeout (vocabulary.Limits)."""
    spec = ctx.spec
    keys = [f"backfill_assets:target:{spec.target_name}:{label}" for label in sorted(labels)]
    taken: list[str] = []
    try:
        with transient_errors(f"locking partition(s) {', '.join(labels)} of {spec.target_name}"):
            for key in keys:
                control.execute(*sqlbuild.advisory_lock(key))
                taken.append(key)
        yield
    finally:
        if not control.closed and not control.broken:
            for key in taken:
                control.execute(*sqlbuild.advisory_unlock(key))


class AdvisoryLocked:
    """``Target.locked`` by session advisory locks on the control store's connection (every
    engine's: the control store, and so the locks, live in PostgreSQL). Needs ``control``
    and ``ctx``."""

    control: psycopg.Connection
    ctx: Context

    @contextlib.contextmanager
    def locked(self, labels: list[str]) -> Iterator[None]:
        with partition_advisory_locks(self.control, self.ctx, labels):
            yield
