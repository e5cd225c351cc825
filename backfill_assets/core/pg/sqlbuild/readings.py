"""Reading a relation: a partition's readings and its format-3 digest in one aggregate
(docs/fingerprint.md), and the row count per partition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import PARTITION_COLUMN, Query, col, cols, key_is_null, key_not_null, table
from backfill_assets.core.vocabulary import TableRef


def in_partition(by: PartitionBy | str, alias: str = "t") -> sql.Composable:
    """A row of ``alias`` is in the partition ``%(partition)s``."""
    by = as_by(by)
    return by.at(alias)


def in_partitions(by: PartitionBy | str, alias: str = "t") -> sql.Composable:
    """A row of ``alias`` is in one of the partitions ``%(partitions)s``."""
    by = as_by(by)
    return by.among(alias)


# --- the format-3 row digest (core.fingerprint.rows is its specification) -------------------

SLICES = 3  # 60-bit slices of each row hash (core.fingerprint.rows.SLICES)
NULL_FIELD = sql.Literal("~")
_DOUBLE = sql.SQL(
    "CASE WHEN {v} = 'NaN'::float8 THEN '7ff8000000000000' ELSE encode(float8send({v}), 'hex') END"
)
# Epoch microseconds from the 8-byte send form (microseconds since 2000-01-01): exact on every
# server version, cheaper than extract(epoch ...) (numeric). Infinities keep their text.
_MICROS = sql.SQL(
    "CASE WHEN isfinite({v}) THEN (('x' || encode({send}({v}), 'hex'))::bit(64)::bigint "
    "+ 946684800000000)::text ELSE {v}::text END"
)
_LENGTH_PREFIXED = sql.SQL("octet_length({v}) || ':' || {v}")
_LENGTH_PREFIXED_CONVERTED = sql.SQL("octet_length(convert_to({v}, 'UTF8')) || ':' || {v}")
_FIELD = {
    "integer": sql.SQL("{v}::text"), "decimal": sql.SQL("{v}::text"), "numeric": sql.SQL("{v}::text"),
    "boolean": sql.SQL("{v}::text"), "date": sql.SQL("{v}::text"), "double": _DOUBLE,
    "bytes": sql.SQL("encode({v}, 'hex')"),
}
# The first 180 bits of the row hash, as a bit string the slices are cut from.
_ROW_BITS = sql.SQL("('x' || encode(substring(sha256(convert_to({text}, 'UTF8')) FROM 1 FOR 23), 'hex'))::bit(180)")
_SLICE = sql.SQL("sum(({b} << {shift})::bit(60)::bigint)")


def _field(alias: str, name: str, kind: str, type_base: str, utf8: bool) -> sql.Composed:
    v = col(alias, name)
    if kind in _FIELD:
        rendered = _FIELD[kind].format(v=v)
    elif kind == "timestamp":
        send = sql.SQL("timestamptz_send" if type_base == "timestamptz" else "timestamp_send")
        rendered = _MICROS.format(v=v, send=send)
    else:  # text, and every other type by its text form
        value = v if kind == "text" else sql.SQL("{}::text").format(v)
        rendered = (_LENGTH_PREFIXED if utf8 else _LENGTH_PREFIXED_CONVERTED).format(v=value)
    return sql.SQL("coalesce({}, {})").format(rendered, NULL_FIELD)


def row_text(alias: str, fields: Sequence[tuple[str, str, str]], utf8: bool) -> sql.Composed:
    """A row's canonical text: ``fields`` are (column, kind, base type) in the declared order.
    ``utf8``: the server encoding is UTF8, so a text's octet_length is its UTF-8 length."""
    return sql.SQL(" || '|' || ").join(_field(alias, n, k, b, utf8) for n, k, b in fields)


_DIGEST = sql.SQL(
    "SELECT {group_out}count(*), {null_keys}, {total}, {slices} "
    "FROM (SELECT {carried}{bits} AS {b}, clock_timestamp() AS {pin} FROM {rel} AS t WHERE {where}) AS h{group_by}"
)
_TOTAL = sql.SQL("coalesce(sum({}), 0)::text")
_NO_TOTAL = sql.SQL("NULL::text")
_NO_KEY = sql.SQL("0")
_BITS, _PIN = "__backfill_bits", "__backfill_pin"


