"""What every engine shares: the locks that keep other backfills of a target's partitions
out (session advisory locks in the control store, the PostgreSQL that keeps plans, approvals
and the ledger, whatever the target's engine), and the transform's check against the
catalog."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Context
from backfill_assets.core.engines.postgres.guard.transform import validate_transform_in_catalog
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.db import transient_errors
from backfill_assets.core.spec import Spec


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


def check_transform(conn: psycopg.Connection, spec: Spec, inspection: Inspection, transform: str | None) -> None:
    """The (parsed) transform_sql against the catalog: the columns, relations and functions it
    reads (core.engines.postgres.guard.transform). Raises TransformError."""
    if transform is not None:
        validate_transform_in_catalog(
            conn, spec.source_ref, [c.name for c in inspection.source_columns],
            spec.partition_key, spec.input_columns, transform, original=spec.transform_sql,
            trusted_functions=spec.trusted_functions,
        )
