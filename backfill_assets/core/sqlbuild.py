"""SQL builders: pure functions returning ``(Composed, params)``.

Identifiers are always ``sql.Identifier`` (two parts for tables), values always bound
parameters. Templates are module-level literals. No statement selects ``*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from psycopg import sql

from backfill_assets.core.spec import TableRef

Query = tuple[sql.Composed, dict[str, Any]]

# Working columns (build B's rank, the tie check's group size); spec columns starting with
# "__backfill" are refused, so they cannot collide.
RANK_COLUMN = "__backfill_rank"
GROUP_SIZE_COLUMN = "__backfill_group_size"
# The CTE a transform_sql reads the snapshot through.
SOURCE_CTE = "source"


def table(ref: TableRef) -> sql.Identifier:
    """A schema-qualified table as a two-part identifier."""
    return sql.Identifier(ref.schema, ref.name)


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY item over a column of the relation aliased ``alias``.

    ``collate_c`` sorts a collatable column by bytes, so the order does not depend on the
    server's locale; ``as_text`` sorts the column's text form instead of its typed value.
    """

    column: str
    direction: Literal["asc", "desc"] = "asc"
    nulls: Literal["first", "last"] | None = None
    collate_c: bool = False
    as_text: bool = False


def _col(alias: str, column: str) -> sql.Identifier:
    return sql.Identifier(alias, column)


def _cols(alias: str, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(_col(alias, c) for c in columns)


def _order_by(alias: str, keys: Sequence[OrderKey]) -> sql.Composed:
    items = []
    for key in keys:
        parts: list[sql.Composable] = [_col(alias, key.column)]
        if key.as_text:
            parts = [sql.SQL("{}::text").format(_col(alias, key.column))]
        if key.collate_c or key.as_text:
            parts.append(sql.SQL('COLLATE "C"'))
        parts.append(sql.SQL("DESC") if key.direction == "desc" else sql.SQL("ASC"))
        if key.nulls == "first":
            parts.append(sql.SQL("NULLS FIRST"))
        elif key.nulls == "last":
            parts.append(sql.SQL("NULLS LAST"))
        items.append(sql.SQL(" ").join(parts))
    return sql.SQL(", ").join(items)


def _key_not_null(alias: str, key: Sequence[str]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{} IS NOT NULL").format(_col(alias, c)) for c in key
    )


def _key_is_null(alias: str, key: Sequence[str]) -> sql.Composed:
    return sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(_col(alias, c)) for c in key)


# --- fingerprints --------------------------------------------------------------------------

_COPY_STREAM = sql.SQL(
    "COPY (SELECT {text_cols} FROM {rel} AS t WHERE {where} ORDER BY {order}) "
    "TO STDOUT (FORMAT binary)"
)
_IN_PARTITION = sql.SQL("{pk} = %(partition)s")
_OUTSIDE_SCOPE_WITH_KEYS = sql.SQL(
    "({pk} IS NULL OR NOT ({pk} = ANY(%(partitions)s))) AND ({key}) IN ({keys})"
)


def in_partition(partition_key: str, alias: str = "t") -> sql.Composed:
    """``alias.partition_key = %(partition)s``."""
    return _IN_PARTITION.format(pk=_col(alias, partition_key))


def copy_canonical_stream(
    rel: TableRef, columns: Sequence[str], where: sql.Composable, order: Sequence[OrderKey],
    params: Mapping[str, Any],
) -> Query:
    """Binary COPY of the rows of ``rel`` (aliased ``t``) matching ``where``, every column
    cast to text, in ``order``. Parameters are bound by psycopg on the client (COPY takes none).

    The ORDER BY names the table alias, never the text output column (a text sort would
    give another order and another digest).
    """
    text_cols = sql.SQL(", ").join(sql.SQL("{}::text").format(_col("t", c)) for c in columns)
    query = _COPY_STREAM.format(
        text_cols=text_cols, rel=table(rel), where=where, order=_order_by("t", order),
    )
    return query, dict(params)


