"""The stage builds: the input relation they read (snapshot rows, optionally through
``transform_sql``) and the two newest-wins plans, DISTINCT ON and a row_number() window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, WidenedBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import (
    RANK_COLUMN,
    OrderKey,
    Query,
    col,
    cols,
    key_not_null,
    order_by,
    table,
)
from backfill_assets.core.vocabulary import TableRef

# --- the input relation: snapshot rows, optionally through transform_sql ------------------

_BASE_ALL = sql.SQL("SELECT {cols} FROM {base} AS s")
_BASE_FILTERED = sql.SQL("SELECT {cols} FROM {base} AS s WHERE {among}")

# The CTE a transform_sql reads the snapshot through.
SOURCE_CTE = "source"
_WITH_TRANSFORM = sql.SQL("WITH {ctes} SELECT {out} FROM ({transform}) AS i")
_CTE = sql.SQL("{} AS ({})")


@dataclass(frozen=True)
class InputRead:
    """Another table a transform reads by ``name`` (core.spec_inputs): whole, or with ``by``
    the rows of the partitions the source is read for (``by.among`` over the input's own
    column, bound by the same parameters as the source's)."""

    name: str
    table: TableRef
    columns: tuple[str, ...]
    by: PartitionBy | WidenedBy | None = None

    def relation(self, filtered: bool) -> sql.Composed:
        """The input's rows as the transform reads them (``filtered``: for the partitions only)."""
        template = _BASE_FILTERED if filtered and self.by is not None else _BASE_ALL
        among = self.by.among("s") if self.by is not None else sql.SQL("true")
        return template.format(cols=cols("s", self.columns), base=table(self.table), among=among)


def input_relation(
    base: TableRef, base_columns: Sequence[str], by: PartitionBy | str,
    output_columns: Sequence[str], transform_sql: str | None, *, filtered: bool,
    escape_percent: bool = True, inputs: Sequence[InputRead] = (),
) -> sql.Composed:
    """The rows the newest-wins step reads.

    Without a transform: the output columns of ``base``. With one: the transform's output
    columns, the transform reading ``base`` (all its columns) as the CTE ``source``, and each
    of ``inputs`` as a CTE of its name (read for the partitions where ``filtered`` and it has
    a partition column of its own, else whole).
    ``filtered`` restricts ``base`` to the partitions ``%(partitions)s`` (a live source; bind
    them with ``by.bind``); a snapshot table holds only the snapshot's partitions already.

    ``transform_sql`` must be the validated, re-printed statement from
    :func:`backfill_assets.core.engines.postgres.guard.transform.validate_transform_text`. psycopg reads ``%`` as a
    placeholder marker when parameters are passed, so the transform's own ``%`` signs are
    doubled unless ``escape_percent`` is false (a statement executed without parameters).
    """
    by = as_by(by)
    template = _BASE_FILTERED if filtered else _BASE_ALL
    if transform_sql is None:
        return template.format(cols=cols("s", output_columns), base=table(base), among=by.among("s"))
    base_q = template.format(cols=cols("s", base_columns), base=table(base), among=by.among("s"))
    text = transform_sql.replace("%", "%%") if escape_percent else transform_sql
    transform = sql.SQL(text)  # type: ignore[arg-type]
    ctes = [_CTE.format(sql.Identifier(SOURCE_CTE), base_q),
            *[_CTE.format(sql.Identifier(i.name), i.relation(filtered)) for i in inputs]]
    return _WITH_TRANSFORM.format(ctes=sql.SQL(", ").join(ctes), out=cols("i", output_columns), transform=transform)


_DESCRIBE = sql.SQL("SELECT {cols} FROM ({input}) AS i LIMIT 0")
_CREATE_FROM_INPUT = sql.SQL("CREATE UNLOGGED TABLE {new} AS SELECT {cols} FROM ({input}) AS i WITH NO DATA")


def describe_input(input_relation: sql.Composable, columns: Sequence[str]) -> sql.Composed:
    """A query of the input relation's ``columns`` that reads no row: its result description
    gives their types (catalog.describe_query). Build the relation unfiltered and without
    ``%`` escaping (the query takes no parameters)."""
    return _DESCRIBE.format(cols=cols("i", columns), input=input_relation)


def create_stage_from_input(new: TableRef, input_relation: sql.Composable, columns: Sequence[str]) -> sql.Composed:
    """A new, empty, unlogged table with ``columns`` typed as the input relation gives them
    (the stage of a lake target, which has no PostgreSQL table to copy the types from)."""
    return _CREATE_FROM_INPUT.format(new=table(new), cols=cols("i", columns), input=input_relation)


# --- stage builds -----------------------------------------------------------------------

_DELETE_PARTITION = sql.SQL("DELETE FROM {rel} WHERE {at}")

# Each build is a SELECT of the newest rows; written into a stage, it is prefixed by _INSERT.
_INSERT = sql.SQL("INSERT INTO {stage} ({cols}) ")

_BUILD_DISTINCT_ON = sql.SQL(
    "SELECT DISTINCT ON ({i_key}) {i_cols} FROM ({input}) AS i "
    "WHERE {i_at} AND {i_key_not_null} "
    "ORDER BY {i_key}, {ordering}"
)

_BUILD_WINDOW = sql.SQL(
    "SELECT {r_cols} FROM (SELECT {i_cols}, row_number() OVER "
    "(PARTITION BY {i_bk} ORDER BY {ordering}) AS {rank} FROM ({input}) AS i "
    "WHERE {i_at} AND {i_key_not_null}) AS r WHERE {r_rank} = 1"
)

# Records that can move: the newest version of each key over the whole snapshot decides its
# partition, so rank first and keep the partition's rows after.
_BUILD_DISTINCT_ON_MOVING = sql.SQL(
    "SELECT {g_cols} FROM (SELECT DISTINCT ON ({i_bk}) {i_cols} FROM ({input}) AS i "
    "WHERE {i_key_not_null} ORDER BY {i_bk}, {ordering}) AS g WHERE {g_at}"
)

_BUILD_WINDOW_MOVING = sql.SQL(
    "SELECT {r_cols} FROM (SELECT {i_cols}, row_number() OVER "
    "(PARTITION BY {i_bk} ORDER BY {ordering}) AS {rank} FROM ({input}) AS i "
    "WHERE {i_key_not_null}) AS r WHERE {r_rank} = 1 AND {r_at}"
)


# Several partitions in one statement: newest-wins per (partition, key), as above per partition.
_BUILD_DISTINCT_ON_BATCH = sql.SQL(
    "SELECT DISTINCT ON ({i_key}) {i_cols} FROM ({input}) AS i "
    "WHERE {i_among} AND {i_key_not_null} "
    "ORDER BY {i_key}, {ordering}"
)

_BUILD_WINDOW_BATCH = sql.SQL(
    "SELECT {r_cols} FROM (SELECT {i_cols}, row_number() OVER "
    "(PARTITION BY {i_pk}, {i_bk} ORDER BY {ordering}) AS {rank} FROM ({input}) AS i "
    "WHERE {i_among} AND {i_key_not_null}) AS r WHERE {r_rank} = 1"
)

_DELETE_PARTITIONS = sql.SQL("DELETE FROM {rel} WHERE {among}")


def _into(stage: TableRef | None, columns: Sequence[str], select: sql.Composed) -> sql.Composed:
    """``select`` inserted into ``stage``, or left a SELECT (``stage`` None: rows hashed, not kept)."""
    if stage is None:
        return select
    return _INSERT.format(stage=table(stage), cols=sql.SQL(", ").join(sql.Identifier(c) for c in columns)) + select


def build_stage_batch(
    variant: Literal["a", "b"], stage: TableRef | None, input_rel: sql.Composed,
    columns: Sequence[str], by: PartitionBy | str, business_key: Sequence[str],
    ordering: Sequence[OrderKey], params: Mapping[str, Any], batch: Sequence[object],
) -> Query:
    """Insert the newest row per non-null business key of each of several partitions (keys
    that stay in their partition) into a stage, in one statement: ``a`` by DISTINCT ON over
    (partition, key), ``b`` by a row_number() window partitioned by them. ``stage`` None:
    the same rows as a SELECT, inserted nowhere."""
    by = as_by(by)
    common = dict(
        i_cols=cols("i", columns), input=input_rel, i_pk=by.key("i", "batch"), i_among=by.among("i", "batch"),
        i_key_not_null=key_not_null("i", business_key), ordering=order_by("i", ordering),
    )
    if variant == "a":
        i_key = sql.SQL(", ").join([by.key("i", "batch"), cols("i", business_key)])
        query = _BUILD_DISTINCT_ON_BATCH.format(i_key=i_key, **common)
    else:
        query = _BUILD_WINDOW_BATCH.format(
            r_cols=cols("r", columns), i_bk=cols("i", business_key),
            rank=sql.Identifier(RANK_COLUMN), r_rank=col("r", RANK_COLUMN), **common,
        )
    return _into(stage, columns, query), {**params, **by.bind(batch, "batch")}


def delete_partitions(rel: TableRef, by: PartitionBy | str, batch: Sequence[object]) -> Query:
    """Delete the rows of several partitions."""
    by = as_by(by)
    return _DELETE_PARTITIONS.format(rel=table(rel), among=by.among(None, "batch")), by.bind(batch, "batch")


def delete_partition(rel: TableRef, by: PartitionBy | str, partition: object) -> Query:
    """Delete one partition's rows."""
    by = as_by(by)
    return _DELETE_PARTITION.format(rel=table(rel), at=by.at(None)), by.bind_one(partition)


def build_stage(
    variant: Literal["a", "b"], stage: TableRef | None, input_rel: sql.Composed,
    columns: Sequence[str], by: PartitionBy | str, business_key: Sequence[str],
    ordering: Sequence[OrderKey], params: Mapping[str, Any], partition: object,
    *, moving: bool = False,
) -> Query:
    """Insert the newest row per non-null business key of one partition into a stage
    (``stage`` None: the same rows as a SELECT, inserted nowhere).

    Variant ``a`` uses DISTINCT ON, variant ``b`` a row_number() window: two physical
    plans, so a result that depends on physical row order shows up as a difference.
    With ``moving``, the newest version is chosen per key across all partitions.
    """
    by = as_by(by)
    common = dict(
        i_cols=cols("i", columns), input=input_rel,
        i_key_not_null=key_not_null("i", business_key), ordering=order_by("i", ordering),
    )
    if moving and variant == "a":
        query = _BUILD_DISTINCT_ON_MOVING.format(
            g_cols=cols("g", columns), i_bk=cols("i", business_key), g_at=by.at("g"), **common,
        )
    elif moving:
        query = _BUILD_WINDOW_MOVING.format(
            r_cols=cols("r", columns), i_bk=cols("i", business_key),
            rank=sql.Identifier(RANK_COLUMN), r_rank=col("r", RANK_COLUMN), r_at=by.at("r"), **common,
        )
    elif variant == "a":
        # One partition: its rows share the partition, so the key alone orders DISTINCT ON.
        query = _BUILD_DISTINCT_ON.format(i_key=cols("i", business_key), i_at=by.at("i"), **common)
    else:
        query = _BUILD_WINDOW.format(
            r_cols=cols("r", columns), i_bk=cols("i", business_key), i_at=by.at("i"),
            rank=sql.Identifier(RANK_COLUMN), r_rank=col("r", RANK_COLUMN), **common,
        )
    return _into(stage, columns, query), {**params, **by.bind_one(partition)}
