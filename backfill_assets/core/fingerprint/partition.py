"""The format-3 fingerprint of partitions held in PostgreSQL (docs/fingerprint.md).

Every reading and the digest come from one aggregate per statement, computed in the server
(a parallel plan where the planner chooses one) and sent as one row per partition:
core.pg.sqlbuild.digest builds it from core.fingerprint.rows, the format's specification.
A stage build gets its readings from the statement that writes it (:func:`written`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.fingerprint import rows
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.vocabulary import TableRef

# From this many rows a digest statement is planned as a parallel aggregate whatever the
# planner's statistics say: a partition written or copied moments ago has none (the planner
# then guesses a few hundred rows and plans serially), and the planner costs a SHA-256 per row
# like any cheap function. Below it, starting workers costs more than they save.
PARALLEL_FROM_ROWS = 20_000
_PARALLEL = ("parallel_setup_cost", "parallel_tuple_cost", "min_parallel_table_scan_size", "min_parallel_index_scan_size")
_SETTINGS_NOW = sql.SQL("SELECT {}").format(sql.SQL(", ").join(
    sql.SQL("current_setting({})").format(sql.Literal(name)) for name in _PARALLEL))
_SET_LOCAL = sql.SQL("SELECT {}").format(sql.SQL(", ").join(
    sql.SQL("set_config({}, {}, true)").format(sql.Literal(name), sql.Placeholder(name)) for name in _PARALLEL))


@contextlib.contextmanager
def one_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """The caller's transaction, or one opened here when there is none: every statement of
    one fingerprint reads the same rows."""
    if conn.info.transaction_status == TransactionStatus.INTRANS:
        yield
    else:
        with conn.transaction():
            yield


@contextlib.contextmanager
def parallel_plan(conn: psycopg.Connection, rows: int) -> Iterator[None]:
    """In the caller's transaction, make the statements run inside plan a parallel aggregate
    when ``rows`` (the rows they will hash) reach :data:`PARALLEL_FROM_ROWS`: parallel work
    costed as free, for this transaction only, and the settings put back after."""
    if rows < PARALLEL_FROM_ROWS:
        yield
        return
    before = conn.execute(_SETTINGS_NOW).fetchone()
    assert before is not None
    conn.execute(_SET_LOCAL, dict.fromkeys(_PARALLEL, "0"))
    try:
        yield
    finally:
        if conn.info.transaction_status == TransactionStatus.INTRANS:
            conn.execute(_SET_LOCAL, dict(zip(_PARALLEL, before)))


def fields(columns: Sequence[ColumnInfo]) -> list[tuple[str, str, str]]:
    """(name, kind, base type) of each column: what the SQL renders each field by."""
    return [(c.name, rows.kind_of(c), c.base_type) for c in columns]


def _digest(columns: Sequence[ColumnInfo], count: object, sums: Sequence[object]) -> tuple[int, str]:
    """(row count, content hash) from an aggregate's count and slice sums (NULL sums: no rows)."""
    n = int(count)  # type: ignore[call-overload]
    return n, rows.content_hash(columns, n, [int(s or 0) for s in sums])  # type: ignore[call-overload]


def _fingerprint(columns: Sequence[ColumnInfo], row: Sequence[object], duplicates: int, total: str | None) -> Fingerprint:
    count, null_keys, total_text, *sums = row
    n, content_hash = _digest(columns, count, sums)
    return Fingerprint(
        row_count=n, null_key_count=int(null_keys),  # type: ignore[call-overload]
        duplicate_key_count=duplicates, total=None if total is None else rows.total_text(total_text if n else None),
        content_hash=content_hash,
    )


def empty(columns: Sequence[ColumnInfo], total: str | None) -> Fingerprint:
    """The readings of a partition without rows."""
    return _fingerprint(columns, (0, 0, None, *([0] * rows.SLICES)), 0, total)


def fingerprint_partitions(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], partition_key: str | sqlbuild.PartitionBy,
    business_key: Sequence[str], total: str | None, partitions: Sequence[object], *, utf8: bool,
    key_unique: bool = False,
) -> list[Fingerprint]:
    """The readings of each of ``partitions`` of ``rel``, in that order, from one aggregate
    over all of them, in the caller's transaction (one REPEATABLE READ transaction, or the
    writing one; :func:`one_transaction` opens one if there is none).

    ``key_unique``: a unique index or constraint covers (partition key, business key), so
    duplicates cannot exist and are not counted (stages have one; a target passes the grain
    check before any read). ``utf8``: the server encoding is UTF8.
    """
    if not partitions:
        return []
    by = sqlbuild.as_by(partition_key)
    query, params = sqlbuild.partition_readings(rel, fields(columns), by, business_key, total,
                                                partitions, utf8=utf8)
    duplicates: dict[object, int] = {}
    with one_transaction(conn):
        with parallel_plan(conn, _rows(conn, rel, by, partitions)):
            found = {row[0]: row[1:] for row in conn.execute(query, params).fetchall()}
        if not key_unique:
            query, params = sqlbuild.duplicate_keys(rel, by, business_key, partitions)
            duplicates = {p: int(n) for p, n in conn.execute(query, params).fetchall()}
    return [
        _fingerprint(columns, found[p], duplicates.get(p, 0), total) if p in found else empty(columns, total)
        for p in partitions
    ]