_READINGS_UNIQUE = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE {key_null}), {total}, 0 "
    "FROM {rel} AS t WHERE {pk} = %(partition)s"
)


def _total_expr(total: str | None) -> sql.Composable:
    if total is None:
        return sql.SQL("NULL::text")
    return sql.SQL("coalesce(sum({}), 0)::text").format(_col("t", total))


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
            key_null=_key_is_null("t", business_key), total=_total_expr(total), rel=table(rel),
            pk=_col("t", partition_key),
        ), {"partition": partition}
    query = _READINGS.format(
        key_null=_key_is_null("t", business_key), total=_total_expr(total), rel=table(rel),
        d_pk=_col("d", partition_key), d_key_not_null=_key_not_null("d", business_key),
        d_key=_cols("d", business_key), pk=_col("t", partition_key),
    )
    return query, {"partition": partition}


# --- the input relation: snapshot rows, optionally through transform_sql ------------------

_BASE_ALL = sql.SQL("SELECT {cols} FROM {base} AS s")
_BASE_FILTERED = sql.SQL("SELECT {cols} FROM {base} AS s WHERE {pk} = ANY(%(partitions)s)")
_WITH_TRANSFORM = sql.SQL("WITH {cte} AS ({base}) SELECT {out} FROM ({transform}) AS i")


def input_relation(
    base: TableRef, base_columns: Sequence[str], partition_key: str,
    output_columns: Sequence[str], transform_sql: str | None, *, filtered: bool,
    escape_percent: bool = True,
) -> sql.Composed:
    """The rows the newest-wins step reads.

    Without a transform: the output columns of ``base``. With one: the transform's output
    columns, the transform reading ``base`` (all its columns) as the CTE ``source``.
    ``filtered`` restricts ``base`` to ``%(partitions)s`` (a live source); a snapshot table
    holds only the snapshot's partitions already.

    ``transform_sql`` must be the validated, re-printed statement from
    :func:`backfill_assets.core.transform.validate_transform_text`. psycopg reads ``%`` as a
    placeholder marker when parameters are passed, so the transform's own ``%`` signs are
    doubled unless ``escape_percent`` is false (a statement executed without parameters).
    """
    template = _BASE_FILTERED if filtered else _BASE_ALL
    if transform_sql is None:
        return template.format(
            cols=_cols("s", output_columns), base=table(base), pk=_col("s", partition_key)
        )
    base_q = template.format(
        cols=_cols("s", base_columns), base=table(base), pk=_col("s", partition_key)
    )
    text = transform_sql.replace("%", "%%") if escape_percent else transform_sql
    transform = sql.SQL(text)  # type: ignore[arg-type]
    return _WITH_TRANSFORM.format(
        cte=sql.Identifier(SOURCE_CTE), base=base_q, out=_cols("i", output_columns),
        transform=transform,
    )


# --- stage builds -----------------------------------------------------------------------

_DELETE_PARTITION = sql.SQL("DELETE FROM {rel} WHERE {pk} = %(partition)s")

_BUILD_DISTINCT_ON = sql.SQL(
    "INSERT INTO {stage} ({cols}) "
    "SELECT DISTINCT ON ({i_key}) {i_cols} FROM ({input}) AS i "
    "WHERE {i_pk} = %(partition)s AND {i_key_not_null} "
    "ORDER BY {i_key}, {ordering}"
)

_BUILD_WINDOW = sql.SQL(
    "INSERT INTO {stage} ({cols}) "
    "SELECT {r_cols} FROM (SELECT {i_cols}, row_number() OVER "
    "(PARTITION BY {i_bk} ORDER BY {ordering}) AS {rank} FROM ({input}) AS i "
    "WHERE {i_pk} = %(partition)s AND {i_key_not_null}) AS r WHERE {r_rank} = 1"
)

