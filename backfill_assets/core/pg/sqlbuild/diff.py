"""Comparing two relations' partitions row by row: a keyed comparison of the canonical text
forms (core.diff), one pass over each side, inside the server."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, WholeBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import OrderKey, Query, col, cols, order_by, table
from backfill_assets.core.vocabulary import TableRef

# Each side: its keys and a 64-bit digest of the row's canonical text forms.
# ROW(text, ...)::text quotes every value as needed and writes NULL as nothing and '' as "",
# so equal digests mean equal text forms ('-0' and '0', '1.5' and '1.50', NULL and '' differ),
# short of a digest collision (about 1 in 2^64 per changed row). The diff only explains; what
# decides a plan or a verification is the format-3 fingerprint (docs/fingerprint.md).
_SIDE = sql.SQL(
    "SELECT {keys}, true AS __present, hashtextextended(ROW({texts})::text, 0) AS __h "
    "FROM {rel} AS t WHERE {at}"
)
# A side that may hold a key more than once (a lake table enforces no key): one row per key,
# with no digest where the key repeats, so that it counts once, as changed.
_SIDE_BY_KEY = sql.SQL(
    "SELECT {keys}, true AS __present, CASE WHEN count(*) = 1 THEN min(s.__h) END AS __h "
    "FROM ({side}) AS s GROUP BY {keys}"
)
_KIND = sql.SQL(
    "CASE WHEN b.__present IS NULL THEN 'added' WHEN a.__present IS NULL THEN 'removed' "
    "WHEN a.__h IS DISTINCT FROM b.__h THEN 'changed' ELSE 'unchanged' END"
)
_KEY_TEXT = sql.SQL("{}::text AS {}")
_COALESCE = sql.SQL("coalesce({}, {}) AS {}")
_EQUAL = sql.SQL("{} = {}")
_EQUAL_TEXT = sql.SQL("{}::text = {}")
_VALUES = sql.SQL("(SELECT ARRAY[{texts}] FROM {rel} AS t WHERE {at} AND {match} LIMIT 1)")
# The counts, then up to %(limit)s differing keys in key order, each with both sides' text
# forms (looked up by key: a few index reads). The join is materialized once.
_DIFF = sql.SQL(
    "WITH j AS MATERIALIZED (SELECT {kind} AS __kind, {keys} FROM ({left}) AS a FULL JOIN ({right}) AS b ON {on}) "
    "SELECT 'count' AS __row, __kind, count(*) AS __n, NULL::text[] AS __key, NULL::text[] AS __a, "
    "NULL::text[] AS __b FROM j GROUP BY __kind "
    "UNION ALL (SELECT 'example', j.__kind, NULL, ARRAY[{key_texts}], {left_values}, {right_values} FROM j "
    "WHERE j.__kind <> 'unchanged' ORDER BY {order} LIMIT %(limit)s)"
)


def _texts(columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", c)) for c in columns)


def _side(rel: TableRef, by: PartitionBy | str, business_key: Sequence[str], columns: Sequence[str],
          *, as_text: bool, param: str) -> sql.Composed:
    by = as_by(by)
    keys = (sql.SQL(", ").join(_KEY_TEXT.format(col("t", k), sql.Identifier(k)) for k in business_key)
            if as_text else cols("t", business_key))
    return _SIDE.format(keys=keys, texts=_texts(columns), rel=table(rel), at=by.at("t", param))


def _values(rel: TableRef, by: PartitionBy | str, business_key: Sequence[str], columns: Sequence[str],
            *, as_text: bool, param: str) -> sql.Composed:
    by = as_by(by)
    equal = _EQUAL_TEXT if as_text else _EQUAL
    return _VALUES.format(
        texts=_texts(columns), rel=table(rel), at=by.at("t", param),
        match=sql.SQL(" AND ").join(equal.format(col("t", k), col("j", k)) for k in business_key),
    )


def partition_diff(
    left: TableRef, right: TableRef, by: PartitionBy | str, order: Sequence[OrderKey], columns: Sequence[str],
    partition: object, limit: int, *, right_as_text: object = None,
) -> Query:
    """One partition of ``left`` (the rows that would be written) against the same partition
    of ``right`` (what is there), keyed by the business key (``order``, its ascending order,
    text by bytes): per kind (``added``: in left only, ``removed``: in right only,
    ``changed``, ``unchanged``) a count row, then up to ``limit`` example rows of the
    differing keys, in key order.

    ``right_as_text`` (given: the partition's label): ``right`` holds every column as text (a
    lake partition's canonical text forms), that partition's rows alone. Both sides are then keyed by the text
    forms of their keys (examples in that order), and a key ``right`` holds more than once
    counts once, as changed.

    Rows: (``'count'`` or ``'example'``, kind, count, key texts, left's texts, right's texts)."""
    by = as_by(by)
    business_key = [k.column for k in order]
    as_text = right_as_text is not None
    # As text, ``right`` holds the one partition's rows alone (a window's column text is not
    # its label): read whole.
    right_by: PartitionBy = WholeBy(by.column) if as_text else by
    right_side = _side(right, right_by, business_key, columns, as_text=False, param="right_partition")
    if as_text:
        right_side = _SIDE_BY_KEY.format(keys=sql.SQL(", ").join(sql.Identifier(k) for k in business_key),
                                         side=right_side)
    query = _DIFF.format(
        kind=_KIND,
        keys=sql.SQL(", ").join(_COALESCE.format(col("a", k), col("b", k), sql.Identifier(k)) for k in business_key),
        left=_side(left, by, business_key, columns, as_text=as_text, param="partition"),
        right=right_side,
        on=sql.SQL(" AND ").join(_EQUAL.format(col("a", k), col("b", k)) for k in business_key),
        key_texts=sql.SQL(", ").join(sql.SQL("{}::text").format(col("j", k)) for k in business_key),
        left_values=_values(left, by, business_key, columns, as_text=as_text, param="partition"),
        right_values=_values(right, right_by, business_key, columns, as_text=as_text, param="right_partition"),
        order=order_by("j", [OrderKey(k, collate_c=True) for k in business_key]) if as_text else order_by("j", order),
    )
    right = right_by.bind_one(partition, "right_partition")
    return query, {**by.bind_one(partition), **right, "limit": limit}


# Many partitions of two tables of one database at once: only the counts per partition and
# kind, from one keyed full join (the partition key joins too), each side read once.
_SIDE_OF_PARTITIONS = sql.SQL(
    "SELECT {pk} AS __pk, {keys}, true AS __present, hashtextextended(ROW({texts})::text, 0) AS __h "
    "FROM {rel} AS t WHERE {among}"
)
_DIFF_COUNTS = sql.SQL(
    "SELECT {name}, {kind} AS __kind, count(*) FROM ({left}) AS a FULL JOIN ({right}) AS b "
    "ON a.__pk = b.__pk AND {on} GROUP BY coalesce(a.__pk, b.__pk), 2"
)


def partitions_diff_counts(left: TableRef, right: TableRef, by: PartitionBy | str, business_key: Sequence[str],
                           columns: Sequence[str], partitions: Sequence[object]) -> Query:
    """The counts of :func:`partition_diff` (per kind) for each of ``partitions`` of ``left``
    against the same partitions of ``right``, in one statement: the same keyed comparison of
    the same row digests, the partition key joined as well. Rows: (partition value, kind,
    count); a partition or kind without rows has none."""
    by = as_by(by)
    def side(rel: TableRef) -> sql.Composed:
        return _SIDE_OF_PARTITIONS.format(pk=by.key("t"), among=by.among("t"), keys=cols("t", business_key),
                                          texts=_texts(columns), rel=table(rel))

    return _DIFF_COUNTS.format(
        kind=_KIND, left=side(left), right=side(right), name=by.name(sql.SQL("coalesce(a.__pk, b.__pk)")),
        on=sql.SQL(" AND ").join(_EQUAL.format(col("a", k), col("b", k)) for k in business_key),
    ), by.bind(partitions)


_FIRST_KEYS = sql.SQL("SELECT ARRAY[{key_texts}] FROM {rel} AS t WHERE {at} ORDER BY {order} LIMIT %(limit)s")


def first_keys(rel: TableRef, by: PartitionBy | str, order: Sequence[OrderKey], partition: object, limit: int) -> Query:
    """The text forms of the first ``limit`` business keys of one partition of ``rel``, in the
    order :func:`partition_diff` gives its examples (``order``: the key's ascending order)."""
    by = as_by(by)
    return _FIRST_KEYS.format(
        key_texts=sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", k.column)) for k in order),
        rel=table(rel), at=by.at("t"), order=order_by("t", order),
    ), {**by.bind_one(partition), "limit": limit}


# For the caller's transaction: a parallel hash full join over both sides (PostgreSQL 16 can),
# which the default costs do not pick for a join of one partition.
_PREFER_PARALLEL = sql.SQL(
    "SELECT set_config('parallel_setup_cost', '10', true), set_config('parallel_tuple_cost', '0.001', true)"
)


def prefer_parallel() -> sql.Composed:
    """Make the diff's join run in parallel workers where the server can (current transaction)."""
    return sql.Composed([_PREFER_PARALLEL])


_CREATE_TEXT_TABLE = sql.SQL("CREATE TEMPORARY TABLE {name} ({columns}) ON COMMIT DROP")
_TEXT_COLUMN = sql.SQL("{} text")


def create_text_table(name: str, columns: Sequence[str]) -> sql.Composed:
    """A temporary table, dropped at commit, with every column ``text``: a lake partition's
    canonical text forms go in unchanged (no type or typmod to trim, round or refuse them)."""
    return _CREATE_TEXT_TABLE.format(
        name=sql.Identifier(name), columns=sql.SQL(", ").join(_TEXT_COLUMN.format(sql.Identifier(c)) for c in columns))
