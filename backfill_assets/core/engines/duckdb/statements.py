"""The DuckDB statements of the DuckDB engine, composed with psycopg.sql (whose identifier
quoting is DuckDB's too) and rendered to text without a PostgreSQL connection. Values are
never put in the text: they are DuckDB's named parameters (``$partition``, ``$partitions``).

The input is the pinned source rows (core.pinned.source.SOURCE_ROWS) as the relation ``source``,
through the validated ``transform_sql`` if there is one, reduced to the columns newest-wins
reads. Stage A keeps each key's newest row by ``DISTINCT ON``, stage B by ``row_number()``
over a window: two formulations that agree only if the order is total, which the checks
before the builds make sure of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from backfill_assets.core.comparison.compare import identifiers as _ids
from backfill_assets.core.comparison.compare import text_of as _text
from backfill_assets.core.engines.duckdb.guard import type_sql
from backfill_assets.core.fingerprint import digest
from backfill_assets.core.pinned.source import SOURCE_ROWS, WINDOWS
from backfill_assets.core.spec import OrderingColumn

_PARTITIONS = sql.SQL("(SELECT unnest($partitions))")


def input_relation(source_columns: Sequence[str], input_columns: Sequence[str], transform: str | None) -> sql.Composed:
    """The input of the builds, as a parenthesised query: ``source`` is the pinned rows' own
    columns; the transform (or ``source`` itself) gives the input columns."""
    body = sql.SQL(transform) if transform is not None else sql.SQL("SELECT {} FROM source").format(_ids(input_columns))
    return sql.SQL("(WITH source AS (SELECT {cols} FROM {rows}) SELECT {inputs} FROM ({body}) AS input)").format(
        cols=_ids(source_columns), rows=sql.Identifier(SOURCE_ROWS), inputs=_ids(input_columns), body=body,
    )


# A time window's label, a column the input and the stages carry beside the spec's columns
# when the spec declares partition_window: every statement that reads some partitions reads
# them by it, as by a partition key's values (its value is the label).
WINDOW = "__backfill_window"
_LABELLED = sql.SQL(
    "(SELECT {cols}, w.label AS {window} FROM {relation} AS i LEFT JOIN {windows} AS w "
    "ON i.{column} >= w.lo AND i.{column} < w.hi)")


def labelled(relation: sql.Composable, column: str, columns: Sequence[str]) -> sql.Composed:
    """``relation`` (of ``columns``) with :data:`WINDOW`: the label of the window (of those
    registered as core.pinned.source.WINDOWS) its ``column`` lies in, NULL outside them."""
    return _LABELLED.format(cols=_ids(columns, "i"), window=sql.Identifier(WINDOW), relation=relation,
                            windows=sql.Identifier(WINDOWS), column=sql.Identifier(column))


def describe(relation: sql.Composed, columns: Sequence[str]) -> str:
    """The output columns' names and types (DuckDB's DESCRIBE of the query)."""
    return _text(sql.SQL("DESCRIBE SELECT {} FROM {} AS i").format(_ids(columns), relation))


def create_stage(stage: str, columns: Sequence[tuple[str, str]]) -> str:
    return _text(sql.SQL("CREATE OR REPLACE TABLE {} ({})").format(
        sql.Identifier(stage), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), type_sql(t))
                                                  for n, t in columns)))


TABLE_COLUMNS = ("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'main' "
                 "AND table_name = $table ORDER BY ordinal_position")  # a table's columns (``$table``)


def delete_partition(stage: str, partition_key: str) -> str:
    return _text(sql.SQL("DELETE FROM {} WHERE {} = $partition").format(sql.Identifier(stage), sql.Identifier(partition_key)))


def _order(ordering: Sequence[OrderingColumn]) -> sql.Composed:
    return sql.SQL(", ").join(
        sql.SQL("{} {} NULLS {}").format(sql.Identifier("i", o.column), sql.SQL(o.direction.upper()),
                                         sql.SQL((o.nulls or "last").upper()))
        for o in ordering
    )


def delete_partitions(stage: str, partition_key: str) -> str:
    return _text(sql.SQL("DELETE FROM {} WHERE {} IN {}").format(
        sql.Identifier(stage), sql.Identifier(partition_key), _PARTITIONS))


def _keyed(partition_key: str, business_key: Sequence[str]) -> sql.Composed:
    """The rows of the partitions ``$partitions`` with a whole business key (rows with a NULL
    key are dropped and reported)."""
    return sql.SQL(" AND ").join([
        sql.SQL("{} IN {}").format(sql.Identifier("i", partition_key), _PARTITIONS),
        *(sql.SQL("{} IS NOT NULL").format(sql.Identifier("i", k)) for k in business_key),
    ])


def build_stage(variant: str, stage: str, relation: sql.Composed, columns: Sequence[str], partition_key: str,
                business_key: Sequence[str], ordering: Sequence[OrderingColumn], *, moving: bool = False) -> str:
    """Insert into ``stage`` the rows of :func:`build_select`."""
    return _text(sql.SQL("INSERT INTO {} ({}) ").format(sql.Identifier(stage), _ids(columns)) + build_select(
        variant, relation, columns, partition_key, business_key, ordering, moving=moving))


def build_select(variant: str, relation: sql.Composed, columns: Sequence[str], partition_key: str,
                 business_key: Sequence[str], ordering: Sequence[OrderingColumn], *, moving: bool = False) -> sql.Composed:
    """The newest row per key of the partitions ``$partitions``, as a query: stage A's by
    DISTINCT ON, stage B's by a window. With ``moving`` (records_can_move) a key's newest
    version is chosen across every partition of the input, so a key that moved lands in its
    newest partition only: the input must then hold every version of the scope's keys (a closed
    scope does)."""
    grain = business_key if moving else [partition_key, *business_key]
    if variant == "a":
        select = sql.SQL(
            "SELECT DISTINCT ON ({grain}) {cols} FROM {input} AS i WHERE {keyed} ORDER BY {grain}, {order}"
        ).format(grain=_ids(grain, "i"), cols=_ids(columns, "i"), input=relation,
                 keyed=_keyed(partition_key, business_key), order=_order(ordering))
    else:
        select = sql.SQL(
            "SELECT {cols} FROM (SELECT {icols}, row_number() OVER (PARTITION BY {grain} ORDER BY {order}) "
            "AS __backfill_rank FROM {input} AS i WHERE {keyed}) AS r WHERE __backfill_rank = 1"
        ).format(cols=_ids(columns), icols=_ids(columns, "i"), grain=_ids(grain, "i"), order=_order(ordering),
                 input=relation, keyed=_keyed(partition_key, business_key))
    return select


def input_report(relation: sql.Composed, partition_key: str, business_key: Sequence[str]) -> str:
    """Per partition: the input rows, and those with a NULL in the business key."""
    null_key = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier("i", k)) for k in business_key)
    return _text(sql.SQL(
        "SELECT {pk}, count(*), count(*) FILTER (WHERE {null_key}) FROM {input} AS i GROUP BY {pk}"
    ).format(pk=sql.Identifier("i", partition_key), null_key=null_key, input=relation))


def outside_partitions(relation: sql.Composed, partition_key: str) -> str:
    """Up to 3 partition values of input rows outside ``$partitions`` (a transform moved
    them), with their counts."""
    pk = sql.Identifier("i", partition_key)
    return _text(sql.SQL(
        "SELECT CAST({pk} AS VARCHAR), count(*) FROM {input} AS i WHERE {pk} IS NULL OR {pk} NOT IN {parts} "
        "GROUP BY {pk} ORDER BY 2 DESC LIMIT 3"
    ).format(pk=pk, input=relation, parts=_PARTITIONS))


def ordering_nulls(relation: sql.Composed, business_key: Sequence[str], ordering: Sequence[str]) -> str:
    """Per ordering column, how many keyed input rows have it NULL."""
    keyed = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier("i", k)) for k in business_key)
    counts = sql.SQL(", ").join(sql.SQL("count(*) FILTER (WHERE {} IS NULL)").format(sql.Identifier("i", o))
                                for o in ordering)
    return _text(sql.SQL("SELECT {} FROM {} AS i WHERE {}").format(counts, relation, keyed))


def tied_groups(relation: sql.Composed, partition_key: str | None, business_key: Sequence[str],
                ordering: Sequence[str], fields: Sequence[tuple[str, str]]) -> str:
    """Up to 3 groups of keyed rows equal on the partition, the key and every ordering column
    whose output rows differ (their canonical texts, core.fingerprint.digest): newest-wins
    would pick one of them by chance."""
    scope = [partition_key] if partition_key is not None else []  # None: per key across partitions
    group = [*scope, *business_key, *ordering]
    keyed = sql.SQL(" AND ").join(sql.SQL("{} IS NOT NULL").format(sql.Identifier("t", k)) for k in business_key)
    shown = sql.SQL(", ").join(sql.SQL("CAST({} AS VARCHAR)").format(sql.Identifier("t", c))
                               for c in [*scope, *business_key])
    # Groups of one row (nearly all) are found by a plain GROUP BY; only the rows of the
    # others are rendered and compared.
    same = sql.SQL(" AND ").join(sql.SQL("t.{c} IS NOT DISTINCT FROM g.{c}").format(c=sql.Identifier(c))
                                 for c in group)
    return _text(sql.SQL(
        "WITH g AS (SELECT {group} FROM {input} AS t WHERE {keyed} GROUP BY {group} HAVING count(*) > 1) "
        "SELECT {shown}, count(DISTINCT {row}) FROM {input} AS t JOIN g ON {same} GROUP BY {tgroup} "
        "HAVING count(DISTINCT {row}) > 1 LIMIT 3"
    ).format(shown=shown, row=sql.SQL(digest.row_text(fields)), input=relation, keyed=keyed,
             group=_ids(group, "t"), tgroup=_ids(group, "t"), same=same))


def stage_rows(stage: str, columns: Sequence[str], partition_key: str, business_key: Sequence[str]) -> str:
    """One partition of a stage, in business-key order (what apply writes to the target)."""
    return _text(sql.SQL("SELECT {} FROM {} WHERE {} = $partition ORDER BY {}").format(
        _ids(columns), sql.Identifier(stage), sql.Identifier(partition_key), _ids(business_key)))


def unholdable(stage: str, partition_key: str, columns: Sequence[str]) -> str:
    """Per partition among ``$partitions``, for each date or time stamp column: the values a
    lake column cannot hold (infinite, or a year outside 1 to 9999)."""
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE isinf({c}) OR year({c}) < 1 OR year({c}) > 9999)").format(c=sql.Identifier(c))
        for c in columns
    )
    return _text(sql.SQL("SELECT {pk}, {counts} FROM {stage} WHERE {pk} IN {parts} GROUP BY {pk}").format(
        pk=sql.Identifier(partition_key), counts=counts, stage=sql.Identifier(stage), parts=_PARTITIONS))


def create_builds(table: str) -> str:
    """The builds' records in the DuckDB database: per stage and partition, the snapshot it was
    built from, its readings (JSON) and its seal, written in the build's own transaction."""
    return _text(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {} (variant VARCHAR NOT NULL, partition VARCHAR NOT NULL, "
        "snapshot_id VARCHAR NOT NULL, readings VARCHAR NOT NULL, row_count BIGINT NOT NULL, seal VARCHAR NOT NULL)"
    ).format(sql.Identifier(table)))