# Records that can move: the newest version of each key over the whole snapshot decides its
# partition, so rank first and keep the partition's rows after.
_BUILD_DISTINCT_ON_MOVING = sql.SQL(
    "INSERT INTO {stage} ({cols}) "
    "SELECT {g_cols} FROM (SELECT DISTINCT ON ({i_bk}) {i_cols} FROM ({input}) AS i "
    "WHERE {i_key_not_null} ORDER BY {i_bk}, {ordering}) AS g WHERE {g_pk} = %(partition)s"
)

_BUILD_WINDOW_MOVING = sql.SQL(
    "INSERT INTO {stage} ({cols}) "
    "SELECT {r_cols} FROM (SELECT {i_cols}, row_number() OVER "
    "(PARTITION BY {i_bk} ORDER BY {ordering}) AS {rank} FROM ({input}) AS i "
    "WHERE {i_key_not_null}) AS r WHERE {r_rank} = 1 AND {r_pk} = %(partition)s"
)


def delete_partition(rel: TableRef, partition_key: str, partition: object) -> Query:
    """Delete one partition's rows."""
    return _DELETE_PARTITION.format(rel=table(rel), pk=sql.Identifier(partition_key)), {
        "partition": partition
    }


def build_stage(
    variant: Literal["a", "b"], stage: TableRef, input_rel: sql.Composed,
    columns: Sequence[str], partition_key: str, business_key: Sequence[str],
    ordering: Sequence[OrderKey], params: Mapping[str, Any], partition: object,
    *, moving: bool = False,
) -> Query:
    """Insert the newest row per non-null business key of one partition into a stage.

    Variant ``a`` uses DISTINCT ON, variant ``b`` a row_number() window: two physical
    plans, so a result that depends on physical row order shows up as a difference.
    With ``moving``, the newest version is chosen per key across all partitions.
    """
    common = dict(
        stage=table(stage), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        i_cols=_cols("i", columns), input=input_rel, i_pk=_col("i", partition_key),
        i_key_not_null=_key_not_null("i", business_key), ordering=_order_by("i", ordering),
    )
    if moving and variant == "a":
        query = _BUILD_DISTINCT_ON_MOVING.format(
            g_cols=_cols("g", columns), i_bk=_cols("i", business_key),
            g_pk=_col("g", partition_key), **common,
        )
    elif moving:
        query = _BUILD_WINDOW_MOVING.format(
            r_cols=_cols("r", columns), i_bk=_cols("i", business_key),
            rank=sql.Identifier(RANK_COLUMN), r_rank=_col("r", RANK_COLUMN),
            r_pk=_col("r", partition_key), **common,
        )
    elif variant == "a":
        query = _BUILD_DISTINCT_ON.format(
            i_key=_cols("i", [partition_key, *business_key]), **common
        )
    else:
        query = _BUILD_WINDOW.format(
            r_cols=_cols("r", columns), i_bk=_cols("i", business_key),
            rank=sql.Identifier(RANK_COLUMN), r_rank=_col("r", RANK_COLUMN), **common,
        )
    return query, {**params, "partition": partition}


# --- source checks ------------------------------------------------------------------------

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

_INPUT_REPORT = sql.SQL(
    "SELECT {i_pk}, count(*), count(*) FILTER (WHERE {i_key_null}) "
    "FROM ({input}) AS i GROUP BY {i_pk}"
)

_OUTSIDE = sql.SQL(
    "SELECT count(*) FROM ({input}) AS i "
    "WHERE {i_pk} IS NULL OR NOT ({i_pk} = ANY(%(partitions)s))"
)


def ordering_null_counts(
    input_rel: sql.Composed, business_key: Sequence[str], ordering_columns: Sequence[str],
    params: Mapping[str, Any],
) -> Query:
    """How many keyed input rows have NULL in each ordering column."""
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {} IS NULL)").format(_col("i", c))
        for c in ordering_columns
    )
    return _ORDERING_NULLS.format(
        counts=counts, input=input_rel, i_key_not_null=_key_not_null("i", business_key)
    ), dict(params)


