"""Snapshot and stage tables: empty copies, copying partitions in, indexes, the seal
checks (which transaction wrote the rows) and dropping.
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import OrderKey, Query, cols, table
from backfill_assets.core.vocabulary import TableRef

_CREATE_COPY_OF = sql.SQL("CREATE {unlogged}TABLE {new} AS SELECT {cols} FROM {rel} AS s WITH NO DATA")
_INSERT_PARTITIONS = sql.SQL(
    "INSERT INTO {new} ({cols}) SELECT {s_cols} FROM {rel} AS s WHERE {among}"
)
_CREATE_INDEX = sql.SQL("CREATE INDEX ON {rel} ({items})")
_CREATE_UNIQUE_INDEX = sql.SQL("CREATE UNIQUE INDEX ON {rel} ({items})")
_DROP_TABLE = sql.SQL("DROP TABLE IF EXISTS {rel}")
_RENAME_TABLE = sql.SQL("ALTER TABLE {rel} RENAME TO {name}")
_CURRENT_TXID = sql.SQL("SELECT txid_current()")


def create_empty_copy(new: TableRef, rel: TableRef, columns: Sequence[str], *, unlogged: bool) -> sql.Composed:
    """A new empty table with ``columns`` of ``rel``, in that order and with their types."""
    return _CREATE_COPY_OF.format(
        unlogged=sql.SQL("UNLOGGED ") if unlogged else sql.SQL(""), new=table(new),
        cols=cols("s", columns), rel=table(rel),
    )


def copy_partitions(new: TableRef, rel: TableRef, columns: Sequence[str], by: PartitionBy | str,
                    partitions: Sequence[object]) -> Query:
    """Copy the rows of ``partitions`` from ``rel`` into ``new``."""
    by = as_by(by)
    return _INSERT_PARTITIONS.format(
        new=table(new), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=cols("s", columns), rel=table(rel), among=by.among("s"),
    ), by.bind(partitions)


def create_index(rel: TableRef, keys: Sequence[OrderKey], *, unique: bool = False) -> sql.Composed:
    """An index whose order serves the given ORDER BY (``COLLATE "C"`` where asked)."""
    items = sql.SQL(", ").join(
        sql.SQL(" ").join(
            [sql.Identifier(k.column), *([sql.SQL('COLLATE "C"')] if k.collate_c else [])]
        )
        for k in keys
    )
    return (_CREATE_UNIQUE_INDEX if unique else _CREATE_INDEX).format(rel=table(rel), items=items)


_COPY_WRITER = sql.SQL("SELECT t.xmin::text FROM {rel} AS t LIMIT 1")
_COPY_SEAL_CHECK = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE t.xmin IS DISTINCT FROM %(writer)s::xid) FROM {rel} AS t"
)
_DROPPED_COLUMNS = sql.SQL(
    "SELECT count(*) FROM pg_catalog.pg_attribute AS a "
    "JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND a.attnum > 0 AND a.attisdropped"
)


_PARTITION_SEAL_CHECK = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE t.xmin IS DISTINCT FROM %(writer)s::xid) "
    "FROM {rel} AS t WHERE {at}"
)


_BATCH_SEAL_CHECK = sql.SQL(
    "SELECT {name}, count(*), count(*) FILTER (WHERE t.xmin IS DISTINCT FROM %(writer)s::xid) "
    "FROM {rel} AS t WHERE {among} GROUP BY {pk}"
)


def batch_seal_check(rel: TableRef, by: PartitionBy | str, batch: Sequence[object], writer: str | None) -> Query:
    """Per partition of ``batch`` with rows: (partition, rows, rows another transaction than
    ``writer`` wrote; with no writer, every row), in one pass without a sort or a hash."""
    by = as_by(by)
    key = by.key("t", "batch")
    return _BATCH_SEAL_CHECK.format(rel=table(rel), pk=key, name=by.name(key, "batch"), among=by.among("t", "batch")), {
        **by.bind(batch, "batch"), "writer": writer,
    }


_SEALABLE = sql.SQL(
    "SELECT c.relkind = 'r' AND NOT c.relrowsecurity "
    "AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS g WHERE g.tgrelid = c.oid) "
    "AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_rewrite AS r WHERE r.ev_class = c.oid) "
    "AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits AS h WHERE h.inhparent = c.oid) "
    "FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s"
)


def sealable(rel: TableRef) -> Query:
    """Whether nothing but the statements a transaction runs can change ``rel``'s rows in it,
    or at its commit: a plain table (not partitioned, no inheritance children) with no
    trigger of any kind (a deferred one fires at the commit), no rule and no row security."""
    return _SEALABLE, {"schema": rel.schema, "name": rel.name}


def partition_seal_check(rel: TableRef, by: PartitionBy | str, partition: object, writer: str | None) -> Query:
    """Rows of one partition, and how many of them another transaction than ``writer`` wrote."""
    by = as_by(by)
    return _PARTITION_SEAL_CHECK.format(rel=table(rel), at=by.at("t")), {**by.bind_one(partition), "writer": writer}


def copy_writer(rel: TableRef) -> sql.Composed:
    """The transaction that wrote a row of ``rel`` (its xmin), for a table one statement filled."""
    return _COPY_WRITER.format(rel=table(rel))


def copy_seal_check(rel: TableRef, writer: str | None) -> Query:
    """Rows of ``rel``, and how many of them another transaction than ``writer`` wrote."""
    return _COPY_SEAL_CHECK.format(rel=table(rel)), {"writer": writer}


def dropped_columns(rel: TableRef) -> Query:
    """How many dropped columns a table has (a column dropped and added again keeps xmin)."""
    return _DROPPED_COLUMNS, {"schema": rel.schema, "name": rel.name}


def current_txid() -> sql.Composed:
    """The 64-bit id of the current transaction (assigning one if it has none yet)."""
    return _CURRENT_TXID.format()


def rename_table(rel: TableRef, name: str) -> sql.Composed:
    """Rename a table within its schema."""
    return _RENAME_TABLE.format(rel=table(rel), name=sql.Identifier(name))


def drop_table(rel: TableRef) -> sql.Composed:
    """Drop a table if it exists."""
    return _DROP_TABLE.format(rel=table(rel))


_ADD_UNIQUE = sql.SQL("ALTER TABLE {rel} ADD CONSTRAINT {name} UNIQUE ({cols})")


def add_unique_constraint(rel: TableRef, name: str, columns: Sequence[str]) -> sql.Composed:
    """The DDL a user runs to give the target its grain constraint."""
    return _ADD_UNIQUE.format(
        rel=table(rel), name=sql.Identifier(name),
        cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
    )
