"""Comparing two relations' partitions row by row: a keyed comparison of the canonical text
forms (core.diff), one pass over each side, inside the server."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.spec import TableRef
from backfill_assets.core.sqlbuild.parts import OrderKey, Query, col, cols, order_by, table

# Each side: its keys (typed) and a 64-bit digest of the row's canonical text forms.
# ROW(text, ...)::text quotes every value as needed and writes NULL as nothing and '' as "",
# so equal digests mean equal text forms ('-0' and '0', '1.5' and '1.50', NULL and '' differ),
# short of a digest collision (about 1 in 2^64 per changed row). The diff only explains; what
# decides a plan or a verification is the SHA-256 fingerprint over the full text forms.
_SIDE = sql.SQL(
    "SELECT {keys}, hashtextextended(ROW({texts})::text, 0) AS __h FROM {rel} AS t WHERE {pk} = %(partition)s"
)
_KIND = sql.SQL(
    "CASE WHEN b.__h IS NULL THEN 'added' WHEN a.__h IS NULL THEN 'removed' "
    "WHEN a.__h <> b.__h THEN 'changed' ELSE 'unchanged' END"
)
_COALESCE = sql.SQL("coalesce({}, {}) AS {}")
_EQUAL = sql.SQL("{} = {}")
_VALUES = sql.SQL("(SELECT ARRAY[{texts}] FROM {rel} AS t WHERE {pk} = %(partition)s AND {match})")
# The counts, then up to %(limit)s differing keys in key order, each with both sides' text
# forms (looked up by key: a few index reads). The join is materialized once.
_DIFF = sql.SQL(
    "WITH j AS MATERIALIZED (SELECT {kind} AS __kind, {keys} FROM ({left}) AS a FULL JOIN ({right}) AS b ON {on}) "
    "SELECT 'count' AS __row, __kind, count(*) AS __n, NULL::text[] AS __key, NULL::text[] AS __a, "
    "NULL::text[] AS __b FROM j GROUP BY __kind "
    "UNION ALL (SELECT 'example', j.__kind, NULL, ARRAY[{key_texts}], {left_values}, {right_values} FROM j "
    "WHERE j.__kind <> 'unchanged' ORDER BY {order} LIMIT %(limit)s)"
)


def _side(rel: TableRef, partition_key: str, business_key: Sequence[str], columns: Sequence[str]) -> sql.Composed:
    return _SIDE.format(
        keys=cols("t", business_key),
        texts=sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", c)) for c in columns),
        rel=table(rel), pk=col("t", partition_key),
    )


def _values(rel: TableRef, partition_key: str, business_key: Sequence[str], columns: Sequence[str]) -> sql.Composed:
    return _VALUES.format(
        texts=sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", c)) for c in columns),
        rel=table(rel), pk=col("t", partition_key),
        match=sql.SQL(" AND ").join(_EQUAL.format(col("t", k), col("j", k)) for k in business_key),
    )


def partition_diff(
    left: TableRef, right: TableRef, partition_key: str, order: Sequence[OrderKey], columns: Sequence[str],
    partition: object, limit: int,
) -> Query:
    """One partition of ``left`` (the rows that would be written) against the same partition
    of ``right`` (what is there), keyed by the business key (``order``, its ascending order,
    text by bytes): per kind (``added``: in left only, ``removed``: in right only,
    ``changed``, ``unchanged``) a count row, then up to ``limit`` example rows of the
    differing keys, in key order.

    Rows: (``'count'`` or ``'example'``, kind, count, key texts, left's texts, right's texts)."""
    business_key = [k.column for k in order]
    query = _DIFF.format(
        kind=_KIND,
        keys=sql.SQL(", ").join(_COALESCE.format(col("a", k), col("b", k), sql.Identifier(k)) for k in business_key),
        left=_side(left, partition_key, business_key, columns),
        right=_side(right, partition_key, business_key, columns),
        on=sql.SQL(" AND ").join(_EQUAL.format(col("a", k), col("b", k)) for k in business_key),
        key_texts=sql.SQL(", ").join(sql.SQL("{}::text").format(col("j", k)) for k in business_key),
        left_values=_values(left, partition_key, business_key, columns),
        right_values=_values(right, partition_key, business_key, columns),
        order=order_by("j", order),
    )
    return query, {"partition": partition, "limit": limit}


# For the caller's transaction: a parallel hash full join over both sides (PostgreSQL 16 can),
# which the default costs do not pick for a join of one partition.
_PREFER_PARALLEL = sql.SQL(
    "SELECT set_config('parallel_setup_cost', '10', true), set_config('parallel_tuple_cost', '0.001', true)"
)


def prefer_parallel() -> sql.Composed:
    """Make the diff's join run in parallel workers where the server can (current transaction)."""
    return sql.Composed([_PREFER_PARALLEL])


_SELECT_COLUMNS = sql.SQL("SELECT {cols} FROM {rel} AS t")


def select_columns(rel: TableRef, columns: Sequence[str]) -> sql.Composed:
    """``SELECT`` of ``columns`` of ``rel``: a relation to type a temporary table after."""
    return _SELECT_COLUMNS.format(cols=sql.SQL(", ").join(col("t", c) for c in columns), rel=table(rel))