def ordering_ties(
    input_rel: sql.Composed, partition_key: str | None, business_key: Sequence[str],
    ordering_columns: Sequence[str], other_columns: Sequence[str], params: Mapping[str, Any],
) -> Query:
    """Up to three (partition, key, ordering) groups whose rows tie on every ordering column
    yet differ in some output column, with each group's row count and the number of groups.
    Each row is (partition text, key texts..., n, groups); with ``partition_key`` None the
    groups are per key across partitions (records that can move) and the partition is NULL.

    Rows equal in every output column are not a tie: whichever wins, the result is the same.
    ``other_columns`` are the output columns compared, by their text forms (which the target
    and the fingerprint keep); the caller includes the key and ordering columns that are
    output columns, so that values equal for the grouping yet written differently (numeric
    ``1.5`` and ``1.50``) are a tie too.
    """
    scope = [partition_key] if partition_key is not None else []
    key_ord = [*scope, *business_key, *ordering_columns]
    rest = sql.SQL("").join(
        sql.SQL(", {}::text AS {}").format(_col("i", c), sql.Identifier(f"__v{n}"))
        for n, c in enumerate(other_columns)
    )
    g_key_text = sql.SQL(", ").join(
        [sql.SQL("{}::text").format(_col("g", partition_key)) if scope else sql.SQL("NULL::text")]
        + [sql.SQL("{}::text").format(_col("g", c)) for c in business_key]
    )
    read = list(dict.fromkeys([*key_ord, *other_columns]))
    return _TIES.format(
        g_key_text=g_key_text, i_key_ord=_cols("i", key_ord), i_rest=rest, input=input_rel,
        x_cols=_cols("x", read), x_key_ord=_cols("x", key_ord), size=sql.Identifier(GROUP_SIZE_COLUMN),
        x_key_not_null=_key_not_null("x", business_key), i_size=_col("i", GROUP_SIZE_COLUMN),
        g_key_ord=_cols("g", key_ord),
    ), dict(params)


def input_report(
    input_rel: sql.Composed, partition_key: str, business_key: Sequence[str],
    params: Mapping[str, Any],
) -> Query:
    """Per partition of the input: rows read and rows with a NULL business key."""
    return _INPUT_REPORT.format(
        i_pk=_col("i", partition_key), i_key_null=_key_is_null("i", business_key),
        input=input_rel,
    ), dict(params)


def rows_outside_partitions(
    input_rel: sql.Composed, partition_key: str, params: Mapping[str, Any]
) -> Query:
    """Input rows whose partition is NULL or not one of ``%(partitions)s``."""
    return _OUTSIDE.format(input=input_rel, i_pk=_col("i", partition_key)), dict(params)


# --- snapshots and stages -----------------------------------------------------------------

_CREATE_COPY_OF = sql.SQL("CREATE {unlogged}TABLE {new} AS SELECT {cols} FROM {rel} AS s WITH NO DATA")
_INSERT_PARTITIONS = sql.SQL(
    "INSERT INTO {new} ({cols}) SELECT {s_cols} FROM {rel} AS s WHERE {pk} = ANY(%(partitions)s)"
)
_CREATE_INDEX = sql.SQL("CREATE INDEX ON {rel} ({items})")
_CREATE_UNIQUE_INDEX = sql.SQL("CREATE UNIQUE INDEX ON {rel} ({items})")
_DROP_TABLE = sql.SQL("DROP TABLE IF EXISTS {rel}")


def create_empty_copy(new: TableRef, rel: TableRef, columns: Sequence[str], *, unlogged: bool) -> sql.Composed:
    """A new empty table with ``columns`` of ``rel``, in that order and with their types."""
    return _CREATE_COPY_OF.format(
        unlogged=sql.SQL("UNLOGGED ") if unlogged else sql.SQL(""), new=table(new),
        cols=_cols("s", columns), rel=table(rel),
    )