def delete_builds(table: str) -> str:
    return _text(sql.SQL("DELETE FROM {} WHERE variant = $variant AND partition IN (SELECT unnest($labels))").format(
        sql.Identifier(table)))


def insert_build(table: str) -> str:
    return _text(sql.SQL(
        "INSERT INTO {} (variant, partition, snapshot_id, readings, row_count, seal) "
        "VALUES ($variant, $partition, $snapshot_id, $readings, $row_count, $seal)").format(sql.Identifier(table)))


def builds_of(table: str) -> str:
    return _text(sql.SQL(
        "SELECT partition, readings, row_count, seal FROM {} WHERE variant = $variant "
        "AND partition IN (SELECT unnest($labels))").format(sql.Identifier(table)))


def seals(stage: str, partition_key: str, fields: Sequence[tuple[str, str]]) -> str:
    """Per partition among ``$partitions`` that has rows: its value, row count and seal, the
    exact sum of DuckDB's 64-bit hash of every row (a double by its hexadecimal form, which
    tells -0 from 0; DuckDB's hash does not). One fast pass, no SHA-256: see core.engines.duckdb."""
    return _text(sql.SQL(
        "SELECT {pk}, count(*), CAST(sum(CAST({hash} AS HUGEINT)) AS VARCHAR) FROM {stage} "
        "WHERE {pk} IN {parts} GROUP BY {pk}"
    ).format(pk=sql.Identifier(partition_key), hash=digest.seal_hash(fields), stage=sql.Identifier(stage),
             parts=_PARTITIONS))