def digest(
    rel: sql.Composable, fields: Sequence[tuple[str, str, str]], where: sql.Composable, params: Mapping[str, Any],
    *, utf8: bool, group_by: sql.Composable | None = None, group_name: Callable[[sql.Composable], sql.Composable] | None = None,
    business_key: Sequence[str] = (), total: str | None = None,
) -> Query:
    """Row count, NULL-key count, exact total and the digest's slice sums of the rows of
    ``rel`` (aliased ``t``) matching ``where``, per ``group_by`` value when given (first
    column; an expression over ``t``, named in the result by ``group_name`` of it): one parallel
    aggregate that sends nothing per row.

    The row hash is computed in a subquery that also selects a volatile, parallel-safe value
    (``clock_timestamp()``): otherwise the planner inlines the subquery into each slice's
    ``sum`` and computes the hash once per slice (``OFFSET 0`` prevents that too, but makes
    the plan serial).
    """
    carried = list(dict.fromkeys(list(business_key) + ([total] if total else [])))
    part = sql.Identifier(PARTITION_COLUMN)
    b = col("h", _BITS)
    query = _DIGEST.format(
        group_out=sql.SQL("{}, ").format((group_name or (lambda k: k))(col("h", PARTITION_COLUMN)))
        if group_by is not None else sql.SQL(""),
        null_keys=sql.SQL("count(*) FILTER (WHERE {})").format(key_is_null("h", business_key)) if business_key else _NO_KEY,
        total=_TOTAL.format(col("h", total)) if total else _NO_TOTAL,
        slices=sql.SQL(", ").join(_SLICE.format(b=b, shift=sql.Literal(60 * i)) for i in range(SLICES)),
        carried=sql.SQL("").join(
            ([sql.SQL("{} AS {}, ").format(group_by, part)] if group_by is not None else [])
            + [sql.SQL("{}, ").format(col("t", c)) for c in carried]),
        bits=_ROW_BITS.format(text=row_text("t", fields, utf8)), b=sql.Identifier(_BITS), pin=sql.Identifier(_PIN),
        rel=rel, where=where,
        group_by=sql.SQL(" GROUP BY {}").format(col("h", PARTITION_COLUMN)) if group_by is not None else sql.SQL(""),
    )
    return query, dict(params)


def partition_readings(
    rel: TableRef, fields: Sequence[tuple[str, str, str]], by: PartitionBy | str, business_key: Sequence[str],
    total: str | None, partitions: Sequence[object], *, utf8: bool,
) -> Query:
    """Per partition among ``partitions`` that has rows: (partition, row count, NULL-key count,
    total text, slice sums...)."""
    by = as_by(by)
    return digest(table(rel), fields, by.among("t"), by.bind(partitions), utf8=utf8,
                  group_by=by.key("t"), group_name=by.name, business_key=business_key, total=total)


_WRITTEN = sql.SQL("WITH {w} AS ({insert} RETURNING {returned}) {readings}")
_SELECTED = sql.SQL("WITH {w} AS ({select}) {readings}")
_WRITTEN_REL = sql.Identifier("__backfill_written")


def written_readings(
    insert: Query, columns: Sequence[str], fields: Sequence[tuple[str, str, str]], business_key: Sequence[str],
    total: str | None, *, utf8: bool, group_by: sql.Composable | None = None,
    group_name: Callable[[sql.Composable], sql.Composable] | None = None, inserts: bool = True,
) -> Query:
    """``insert`` (an INSERT of ``columns``) with the readings and digest of the rows it wrote,
    in the same statement: (row count, NULL-key count, total text, slice sums...), per
    ``group_by`` value when given (first column; an expression over ``t``, the rows written, and
    the parameters of ``insert``). Not ``inserts``: ``insert`` is a SELECT of
    ``columns``, and the readings are those of the rows it selects."""
    query, params = insert
    readings, _ = digest(_WRITTEN_REL, fields, sql.SQL("true"), {}, utf8=utf8, business_key=business_key, total=total,
                         group_by=group_by, group_name=group_name)
    if not inserts:
        return _SELECTED.format(w=_WRITTEN_REL, select=query, readings=readings), params
    return _WRITTEN.format(w=_WRITTEN_REL, insert=query, returned=sql.SQL(", ").join(map(sql.Identifier, columns)),
                           readings=readings), params


_DUPLICATES = sql.SQL(
    "SELECT {g_name}, sum(g.n - 1) FROM (SELECT {d_pk} AS pk, count(*) AS n FROM {rel} AS d "
    "WHERE {d_among} AND {d_key_not_null} GROUP BY 1, {d_key} HAVING count(*) > 1) AS g "
    "GROUP BY g.pk"
)


def duplicate_keys(rel: TableRef, by: PartitionBy | str, business_key: Sequence[str], partitions: Sequence[object]) -> Query:
    """(partition, rows beyond the first per non-NULL business key) of the partitions that have any."""
    by = as_by(by)
    return _DUPLICATES.format(
        d_pk=by.key("d"), g_name=by.name(sql.SQL("g.pk")), d_among=by.among("d"), rel=table(rel),
        d_key_not_null=key_not_null("d", business_key),
        d_key=cols("d", business_key),
    ), by.bind(partitions)


_ROWS_IN = sql.SQL("SELECT count(*) FROM {rel} AS s WHERE {among}")


def rows_in(rel: TableRef, by: PartitionBy | str, partitions: Sequence[object]) -> Query:
    """How many rows of ``rel`` the partitions hold together."""
    by = as_by(by)
    return _ROWS_IN.format(rel=table(rel), among=by.among("s")), by.bind(partitions)


_PARTITION_COUNTS = sql.SQL("SELECT {name}, count(*) FROM {rel} AS s WHERE {among} GROUP BY {pk}")


def partition_counts(rel: TableRef, by: PartitionBy | str, partitions: Sequence[object]) -> Query:
    """Row count per partition of ``rel`` among ``partitions`` (absent partitions: no row)."""
    by = as_by(by)
    key = by.key("s")
    return _PARTITION_COUNTS.format(name=by.name(key), pk=key, among=by.among("s"), rel=table(rel)), by.bind(partitions)