def fingerprint_partition(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], partition_key: str | sqlbuild.PartitionBy,
    business_key: Sequence[str], total: str | None, partition: object, *, utf8: bool, key_unique: bool = False,
) -> Fingerprint:
    """The readings of one partition (:func:`fingerprint_partitions`)."""
    return fingerprint_partitions(conn, rel, columns, partition_key, business_key, total, [partition],
                                  utf8=utf8, key_unique=key_unique)[0]


def written(
    conn: psycopg.Connection, insert: sqlbuild.Query, columns: Sequence[ColumnInfo], business_key: Sequence[str],
    total: str | None, *, utf8: bool, inserts: bool = True,
) -> Fingerprint:
    """Run ``insert`` (an INSERT of ``columns`` into a table whose unique index covers the
    grain) and return the readings of the rows it wrote, computed in the same statement: the
    rows are hashed as they are written, not read again. Not ``inserts``: ``insert`` is a
    SELECT whose rows are unique on the grain by construction, hashed and not written."""
    query, params = sqlbuild.written_readings(insert, [c.name for c in columns], fields(columns), business_key,
                                              total, utf8=utf8, inserts=inserts)
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return _fingerprint(columns, row, 0, total)


def written_partitions(
    conn: psycopg.Connection, insert: sqlbuild.Query, columns: Sequence[ColumnInfo], partition_key: str | sqlbuild.PartitionBy,
    business_key: Sequence[str], total: str | None, partitions: Sequence[object], *, utf8: bool,
    inserts: bool = True,
) -> list[Fingerprint]:
    """:func:`written` for an INSERT (or a SELECT) of several partitions (``%(batch)s``): the
    readings of each of ``partitions``, in that order, from the rows the statement wrote (or
    selected)."""
    by = sqlbuild.as_by(partition_key)
    query, params = sqlbuild.written_readings(insert, [c.name for c in columns], fields(columns), business_key,
                                              total, utf8=utf8, group_by=by.key("t", "batch"),
                                              group_name=lambda key: by.name(key, "batch"), inserts=inserts)
    found = {row[0]: row[1:] for row in conn.execute(query, params).fetchall()}
    return [_fingerprint(columns, found[p], 0, total) if p in found else empty(columns, total) for p in partitions]


def rows_digest(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], where: sql.Composable,
    params: dict[str, object], *, utf8: bool,
) -> tuple[int, str]:
    """(row count, content hash) of the rows of ``rel`` (aliased ``t``) matching ``where``,
    independent of their order: a source has no key, and the digest needs none."""
    query, params = sqlbuild.digest(sqlbuild.table(rel), fields(columns), where, params, utf8=utf8)
    row = conn.execute(query, params).fetchone()
    assert row is not None
    count, _, _, *sums = row
    return _digest(columns, count, sums)


def partitions_digest(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], partition_key: str | sqlbuild.PartitionBy,
    partitions: Sequence[object], *, utf8: bool,
) -> list[tuple[int, str]]:
    """(row count, content hash) of each of ``partitions`` of a source-shaped relation, in that
    order, from one aggregate over all of them."""
    by = sqlbuild.as_by(partition_key)
    query, params = sqlbuild.digest(sqlbuild.table(rel), fields(columns), by.among("t"), by.bind(partitions),
                                    utf8=utf8, group_by=by.key("t"), group_name=by.name)
    with one_transaction(conn), parallel_plan(conn, _rows(conn, rel, by, partitions)):
        found = {row[0]: row[1:] for row in conn.execute(query, params).fetchall()}
    empty = (0, 0, None, *([0] * rows.SLICES))
    return [_digest(columns, row[0], row[3:]) for row in (found.get(p, empty) for p in partitions)]


def _rows(conn: psycopg.Connection, rel: TableRef, by: sqlbuild.PartitionBy, partitions: Sequence[object]) -> int:
    """How many rows the partitions hold: a count costs a small part of the digest (a pass
    without hashing, through the partition key's index where there is one), and decides
    whether it is planned in parallel (:func:`parallel_plan`)."""
    row = conn.execute(*sqlbuild.rows_in(rel, by, list(partitions))).fetchone()
    return int(row[0]) if row else 0