def partition_counts(relation: str | sql.Composable, partition_key: str) -> str:
    """Per partition among ``$partitions`` that has rows: its value and row count (``relation``:
    a relation's name, or a parenthesised query aliased by the caller's need)."""
    rel = sql.Identifier(relation) if isinstance(relation, str) else sql.SQL("{} AS r").format(relation)
    return _text(sql.SQL("SELECT {pk}, count(*) FROM {rel} WHERE {pk} IN {parts} GROUP BY {pk}").format(
        pk=sql.Identifier(partition_key), rel=rel, parts=_PARTITIONS))


def _homes_parts(business_key: Sequence[str], ordering: Sequence[OrderingColumn]) -> tuple[Any, sql.Composed,
                                                                                         sql.Composed, sql.Identifier]:
    """What both key-home queries are made of: a join of two aliases on the business key,
    the key not NULL in ``s``, the newest-first order over ``s``, and the key's first column."""
    def same(a: str, b: str) -> sql.Composed:
        return sql.SQL(" AND ").join(sql.SQL("{}.{} = {}.{}").format(
            sql.Identifier(a), sql.Identifier(k), sql.Identifier(b), sql.Identifier(k)) for k in business_key)
    not_null = sql.SQL(" AND ").join(sql.SQL("s.{} IS NOT NULL").format(sql.Identifier(k)) for k in business_key)
    order = sql.SQL(", ").join(
        sql.SQL("s.{} {} NULLS {}").format(sql.Identifier(o.column), sql.SQL(o.direction.upper()),
                                           sql.SQL((o.nulls or "last").upper()))
        for o in ordering)
    return same, not_null, order, sql.Identifier(business_key[0])