def copy_partitions(new: TableRef, rel: TableRef, columns: Sequence[str], partition_key: str, partitions: list) -> Query:
    """Copy the rows of ``partitions`` from ``rel`` into ``new``."""
    return _INSERT_PARTITIONS.format(
        new=table(new), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=_cols("s", columns), rel=table(rel), pk=_col("s", partition_key),
    ), {"partitions": partitions}


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
    "SELECT count(*), count(*) FILTER (WHERE t.xmin::text IS DISTINCT FROM %(writer)s) FROM {rel} AS t"
)
_DROPPED_COLUMNS = sql.SQL(
    "SELECT count(*) FROM pg_catalog.pg_attribute AS a "
    "JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND a.attnum > 0 AND a.attisdropped"
)


_PARTITION_WRITER = sql.SQL("SELECT t.xmin::text FROM {rel} AS t WHERE {pk} = %(partition)s LIMIT 1")
_PARTITION_SEAL_CHECK = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE t.xmin::text IS DISTINCT FROM %(writer)s) "
    "FROM {rel} AS t WHERE {pk} = %(partition)s"
)


def partition_writer(rel: TableRef, partition_key: str, partition: object) -> Query:
    """The transaction that wrote a row of one partition (its xmin)."""
    return _PARTITION_WRITER.format(rel=table(rel), pk=_col("t", partition_key)), {"partition": partition}


def partition_seal_check(rel: TableRef, partition_key: str, partition: object, writer: str | None) -> Query:
    """Rows of one partition, and how many of them another transaction than ``writer`` wrote."""
    return _PARTITION_SEAL_CHECK.format(rel=table(rel), pk=_col("t", partition_key)), {
        "partition": partition, "writer": writer,
    }


def copy_writer(rel: TableRef) -> sql.Composed:
    """The transaction that wrote a row of ``rel`` (its xmin), for a table one statement filled."""
    return _COPY_WRITER.format(rel=table(rel))


def copy_seal_check(rel: TableRef, writer: str | None) -> Query:
    """Rows of ``rel``, and how many of them another transaction than ``writer`` wrote."""
    return _COPY_SEAL_CHECK.format(rel=table(rel)), {"writer": writer}


def dropped_columns(rel: TableRef) -> Query:
    """How many dropped columns a table has (a column dropped and added again keeps xmin)."""
    return _DROPPED_COLUMNS, {"schema": rel.schema, "name": rel.name}


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


_PARTITION_COUNTS = sql.SQL(
    "SELECT {pk}, count(*) FROM {rel} AS s WHERE {pk} = ANY(%(partitions)s) GROUP BY {pk}"
)


def partition_counts(rel: TableRef, partition_key: str, partitions: list) -> Query:
    """Row count per partition of ``rel`` among ``partitions`` (absent partitions: no row)."""
    return _PARTITION_COUNTS.format(pk=_col("s", partition_key), rel=table(rel)), {
        "partitions": partitions
    }


_COLUMN_PROFILE = sql.SQL(
    "SELECT (SELECT count(*) FROM {rel} AS s WHERE {pk} = ANY(%(partitions)s) AND {c} IS NULL), "
    "(SELECT count(*) FROM (SELECT DISTINCT {pk}, {c} FROM {rel} AS s "
    "WHERE {pk} = ANY(%(partitions)s) AND {c} IS NOT NULL) AS d)"
)


def column_profile(rel: TableRef, partition_key: str, column: str, partitions: list) -> Query:
    """NULL count of a column, and how many distinct (partition, value) pairs it has."""
    return _COLUMN_PROFILE.format(
        rel=table(rel), pk=_col("s", partition_key), c=_col("s", column)
    ), {"partitions": partitions}


