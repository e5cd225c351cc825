"""Replacing target partitions: advisory and table locks, the insert from a stage, and
whether a stage has its unique index.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import OrderKey, Query, cols, order_by, table
from backfill_assets.core.vocabulary import TableRef

_ADVISORY_LOCK = sql.SQL("SELECT pg_advisory_lock(hashtextextended(%(key)s, 0))")
_ADVISORY_XACT_LOCK = sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))")
_ADVISORY_UNLOCK = sql.SQL("SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0))")
_LOCK_TABLE = sql.SQL("LOCK TABLE {rel} IN SHARE ROW EXCLUSIVE MODE")
_INSERT_FROM_STAGE = sql.SQL(
    "INSERT INTO {target} ({cols}) SELECT {s_cols} FROM {stage} AS s "
    "WHERE {s_at} ORDER BY {order}"
)


def advisory_lock(key: str) -> Query:
    """A session advisory lock on ``key`` (waits, bounded by lock_timeout)."""
    return _ADVISORY_LOCK, {"key": key}


def advisory_xact_lock(key: str) -> Query:
    """An advisory lock on ``key`` held until the end of the transaction (waits, bounded by
    lock_timeout)."""
    return _ADVISORY_XACT_LOCK, {"key": key}


def advisory_unlock(key: str) -> Query:
    """Release a session advisory lock on ``key``."""
    return _ADVISORY_UNLOCK, {"key": key}


def lock_for_replace(rel: TableRef) -> sql.Composed:
    """A table lock that keeps every other writer out while readers go on reading.

    SHARE ROW EXCLUSIVE conflicts with ROW EXCLUSIVE (any INSERT, UPDATE, DELETE) and with
    itself, but not with ACCESS SHARE (SELECT).
    """
    return _LOCK_TABLE.format(rel=table(rel))


_LOCK_SHARE = sql.SQL("LOCK TABLE {rel} IN SHARE MODE")
_LOCK_ACCESS_SHARE = sql.SQL("LOCK TABLE {rel} IN ACCESS SHARE MODE")
LOCKABLE_KINDS = ("r", "p", "v")  # pg_class.relkind that LOCK TABLE takes (a view locks its base tables)


def lock_for_snapshot(rel: TableRef) -> sql.Composed:
    """The lock a SELECT would take (ACCESS SHARE), taken as a REPEATABLE READ transaction's
    first statement, before its snapshot: a TRUNCATE or a table rewrite, which are not MVCC-safe
    (a snapshot taken before one commits sees the table empty or rewritten), then either
    commits before the snapshot is taken or waits until the transaction ends."""
    return _LOCK_ACCESS_SHARE.format(rel=table(rel))


def lock_against_writers(rel: TableRef) -> sql.Composed:
    """A table lock (SHARE) under which nobody can change the table but anyone can read it."""
    return _LOCK_SHARE.format(rel=table(rel))


# The transaction (or subtransaction) that wrote the rows, from the INSERT itself: a data-
# modifying WITH runs to completion whatever its reader takes, and reading a just-written
# row back by its partition instead could scan the whole table to find one.
_WRITER_OF = sql.SQL("WITH w AS ({insert} RETURNING xmin) SELECT w.xmin::text FROM w LIMIT 1")


def insert_from_stage(
    target: TableRef, stage: TableRef, columns: Sequence[str], by: PartitionBy | str,
    order: Sequence[OrderKey], partition: object, *, writer: bool = False,
) -> Query:
    """Insert one stage partition into the target, with explicit columns in declared order;
    with ``writer``, the statement returns the xmin its rows carry (no row: none inserted)."""
    by = as_by(by)
    insert = _INSERT_FROM_STAGE.format(
        target=table(target), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=cols("s", columns), stage=table(stage), s_at=by.at("s"),
        order=order_by("s", order),
    )
    return (_WRITER_OF.format(insert=insert) if writer else insert), by.bind_one(partition)


_HAS_UNIQUE_INDEX = sql.SQL(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i "
    "JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND i.indisunique)"
)


def has_unique_index(rel: TableRef) -> Query:
    """Whether ``rel`` has any unique index (the stage's one is on the grain)."""
    return _HAS_UNIQUE_INDEX, {"schema": rel.schema, "name": rel.name}
