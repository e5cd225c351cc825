"""Reading a relation: the canonical COPY stream a fingerprint hashes, a partition's
readings (rows, NULL keys, total, duplicates) and the row count per partition.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.parts import (
    OrderKey,
    Query,
    col,
    cols,
    key_is_null,
    key_not_null,
    order_by,
    table,
)
from backfill_assets.core.vocabulary import TableRef

_COPY_STREAM = sql.SQL(
    "COPY (SELECT {text_cols} FROM {rel} AS t WHERE {where} ORDER BY {order}) "
    "TO STDOUT (FORMAT binary)"
)
_IN_PARTITION = sql.SQL("{pk} = %(partition)s")


_SNAPSHOT_STREAM = sql.SQL(
    "COPY (SELECT {values} FROM {rel} AS t WHERE {where} ORDER BY {order}) TO STDOUT (FORMAT binary)"
)
_AS_TEXT = sql.SQL("{}::text")
_SORT_TYPED = sql.SQL("{} ASC NULLS LAST")
_SORT_TYPED_C = sql.SQL('{} COLLATE "C" ASC NULLS LAST')
_SORT_TEXT = sql.SQL('{}::text COLLATE "C" ASC NULLS LAST')


def copy_snapshot_stream(
    rel: TableRef, columns: Sequence[tuple[str, bool, bool]], where: sql.Composable, params: Mapping[str, Any],
) -> Query:
    """Binary COPY of the rows of ``rel`` (aliased ``t``) matching ``where``, in a total
    order of their values: the stream a snapshot's content hash is taken over.

    ``columns`` are ``(name, exact, collatable)``. An exact column is sent as its typed
    binary value and sorted as a typed value (by bytes when collatable); any other column is
    sent and sorted as its text form, by bytes. Rows equal on every sort item are then equal
    byte for byte in the stream, so the digest does not depend on which of them comes first.
    """
    values, order = [], []
    for name, exact, collatable in columns:
        c = col("t", name)
        values.append(c if exact else _AS_TEXT.format(c))
        order.append((_SORT_TYPED_C if collatable else _SORT_TYPED).format(c) if exact else _SORT_TEXT.format(c))
    query = _SNAPSHOT_STREAM.format(
        values=sql.SQL(", ").join(values), rel=table(rel), where=where, order=sql.SQL(", ").join(order),
    )
    return query, dict(params)


def in_partition(partition_key: str, alias: str = "t") -> sql.Composed:
    """``alias.partition_key = %(partition)s``."""
    return _IN_PARTITION.format(pk=col(alias, partition_key))


def copy_canonical_stream(
    rel: TableRef, columns: Sequence[str], where: sql.Composable, order: Sequence[OrderKey],
    params: Mapping[str, Any],
) -> Query:
    """Binary COPY of the rows of ``rel`` (aliased ``t``) matching ``where``, every column
    cast to text, in ``order``. Parameters are bound by psycopg on the client (COPY takes none).

    The ORDER BY names the table alias, never the text output column (a text sort would
    give another order and another digest).
    """
    text_cols = sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", c)) for c in columns)
    query = _COPY_STREAM.format(
        text_cols=text_cols, rel=table(rel), where=where, order=order_by("t", order),
    )
    return query, dict(params)


_READINGS_UNIQUE = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE {key_null}), {total}, 0 "
    "FROM {rel} AS t WHERE {pk} = %(partition)s"
)


def _total_expr(total: str | None) -> sql.Composable:
    if total is None:
        return sql.SQL("NULL::text")
    return sql.SQL("coalesce(sum({}), 0)::text").format(col("t", total))


_READINGS = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE {key_null}), {total}, "
    "(SELECT coalesce(sum(g.n - 1), 0) FROM "
    "(SELECT count(*) AS n FROM {rel} AS d WHERE {d_pk} = %(partition)s AND {d_key_not_null} "
    "GROUP BY {d_key} HAVING count(*) > 1) AS g) "
    "FROM {rel} AS t WHERE {pk} = %(partition)s"
)


def partition_readings(
    rel: TableRef, partition_key: str, business_key: Sequence[str], total: str | None,
    partition: object, *, key_unique: bool = False,
) -> Query:
    """Row count, NULL-key count, exact total (text) and duplicate-key count of a partition.

    With ``key_unique`` (a unique index or constraint on the relation covers the grain, so
    the server itself rules duplicates out) the duplicate count is 0 without a GROUP BY.
    """
    if key_unique:
        return _READINGS_UNIQUE.format(
            key_null=key_is_null("t", business_key), total=_total_expr(total), rel=table(rel),
            pk=col("t", partition_key),
        ), {"partition": partition}
    query = _READINGS.format(
        key_null=key_is_null("t", business_key), total=_total_expr(total), rel=table(rel),
        d_pk=col("d", partition_key), d_key_not_null=key_not_null("d", business_key),
        d_key=cols("d", business_key), pk=col("t", partition_key),
    )
    return query, {"partition": partition}



_PARTITION_COUNTS = sql.SQL(
    "SELECT {pk}, count(*) FROM {rel} AS s WHERE {pk} = ANY(%(partitions)s) GROUP BY {pk}"
)


def partition_counts(rel: TableRef, partition_key: str, partitions: list) -> Query:
    """Row count per partition of ``rel`` among ``partitions`` (absent partitions: no row)."""
    return _PARTITION_COUNTS.format(pk=col("s", partition_key), rel=table(rel)), {
        "partitions": partitions
    }