_DISTINCT_PARTITIONS = sql.SQL(
    "SELECT DISTINCT {pk} FROM {rel} AS s WHERE {pk} IS NOT NULL ORDER BY {pk} LIMIT %(limit)s"
)


def distinct_partitions(rel: TableRef, partition_key: str, limit: int) -> Query:
    """The first ``limit`` partition values present in ``rel``."""
    return _DISTINCT_PARTITIONS.format(pk=_col("s", partition_key), rel=table(rel)), {"limit": limit}


# --- records that can move ---------------------------------------------------------------

_SCOPE_KEYS = sql.SQL(
    "SELECT {s_bk} FROM {src} AS s WHERE {s_pk} = ANY(%(partitions)s) AND {s_key_not_null} "
    "UNION SELECT {t_bk} FROM {tgt} AS t WHERE {t_pk} = ANY(%(partitions)s)"
)

_KEY_HOMES = sql.SQL(
    "WITH k AS ({keys}), "
    "h AS (SELECT DISTINCT ON ({s_bk}) {s_bk}, {s_pk} AS {p} FROM {src} AS s "
    "WHERE ({s_bk}) IN (SELECT {k_bk} FROM k) ORDER BY {s_bk}, {ordering}), "
    "c AS (SELECT {t_bk}, {t_pk} AS {p} FROM {tgt} AS t WHERE ({t_bk}) IN (SELECT {k_bk} FROM k)) "
    "SELECT {h_p}::text, {c_p}::text, {h_first} IS NOT NULL, {c_first} IS NOT NULL, {key_text} "
    "FROM h FULL JOIN c ON {join} "
    "WHERE {h_first} IS NULL OR {c_first} IS NULL OR {h_p} IS DISTINCT FROM {c_p} "
    "OR NOT ({h_p} = ANY(%(partitions)s))"
)

_PARTITION_ALIAS = "__backfill_partition"


def scope_keys(src: TableRef, tgt: TableRef, partition_key: str, business_key: Sequence[str]) -> sql.Composed:
    """Every business key with a source or target row in ``%(partitions)s`` (a subquery)."""
    return _SCOPE_KEYS.format(
        s_bk=_cols("s", business_key), src=table(src), s_pk=_col("s", partition_key),
        s_key_not_null=_key_not_null("s", business_key), t_bk=_cols("t", business_key),
        tgt=table(tgt), t_pk=_col("t", partition_key),
    )


def key_homes(
    src: TableRef, tgt: TableRef, partition_key: str, business_key: Sequence[str],
    ordering: Sequence[OrderKey], partitions: list,
) -> Query:
    """For the keys of ``partitions``: each key whose newest source version (its home) lies
    in another partition than the target holds it in, or outside ``partitions``, or that
    only one side has.

    Rows: (home text, current text, in source, in target, key texts...).
    """
    p = sql.Identifier(_PARTITION_ALIAS)
    keys = scope_keys(src, tgt, partition_key, business_key)
    query = _KEY_HOMES.format(
        keys=keys, s_bk=_cols("s", business_key), s_pk=_col("s", partition_key), p=p,
        src=table(src), k_bk=_cols("k", business_key), ordering=_order_by("s", ordering),
        t_bk=_cols("t", business_key), t_pk=_col("t", partition_key), tgt=table(tgt),
        h_p=_col("h", _PARTITION_ALIAS), c_p=_col("c", _PARTITION_ALIAS),
        h_first=_col("h", business_key[0]), c_first=_col("c", business_key[0]),
        key_text=sql.SQL(", ").join(
            sql.SQL("coalesce({}::text, {}::text)").format(_col("h", c), _col("c", c))
            for c in business_key
        ),
        join=sql.SQL(" AND ").join(
            sql.SQL("{} = {}").format(_col("h", c), _col("c", c)) for c in business_key
        ),
    )
    return query, {"partitions": partitions}


