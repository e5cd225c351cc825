"""What ``profile`` measures: NULL and distinct counts per column, the partitions present,
and how the rows group under a candidate key (its evidence and its splits).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import PARTITION_COLUMN, Query, col, cols, key_not_null, table
from backfill_assets.core.vocabulary import TableRef

_COLUMN_PROFILE = sql.SQL(
    "SELECT (SELECT count(*) FROM {rel} AS s WHERE {among} AND {c} IS NULL), "
    "(SELECT count(*) FROM (SELECT DISTINCT {pk}, {c} FROM {rel} AS s "
    "WHERE {among} AND {c} IS NOT NULL) AS d)"
)


def column_profile(rel: TableRef, by: PartitionBy | str, column: str, partitions: list) -> Query:
    """NULL count of a column, and how many distinct (partition, value) pairs it has."""
    by = as_by(by)
    return _COLUMN_PROFILE.format(
        rel=table(rel), pk=by.key("s"), among=by.among("s"), c=col("s", column)
    ), by.bind(partitions)


_DISTINCT_PARTITIONS = sql.SQL(
    "SELECT DISTINCT {pk} FROM {rel} AS s WHERE {pk} IS NOT NULL ORDER BY {pk} LIMIT %(limit)s"
)


def distinct_partitions(rel: TableRef, partition_key: str, limit: int) -> Query:
    """The first ``limit`` partition values present in ``rel``."""
    return _DISTINCT_PARTITIONS.format(pk=col("s", partition_key), rel=table(rel)), {"limit": limit}


_COLUMN_RANGE = sql.SQL("SELECT min({c}), max({c}) FROM {rel} AS s")


def column_range(rel: TableRef, column: str) -> Query:
    """The least and greatest value of a column (an index on it reads two rows)."""
    return _COLUMN_RANGE.format(c=col("s", column), rel=table(rel)), {}


# --- key candidates (profile) --------------------------------------------------------------

# One pass per candidate key: hash each other column's text form once per row (NULL as 0),
# group by (partition, key), flag per group the columns whose hashes differ, then count.
# min/max of an int8 is a small state per group (min/max of the texts spilled the hash table
# to disk at 30 columns); two different values of one group share a 64-bit hash, or one hashes
# to 0 beside a NULL, with odds of about 2^-64.
_KEY_EVIDENCE = sql.SQL(
    "SELECT count(*), coalesce(sum(g.{n}), 0), count(*) FILTER (WHERE g.{n} > 1), "
    "count(*) FILTER (WHERE {g_any}){varying} FROM "
    "(SELECT {r_pk_key}, count(*) AS {n}{flags} FROM "
    "(SELECT {s_pk_key}{hashes} FROM {rel} AS s "
    "WHERE {s_among} AND {s_key_not_null}) AS r GROUP BY {r_pk_key}) AS g"
)
_HASH = sql.SQL(", coalesce(hashtextextended({c}::text, 0), 0) AS {a}")
_VARIES = sql.SQL(", min(r.{a}) <> max(r.{a}) AS {a}")
_COUNT_VARYING = sql.SQL(", count(*) FILTER (WHERE g.{a})")
_FALSE = sql.SQL("FALSE")
_OR = sql.SQL(" OR ")
_KEY_ALIAS = "__backfill_k"


def key_evidence(
    rel: TableRef, by: PartitionBy | str, key: Sequence[str], others: Sequence[str], partitions: list,
) -> Query:
    """How the rows of ``partitions`` group by (partition, ``key``), in one row.

    Rows with a NULL in the key are left out. The row is: groups, rows, groups with several
    rows, *version groups* (groups in which some column of ``others`` varies), then for each
    column of ``others`` the version groups in which it varies. A column varies in a group
    when its text forms differ (compared by a 64-bit hash) or it is NULL in some rows only.
    """
    by = as_by(by)
    n = sql.Identifier(_KEY_ALIAS + "n")
    flags = [sql.Identifier(_KEY_ALIAS + "v" + str(i)) for i in range(len(others))]
    return _KEY_EVIDENCE.format(
        n=n, rel=table(rel), s_among=by.among("s"),
        s_pk_key=_with_partition(by, key), r_pk_key=cols("r", [PARTITION_COLUMN, *key]),
        s_key_not_null=key_not_null("s", key),
        hashes=sql.SQL("").join(_HASH.format(c=col("s", c), a=a) for c, a in zip(others, flags)),
        flags=sql.SQL("").join(_VARIES.format(a=a) for a in flags),
        g_any=_OR.join(sql.SQL("g.{}").format(a) for a in flags) if flags else _FALSE,
        varying=sql.SQL("").join(_COUNT_VARYING.format(a=a) for a in flags),
    ), by.bind(partitions)


# Each row's hashes once (a materialized CTE: inlined, the planner computed them once per
# split column), then the row once per split column (LATERAL VALUES), grouped by (partition,
# key, column number, its value): a part holds rows that differ when the hash of the row's
# other columns varies. Then per column: the key groups with two or more such parts.
_KEY_SPLITS = sql.SQL(
    "WITH r AS MATERIALIZED "
    "(SELECT {s_pk_key}, hashtextextended(({s_row})::text, 0) AS {h}{hashes} FROM {rel} AS s "
    "WHERE {s_among} AND {s_key_not_null}) "
    "SELECT p.{i}, count(*) FROM "
    "(SELECT {q_pk_key}, q.{i} FROM "
    "(SELECT {r_pk_key}, x.{i}, min(r.{h}) <> max(r.{h}) AS {v} FROM r "
    "CROSS JOIN LATERAL (VALUES {pairs}) AS x({i}, {c}) "
    "GROUP BY {r_pk_key}, x.{i}, x.{c}) AS q "
    "GROUP BY {q_pk_key}, q.{i} HAVING count(*) FILTER (WHERE q.{v}) >= 2) AS p "
    "GROUP BY p.{i} ORDER BY p.{i}"
)
_PAIR = sql.SQL("({i}, r.{a})")


def key_splits(
    rel: TableRef, by: PartitionBy | str, key: Sequence[str], split: Sequence[str],
    others: Sequence[str], partitions: list,
) -> Query:
    """For each column of ``split``, how many (partition, ``key``) groups it divides into two
    or more parts that each hold rows differing in ``others`` (the columns outside the key and
    the row ids).

    Rows (index in ``split``, groups), for the columns that divide at least one group so.
    Rows with a NULL in the key are left out; rows and values are compared by the 64-bit hash
    of their text forms (a NULL value as 0).
    """
    by = as_by(by)
    names = [sql.Identifier(_KEY_ALIAS + "s" + str(i)) for i in range(len(split))]
    return _KEY_SPLITS.format(
        i=sql.Identifier(_KEY_ALIAS + "i"), c=sql.Identifier(_KEY_ALIAS + "c"),
        h=sql.Identifier(_KEY_ALIAS + "h"), v=sql.Identifier(_KEY_ALIAS + "v"),
        rel=table(rel), s_among=by.among("s"), s_key_not_null=key_not_null("s", key),
        s_pk_key=_with_partition(by, key), r_pk_key=cols("r", [PARTITION_COLUMN, *key]),
        q_pk_key=cols("q", [PARTITION_COLUMN, *key]),
        s_row=sql.SQL("ROW({})").format(cols("s", others)),
        hashes=sql.SQL("").join(_HASH.format(c=col("s", c), a=a) for c, a in zip(split, names)),
        pairs=sql.SQL(", ").join(_PAIR.format(i=sql.Literal(i), a=a) for i, a in enumerate(names)),
    ), by.bind(partitions)


def _with_partition(by: PartitionBy | str, key: Sequence[str]) -> sql.Composed:
    """A row's partition (as a working column) and its ``key`` columns, from ``s``."""
    by = as_by(by)
    return sql.SQL("{} AS {}, {}").format(by.key("s"), sql.Identifier(PARTITION_COLUMN), cols("s", key))
