"""Bounded waits, explained: a wait that ran out says what it waited for.

Every connection carries the spec's lock and statement timeouts from its first byte
(vocabulary.Limits), so no wait of the tool lasts longer than them. PostgreSQL's lock timeout says
only "canceling statement due to lock timeout"; the front-ends (the command line, each Dagster
step and sensor tick) pass what ends their work through :func:`explained_waits`, which maps any
timeout still in the driver's form onto :class:`TransientDatabaseError` and, for a lock wait,
names the locks other sessions hold on the spec's relations (source, target, everything in
the control schema: snapshot copies, stages, plans, approvals, ledger; and an Iceberg SQL
catalog's tables when it lives in the spec's database), read on a fresh connection once the
waiting transaction is gone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql

from backfill_assets.core.errors import BackfillError, HeldLock, TransientDatabaseError
from backfill_assets.core.pg.db import ConnectionFactory, as_transient
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for

# At most this many held locks are named, the strongest first.
MOST_NAMED = 5

# Granted relation locks of other sessions of this database on the spec's tables (and views):
# everything in the control schema, and the source and target with their partitions (a lock
# on one partition of a partitioned table blocks a read of it). A row locked FOR UPDATE shows
# as its table's ROW SHARE lock. Plain readers' ACCESS SHARE locks come last: they block only
# the tool's own DDL on its stages and snapshot copies.
_HELD = sql.SQL(
    "SELECT n.nspname, c.relname, l.mode, l.pid FROM pg_locks AS l "
    "JOIN pg_class AS c ON c.oid = l.relation JOIN pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid() "
    "AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database()) "
    "AND c.relkind IN ('r', 'p', 'v', 'm', 'f') "
    "AND (n.nspname = %(control)s OR c.relname = ANY(%(catalog)s::text[]) "
    "OR (n.nspname, c.relname) IN (SELECT w.s, w.r FROM unnest(%(schemas)s::text[], %(names)s::text[]) AS w(s, r)) "
    "OR c.oid IN (SELECT t.relid FROM unnest(%(schemas)s::text[], %(names)s::text[]) AS w(s, r) "
    "JOIN pg_namespace AS bn ON bn.nspname = w.s JOIN pg_class AS b ON b.relnamespace = bn.oid AND b.relname = w.r "
    "CROSS JOIN LATERAL pg_partition_tree(b.oid) AS t WHERE b.relkind IN ('r', 'p'))) "
    "ORDER BY array_position(%(modes)s::text[], l.mode::text), n.nspname, c.relname, l.pid LIMIT %(most)s"
)


# Lock modes, strongest first: the order locks are named in.
_MODES = ("AccessExclusiveLock", "ExclusiveLock", "ShareRowExclusiveLock", "ShareLock", "ShareUpdateExclusiveLock",
          "RowShareLock", "RowExclusiveLock", "AccessShareLock")


def _strongest(lock: HeldLock) -> tuple[int, str, int]:
    return (_MODES.index(lock.mode) if lock.mode in _MODES else len(_MODES), lock.relation, lock.pid)


def held_locks(conn: psycopg.Connection, spec: Spec, *, control_only: bool = False) -> list[HeldLock]:
    """The locks other sessions hold now on the spec's relations in ``conn``'s database,
    strongest first. ``control_only``: the control schema alone (a control store of its own)."""
    target_tables, catalog_tables = ([], []) if control_only else engine_for(spec).held_elsewhere()
    # A lake, JDBC or catalog source is not a table of this database.
    source = [] if control_only or spec.source.format != "postgres" else [spec.source_ref]
    tables = [*source, *([] if control_only else target_tables)]
    rows = conn.execute(_HELD, {
        "control": spec.control_schema, "schemas": [t.schema for t in tables],
        "names": [t.name for t in tables], "most": MOST_NAMED, "modes": list(_MODES),
        "catalog": catalog_tables,
    }).fetchall()
    return [HeldLock(f"{schema}.{name}", mode, pid) for schema, name, mode, pid in rows]


def explain(err: BaseException, factory: ConnectionFactory, spec: Spec) -> BackfillError | None:
    """``err`` as the tool reports it: a driver's timeout, serialization failure or deadlock
    as a :class:`TransientDatabaseError`, and a lock wait naming what other sessions hold;
    None for any other error.

    Naming needs a connection of its own (the waiting one may sit in an aborted
    transaction); if that fails too, the error is reported without the names.
    """
    if not isinstance(err, BackfillError):
        err = as_transient(err, f"a statement of spec {spec.name}")
    if not isinstance(err, TransientDatabaseError):
        return None
    if not err.lock_wait or err.held:
        return err
    try:
        with factory() as conn:
            held = held_locks(conn, spec)
            if factory.separate:  # the control store's tables live in a database of their own
                with factory.control(conn) as store:
                    held = sorted([*held, *held_locks(store, spec, control_only=True)], key=_strongest)[:MOST_NAMED]
    except (psycopg.Error, BackfillError):
        return err
    return err.naming(held) if held else err


@contextlib.contextmanager
def explained_waits(factory: ConnectionFactory, spec: Spec) -> Iterator[None]:
    """Run a command or step so that what ends it by a timeout is a
    :class:`TransientDatabaseError` that names what it waited for (see :func:`explain`)."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - only timeouts are changed; the rest is raised as it was
        explained = explain(err, factory, spec)
        if explained is None or explained is err:
            raise
        raise explained from err