_COPY_SCOPE = sql.SQL(
    "INSERT INTO {new} ({cols}) SELECT {s_cols} FROM {rel} AS s "
    "WHERE {pk} = ANY(%(partitions)s) OR ({s_bk}) IN ({keys})"
)


def copy_scope(
    new: TableRef, src: TableRef, tgt: TableRef, columns: Sequence[str], partition_key: str,
    business_key: Sequence[str], partitions: list,
) -> Query:
    """Copy the rows of ``partitions`` and every version of their keys from other partitions."""
    return _COPY_SCOPE.format(
        new=table(new), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=_cols("s", columns), rel=table(src), pk=_col("s", partition_key),
        s_bk=_cols("s", business_key), keys=scope_keys(src, tgt, partition_key, business_key),
    ), {"partitions": partitions}


def outside_scope(src: TableRef, tgt: TableRef, partition_key: str, business_key: Sequence[str]) -> sql.Composed:
    """WHERE clause (alias ``t``) for versions of the scope's keys outside its partitions."""
    return _OUTSIDE_SCOPE_WITH_KEYS.format(
        pk=_col("t", partition_key), key=_cols("t", business_key),
        keys=scope_keys(src, tgt, partition_key, business_key),
    )


_COUNT_WHERE = sql.SQL("SELECT count(*) FROM {rel} AS t WHERE {where}")


def count_where(rel: TableRef, where: sql.Composable, params: Mapping[str, Any]) -> Query:
    """Rows of ``rel`` (aliased ``t``) matching ``where``."""
    return _COUNT_WHERE.format(rel=table(rel), where=where), dict(params)


# --- replacing target partitions ----------------------------------------------------------

_ADVISORY_LOCK = sql.SQL("SELECT pg_advisory_lock(hashtextextended(%(key)s, 0))")
_ADVISORY_UNLOCK = sql.SQL("SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0))")
_LOCK_TABLE = sql.SQL("LOCK TABLE {rel} IN SHARE ROW EXCLUSIVE MODE")
_INSERT_FROM_STAGE = sql.SQL(
    "INSERT INTO {target} ({cols}) SELECT {s_cols} FROM {stage} AS s "
    "WHERE {s_pk} = %(partition)s ORDER BY {order}"
)


def advisory_lock(key: str) -> Query:
    """A session advisory lock on ``key`` (waits, bounded by lock_timeout)."""
    return _ADVISORY_LOCK, {"key": key}


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


def lock_against_writers(rel: TableRef) -> sql.Composed:
    """A table lock (SHARE) under which nobody can change the table but anyone can read it."""
    return _LOCK_SHARE.format(rel=table(rel))


def insert_from_stage(
    target: TableRef, stage: TableRef, columns: Sequence[str], partition_key: str,
    order: Sequence[OrderKey], partition: object,
) -> Query:
    """Insert one stage partition into the target, with explicit columns in declared order."""
    return _INSERT_FROM_STAGE.format(
        target=table(target), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        s_cols=_cols("s", columns), stage=table(stage), s_pk=_col("s", partition_key),
        order=_order_by("s", order),
    ), {"partition": partition}


_HAS_UNIQUE_INDEX = sql.SQL(
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index AS i "
    "JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND i.indisunique)"
)


def has_unique_index(rel: TableRef) -> Query:
    """Whether ``rel`` has any unique index (the stage's one is on the grain)."""
    return _HAS_UNIQUE_INDEX, {"schema": rel.schema, "name": rel.name}


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
    "WHERE {s_pk} = ANY(%(partitions)s) AND {s_key_not_null}) AS r GROUP BY {r_pk_key}) AS g"
)
_HASH = sql.SQL(", coalesce(hashtextextended({c}::text, 0), 0) AS {a}")
_VARIES = sql.SQL(", min(r.{a}) <> max(r.{a}) AS {a}")
_COUNT_VARYING = sql.SQL(", count(*) FILTER (WHERE g.{a})")
_FALSE = sql.SQL("FALSE")
_OR = sql.SQL(" OR ")
_KEY_ALIAS = "__backfill_k"