def key_homes(target_keys: str, partition_key: str, business_key: Sequence[str],
              ordering: Sequence[OrderingColumn]) -> str:
    """For the keys with a source row or a target row in ``$partitions`` (records_can_move):
    each key whose newest source version (its home) lies in another partition than the target
    holds it in, or outside ``$partitions``, or that only one side has. Rows: (home text,
    current text, in source, in target, key values...), as core.moves.close_scope_with reads
    them. The source is every partition of the pin (SOURCE_ROWS), the target's keys
    ``target_keys`` (its distinct (partition key, business key) pairs)."""
    pk = sql.Identifier(partition_key)
    same, not_null, order, first = _homes_parts(business_key, ordering)
    return _text(sql.SQL(
        "WITH k AS (SELECT {s_bk} FROM {rows} AS s WHERE s.{pk} IN {parts} AND {not_null} "
        "UNION SELECT {t_bk} FROM {tgt} AS t WHERE t.{pk} IN {parts}), "
        "h AS (SELECT DISTINCT ON ({s_bk}) {s_bk}, s.{pk} AS __home FROM {rows} AS s "
        "WHERE EXISTS (SELECT 1 FROM k WHERE {k_s}) ORDER BY {s_bk}, {order}), "
        "c AS (SELECT {t_bk}, t.{pk} AS __home FROM {tgt} AS t WHERE EXISTS (SELECT 1 FROM k WHERE {k_t})) "
        "SELECT CAST(h.__home AS VARCHAR), CAST(c.__home AS VARCHAR), h.{first} IS NOT NULL, c.{first} IS NOT NULL, "
        "{key_text} FROM h FULL JOIN c ON {h_c} "
        "WHERE h.{first} IS NULL OR c.{first} IS NULL OR h.__home IS DISTINCT FROM c.__home "
        "OR h.__home NOT IN {parts}"
    ).format(
        s_bk=_ids(business_key, "s"), t_bk=_ids(business_key, "t"), rows=sql.Identifier(SOURCE_ROWS),
        tgt=sql.Identifier(target_keys), pk=pk, parts=_PARTITIONS, not_null=not_null, order=order,
        k_s=same("k", "s"), k_t=same("k", "t"), h_c=same("h", "c"), first=first,
        key_text=sql.SQL(", ").join(sql.SQL("coalesce(h.{k}, c.{k})").format(k=sql.Identifier(k))
                                    for k in business_key),
    ))


