"""Checks of the input before a build: ordering NULLs, ordering ties, the rows read per
partition and the rows outside the chosen partitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import (
    GROUP_SIZE_COLUMN,
    PARTITION_COLUMN,
    Query,
    col,
    cols,
    key_is_null,
    key_not_null,
)

_ORDERING_NULLS = sql.SQL(
    "SELECT {counts} FROM ({input}) AS i WHERE {i_key_not_null}"
)

# Only groups of two or more rows can tie: counted by a window over the typed columns first,
# so that the text forms of just those rows are compared (1.15 s instead of 1.9 s for 2M rows).
_TIES = sql.SQL(
    "SELECT {g_key_text}, count(*) AS n, count(*) OVER () AS groups FROM "
    "(SELECT DISTINCT {i_key_ord}{i_rest} FROM "
    "(SELECT {x_cols}, count(*) OVER (PARTITION BY {x_key_ord}) AS {size} "
    "FROM ({input}) AS x WHERE {x_key_not_null}) AS i WHERE {i_size} > 1) AS g "
    "GROUP BY {g_key_ord} HAVING count(*) > 1 ORDER BY {g_key_ord} LIMIT 3"
)

_TIED_GROUP = sql.SQL(
    "SELECT 1 FROM ({input}) AS x WHERE {x_key_not_null} GROUP BY {x_key_ord} HAVING count(*) > 1 LIMIT 1"
)

_INPUT_REPORT = sql.SQL(
    "SELECT {i_name}, count(*), count(*) FILTER (WHERE {i_key_null}) "
    "FROM ({input}) AS i GROUP BY {i_pk}"
)

_OUTSIDE = sql.SQL("SELECT count(*) FROM ({input}) AS i WHERE ({i_among}) IS NOT TRUE")


def ordering_null_counts(
    input_rel: sql.Composed, business_key: Sequence[str], ordering_columns: Sequence[str],
    params: Mapping[str, Any],
) -> Query:
    """How many keyed input rows have NULL in each ordering column."""
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {} IS NULL)").format(col("i", c))
        for c in ordering_columns
    )
    return _ORDERING_NULLS.format(
        counts=counts, input=input_rel, i_key_not_null=key_not_null("i", business_key)
    ), dict(params)


def any_tied_group(
    input_rel: sql.Composed, by: PartitionBy | str | None, business_key: Sequence[str],
    ordering_columns: Sequence[str], params: Mapping[str, Any],
) -> Query:
    """A row if some (partition, key, ordering) group has two rows or more: the cheap first
    pass of :func:`ordering_ties`, which groups the narrow key and ordering columns only.
    With a unique final tiebreak it finds nothing and the wide comparison never runs."""
    by = None if by is None else as_by(by)
    scope = [by.key("x")] if by is not None else []
    return _TIED_GROUP.format(
        input=input_rel, x_key_not_null=key_not_null("x", business_key),
        x_key_ord=sql.SQL(", ").join([*scope, cols("x", [*business_key, *ordering_columns])]),
    ), dict(params)


def ordering_ties(
    input_rel: sql.Composed, by: PartitionBy | str | None, business_key: Sequence[str],
    ordering_columns: Sequence[str], other_columns: Sequence[str], params: Mapping[str, Any],
) -> Query:
    """Up to three (partition, key, ordering) groups whose rows tie on every ordering column
    yet differ in some output column, with each group's row count and the number of groups.
    Each row is (partition text, key texts..., n, groups); with ``by`` None the
    groups are per key across partitions (records that can move) and the partition is NULL.

    Rows equal in every output column are not a tie: whichever wins, the result is the same.
    ``other_columns`` are the output columns compared, by their text forms (which the target
    and the fingerprint keep); the caller includes the key and ordering columns that are
    output columns, so that values equal for the grouping yet written differently (numeric
    ``1.5`` and ``1.50``) are a tie too.
    """
    by = None if by is None else as_by(by)
    # The partition is carried through the subqueries as a working column (a window's label).
    key_ord = [*business_key, *ordering_columns]
    part = sql.Identifier(PARTITION_COLUMN)
    rest = sql.SQL("").join(
        sql.SQL(", {}::text AS {}").format(col("i", c), sql.Identifier(f"__v{n}"))
        for n, c in enumerate(other_columns)
    )
    g_key_text = sql.SQL(", ").join(
        [sql.SQL("{}::text").format(by.name(col("g", PARTITION_COLUMN))) if by is not None else sql.SQL("NULL::text")]
        + [sql.SQL("{}::text").format(col("g", c)) for c in business_key]
    )
    read = list(dict.fromkeys([*key_ord, *other_columns]))
    carried = [PARTITION_COLUMN] if by is not None else []
    return _TIES.format(
        g_key_text=g_key_text, i_key_ord=cols("i", [*carried, *key_ord]), i_rest=rest, input=input_rel,
        x_cols=sql.SQL(", ").join([*([sql.SQL("{} AS {}").format(by.key("x"), part)] if by is not None else []),
                                   cols("x", read)]),
        x_key_ord=sql.SQL(", ").join([*([by.key("x")] if by is not None else []), cols("x", key_ord)]),
        size=sql.Identifier(GROUP_SIZE_COLUMN),
        x_key_not_null=key_not_null("x", business_key), i_size=col("i", GROUP_SIZE_COLUMN),
        g_key_ord=cols("g", [*carried, *key_ord]),
    ), dict(params)


def input_report(
    input_rel: sql.Composed, by: PartitionBy | str, business_key: Sequence[str],
    params: Mapping[str, Any],
) -> Query:
    """Per partition of the input: rows read and rows with a NULL business key."""
    by = as_by(by)
    return _INPUT_REPORT.format(
        i_pk=by.key("i"), i_name=by.name(by.key("i")), i_key_null=key_is_null("i", business_key),
        input=input_rel,
    ), dict(params)


def rows_outside_partitions(
    input_rel: sql.Composed, by: PartitionBy | str, params: Mapping[str, Any]
) -> Query:
    """Input rows whose partition is NULL or not one of ``%(partitions)s``."""
    by = as_by(by)
    return _OUTSIDE.format(input=input_rel, i_among=by.among("i")), dict(params)