def key_evidence(
    rel: TableRef, partition_key: str, key: Sequence[str], others: Sequence[str], partitions: list,
) -> Query:
    """How the rows of ``partitions`` group by (partition, ``key``), in one row.

    Rows with a NULL in the key are left out. The row is: groups, rows, groups with several
    rows, *version groups* (groups in which some column of ``others`` varies), then for each
    column of ``others`` the version groups in which it varies. A column varies in a group
    when its text forms differ (compared by a 64-bit hash) or it is NULL in some rows only.
    """
    n = sql.Identifier(_KEY_ALIAS + "n")
    flags = [sql.Identifier(_KEY_ALIAS + "v" + str(i)) for i in range(len(others))]
    return _KEY_EVIDENCE.format(
        n=n, rel=table(rel), s_pk=_col("s", partition_key),
        s_pk_key=_cols("s", [partition_key, *key]), r_pk_key=_cols("r", [partition_key, *key]),
        s_key_not_null=_key_not_null("s", key),
        hashes=sql.SQL("").join(_HASH.format(c=_col("s", c), a=a) for c, a in zip(others, flags)),
        flags=sql.SQL("").join(_VARIES.format(a=a) for a in flags),
        g_any=_OR.join(sql.SQL("g.{}").format(a) for a in flags) if flags else _FALSE,
        varying=sql.SQL("").join(_COUNT_VARYING.format(a=a) for a in flags),
    ), {"partitions": partitions}


# Each row's hashes once (a materialized CTE: inlined, the planner computed them once per
# split column), then the row once per split column (LATERAL VALUES), grouped by (partition,
# key, column number, its value): a part holds rows that differ when the hash of the row's
# other columns varies. Then per column: the key groups with two or more such parts.
_KEY_SPLITS = sql.SQL(
    "WITH r AS MATERIALIZED "
    "(SELECT {s_pk_key}, hashtextextended(({s_row})::text, 0) AS {h}{hashes} FROM {rel} AS s "
    "WHERE {s_pk} = ANY(%(partitions)s) AND {s_key_not_null}) "
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
    rel: TableRef, partition_key: str, key: Sequence[str], split: Sequence[str],
    others: Sequence[str], partitions: list,
) -> Query:
    """For each column of ``split``, how many (partition, ``key``) groups it divides into two
    or more parts that each hold rows differing in ``others`` (the columns outside the key and
    the row ids).

    Rows (index in ``split``, groups), for the columns that divide at least one group so.
    Rows with a NULL in the key are left out; rows and values are compared by the 64-bit hash
    of their text forms (a NULL value as 0).
    """
    names = [sql.Identifier(_KEY_ALIAS + "s" + str(i)) for i in range(len(split))]
    return _KEY_SPLITS.format(
        i=sql.Identifier(_KEY_ALIAS + "i"), c=sql.Identifier(_KEY_ALIAS + "c"),
        h=sql.Identifier(_KEY_ALIAS + "h"), v=sql.Identifier(_KEY_ALIAS + "v"),
        rel=table(rel), s_pk=_col("s", partition_key), s_key_not_null=_key_not_null("s", key),
        s_pk_key=_cols("s", [partition_key, *key]), r_pk_key=_cols("r", [partition_key, *key]),
        q_pk_key=_cols("q", [partition_key, *key]),
        s_row=sql.SQL("ROW({})").format(_cols("s", others)),
        hashes=sql.SQL("").join(_HASH.format(c=_col("s", c), a=a) for c, a in zip(split, names)),
        pairs=sql.SQL(", ").join(_PAIR.format(i=sql.Literal(i), a=a) for i, a in enumerate(names)),
    ), {"partitions": partitions}
