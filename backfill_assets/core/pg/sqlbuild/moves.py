"""Records that can move between partitions: the keys of a scope, where each key's
newest version lives, and copying or counting every version of the scope's keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import (
    PARTITION_COLUMN,
    OrderKey,
    Query,
    col,
    cols,
    key_not_null,
    order_by,
    table,
)
from backfill_assets.core.vocabulary import TableRef

_SCOPE_KEYS = sql.SQL(
    "SELECT {s_bk} FROM {src} AS s WHERE {s_among} AND {s_key_not_null} "
    "UNION SELECT {t_bk} FROM {tgt} AS t WHERE {t_among}"
)

_KEY_HOMES = sql.SQL(
    "WITH k AS ({keys}), "
    "h AS (SELECT DISTINCT ON ({s_bk}) {s_bk}, {s_pk} AS {p} FROM {src} AS s "
    "WHERE ({s_bk}) IN (SELECT {k_bk} FROM k) ORDER BY {s_bk}, {ordering}), "
    "c AS (SELECT {t_bk}, {t_pk} AS {p} FROM {tgt} AS t WHERE ({t_bk}) IN (SELECT {k_bk} FROM k)) "
    "SELECT {h_out}, {c_out}, {h_first} IS NOT NULL, {c_first} IS NOT NULL, {key_text} "
    "FROM h FULL JOIN c ON {join} "
    "WHERE {h_first} IS NULL OR {c_first} IS NULL OR {h_p} IS DISTINCT FROM {c_p} "
    "OR ({h_among}) IS NOT TRUE"
)

_OUTSIDE_SCOPE_WITH_KEYS = sql.SQL("({among}) IS NOT TRUE AND ({key}) IN ({keys})")



def scope_keys(src: TableRef, tgt: TableRef, by: PartitionBy | str, business_key: Sequence[str]) -> sql.Composed:
    """Every business key with a source or target row in ``%(partitions)s`` (a subquery)."""
    by = as_by(by)
    return _SCOPE_KEYS.format(
        s_bk=cols("s", business_key), src=table(src), s_among=by.among("s"),
        s_key_not_null=key_not_null("s", business_key), t_bk=cols("t", business_key),
        tgt=table(tgt), t_among=by.among("t"),
    )


def key_homes(
    src: TableRef, tgt: TableRef, by: PartitionBy | str, business_key: Sequence[str],
    ordering: Sequence[OrderKey], partitions: list,
) -> Query:
    """For the keys of ``partitions``: each key whose newest source version (its home) lies
    in another partition than the target holds it in, or outside ``partitions``, or that
    only one side has.

    Rows: (home, current, in source, in target, key texts...): a value partition's home and
    current as text; for time windows the column's values, which the caller places in
    windows (a time stamp that changed within its window is no move).
    """
    by = as_by(by)
    p = sql.Identifier(PARTITION_COLUMN)
    keys = scope_keys(src, tgt, by, business_key)
    h_p, c_p = col("h", PARTITION_COLUMN), col("c", PARTITION_COLUMN)
    carried = dataclasses.replace(by, column=PARTITION_COLUMN)  # the same partitions, of h's working column
    query = _KEY_HOMES.format(
        keys=keys, s_bk=cols("s", business_key), s_pk=col("s", by.column), p=p,
        src=table(src), k_bk=cols("k", business_key), ordering=order_by("s", ordering),
        t_bk=cols("t", business_key), t_pk=col("t", by.column), tgt=table(tgt),
        h_p=h_p, c_p=c_p, h_out=by.value(h_p), c_out=by.value(c_p), h_among=carried.among("h"),
        h_first=col("h", business_key[0]), c_first=col("c", business_key[0]),
        key_text=sql.SQL(", ").join(
            sql.SQL("coalesce({}::text, {}::text)").format(col("h", c), col("c", c))
            for c in business_key
        ),
        join=sql.SQL(" AND ").join(
            sql.SQL("{} = {}").format(col("h", c), col("c", c)) for c in business_key
        ),
    )
    return query, by.bind(partitions)


_COPY_SCOPE = sql.SQL(
    "INSERT INTO {new} ({cols}) SELECT {s_cols} FROM {rel} AS s "
    "WHERE {among} OR ({s_bk}) IN ({keys})"
)


def copy_scope(
    new: TableRef, src: TableRef, tgt: TableRef, columns: Sequence[str], by: PartitionBy | str,
    business_key: Sequence[str], partitions: list,
) -> Query:
    """Copy the rows of ``partitions`` and every version of their keys from other partitions."""
    by = as_by(by)
    return _COPY_SCOPE.format(
        new=table(new), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=cols("s", columns), rel=table(src), among=by.among("s"),
        s_bk=cols("s", business_key), keys=scope_keys(src, tgt, by, business_key),
    ), by.bind(partitions)


def outside_scope(src: TableRef, tgt: TableRef, by: PartitionBy | str, business_key: Sequence[str]) -> sql.Composed:
    """WHERE clause (alias ``t``) for versions of the scope's keys outside its partitions
    (``%(partitions)s``, bound by ``by.bind``)."""
    by = as_by(by)
    return _OUTSIDE_SCOPE_WITH_KEYS.format(
        among=by.among("t"), key=cols("t", business_key), keys=scope_keys(src, tgt, by, business_key),
    )


# --- a lake target's keys, for the statements above --------------------------------------

_CREATE_KEYS = sql.SQL(
    "CREATE TEMPORARY TABLE {name} ON COMMIT DROP AS SELECT {cols} FROM ({input}) AS i WITH NO DATA"
)
_COPY_KEYS_IN = sql.SQL("COPY {rel} ({cols}) FROM STDIN (FORMAT csv)")
_KEYS_IN_SEVERAL = sql.SQL(
    "SELECT {key_text}, count(*) FROM {rel} AS t GROUP BY {t_bk} HAVING count(*) > 1 ORDER BY {t_bk} LIMIT 5"
)


def create_temp_table(name: str, input_relation: sql.Composable, columns: Sequence[str]) -> sql.Composed:
    """A temporary table, dropped at commit, with ``columns`` typed as the input relation
    gives them: a lake target's keys (or a lake partition's rows, for core.diff) are loaded
    into it (build the relation unfiltered and without ``%`` escaping; the statement takes no
    parameters)."""
    return _CREATE_KEYS.format(name=sql.Identifier(name), cols=cols("i", columns), input=input_relation)


def copy_keys_in(rel: TableRef, columns: Sequence[str]) -> sql.Composed:
    """``COPY rel (columns) FROM STDIN`` in CSV (an unquoted empty field is NULL)."""
    return _COPY_KEYS_IN.format(rel=table(rel), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns))


def keys_in_several_partitions(rel: TableRef, business_key: Sequence[str]) -> sql.Composed:
    """Up to 5 business keys of ``rel`` (distinct (partition, key) rows) found in more than
    one partition: (key texts..., count)."""
    return _KEYS_IN_SEVERAL.format(
        key_text=sql.SQL(", ").join(sql.SQL("{}::text").format(col("t", c)) for c in business_key),
        rel=table(rel), t_bk=cols("t", business_key),
    )