def window_key_homes(rows: sql.Composable, target_keys: sql.Composable, partition_key: str,
                     business_key: Sequence[str], ordering: Sequence[OrderingColumn]) -> str:
    """:func:`key_homes` for time windows: ``rows`` (every row of the pin) and ``target_keys``
    carry each row's window label (:func:`labelled`; NULL outside the windows ``$partitions``).
    The keys are those with a row in those windows; each row gives the home and the current
    row's column values themselves (typed: core.moves places them in windows), for every key
    whose newest version's value differs from the target's, lies outside the windows, or that
    only one side has."""
    pk, window = sql.Identifier(partition_key), sql.Identifier(WINDOW)
    same, not_null, order, first = _homes_parts(business_key, ordering)
    return _text(sql.SQL(
        "WITH k AS (SELECT {s_bk} FROM {rows} AS s WHERE s.{window} IN {parts} AND {not_null} "
        "UNION SELECT {t_bk} FROM {tgt} AS t WHERE t.{window} IN {parts}), "
        "h AS (SELECT DISTINCT ON ({s_bk}) {s_bk}, s.{pk} AS __home, s.{window} AS __in FROM {rows} AS s "
        "WHERE EXISTS (SELECT 1 FROM k WHERE {k_s}) ORDER BY {s_bk}, {order}), "
        "c AS (SELECT {t_bk}, t.{pk} AS __home FROM {tgt} AS t WHERE EXISTS (SELECT 1 FROM k WHERE {k_t})) "
        "SELECT h.__home, c.__home, h.{first} IS NOT NULL, c.{first} IS NOT NULL, "
        "{key_text} FROM h FULL JOIN c ON {h_c} "
        "WHERE h.{first} IS NULL OR c.{first} IS NULL OR h.__home IS DISTINCT FROM c.__home OR h.__in IS NULL"
    ).format(
        s_bk=_ids(business_key, "s"), t_bk=_ids(business_key, "t"), rows=rows, tgt=target_keys, pk=pk,
        window=window, parts=_PARTITIONS, not_null=not_null, order=order, k_s=same("k", "s"), k_t=same("k", "t"),
        h_c=same("h", "c"), first=first,
        key_text=sql.SQL(", ").join(sql.SQL("coalesce(h.{k}, c.{k})").format(k=sql.Identifier(k))
                                    for k in business_key),
    ))


def keys_in_several_partitions(target_keys: str, business_key: Sequence[str]) -> str:
    """Up to 5 business keys found in more than one partition of the target's distinct
    (partition key, business key) pairs: (key texts..., count)."""
    return _text(sql.SQL(
        "SELECT {shown}, count(*) FROM {tgt} GROUP BY {bk} HAVING count(*) > 1 ORDER BY {bk} LIMIT 5"
    ).format(shown=sql.SQL(", ").join(sql.SQL("CAST({} AS VARCHAR)").format(sql.Identifier(k)) for k in business_key),
             tgt=sql.Identifier(target_keys), bk=_ids(business_key)))


def partition_files(files: str, value: str, columns: Sequence[str], partition_key: str, carried: bool) -> str:
    """A lake partition's rows from its data files (the relation ``files``) as the spec's
    ``columns``: with the partition value the log gives them (the one-row relation ``value``),
    or, where the files carry the partition column (``carried``), their rows of that value."""
    if carried:
        return _text(sql.SQL("SELECT {} FROM {} AS f WHERE {} IN (SELECT {} FROM {} AS v)").format(
            sql.SQL(", ").join(sql.Identifier("f", c) for c in columns), sql.Identifier(files),
            sql.Identifier("f", partition_key), sql.Identifier("v", partition_key), sql.Identifier(value)))
    picked = sql.SQL(", ").join(sql.Identifier("v" if c == partition_key else "f", c) for c in columns)
    return _text(sql.SQL("SELECT {} FROM {} AS f CROSS JOIN {} AS v").format(
        picked, sql.Identifier(files), sql.Identifier(value)))


def columns_of(relation: str, columns: Sequence[str]) -> str:
    """Some columns of every row of a relation."""
    return _text(sql.SQL("SELECT {} FROM {}").format(_ids(columns), sql.Identifier(relation)))


# The rows of one Parquet file ($path), from its footer.
FILE_ROWS = "SELECT count(*) FROM read_parquet($path)"
