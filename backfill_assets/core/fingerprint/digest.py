"""The format-3 digest in DuckDB's SQL (core.fingerprint.rows is its specification).

DuckDB computes it over Arrow data (a lake partition as deltalake or pyiceberg hand it over)
as a parallel aggregate; the next engine to run the whole process on DuckDB uses the same
expressions over its own tables. Statements are composed with psycopg.sql, whose identifier
quoting is DuckDB's too, and rendered to text without a PostgreSQL connection; no value is ever
put into the text of a statement.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from psycopg import sql

from backfill_assets.core.duck import connect
from backfill_assets.core.fingerprint import rows

# A double's IEEE 754 bits from its hexadecimal form ('-0x1.8p+1', subnormals '0x0.0...1p-1022',
# zero '0x0p+0'): the sign bit, the biased exponent (0 for zero and subnormals) and the
# 52-bit fraction, printed as 16 hex digits.
_HEX_FLOAT = sql.SQL(
    "regexp_extract(printf('%a', {v}), '^(-?)0x([01])\\.?([0-9a-f]*)p([+-][0-9]+)$', ['s', 'lead', 'frac', 'exp'])"
)
# DuckDB prints it with its own formatting library (the same on every platform); a form the
# pattern does not match stops the statement rather than give wrong bits.
_HEX_FLOAT_FORM = "^-?0x[01](\\.[0-9a-f]+)?p[+-][0-9]+$"
_DOUBLE = sql.SQL(
    "CASE WHEN isnan({v}) THEN {nan} "
    "WHEN isinf({v}) THEN CASE WHEN {v} > 0 THEN '7ff0000000000000' ELSE 'fff0000000000000' END "
    "WHEN NOT regexp_full_match(printf('%a', {v}), '" + _HEX_FLOAT_FORM + "') "
    "THEN error('a double printed in an unexpected hexadecimal form: ' || printf('%a', {v})) "
    "ELSE printf('%03x', (CASE WHEN {h}.s = '-' THEN 2048 ELSE 0 END) "
    "+ (CASE WHEN {h}.lead = '1' THEN CAST({h}.exp AS INTEGER) + 1023 ELSE 0 END)) || rpad({h}.frac, 13, '0') END"
)
_FIELD = {
    "integer": sql.SQL("CAST({v} AS VARCHAR)"),
    "decimal": sql.SQL("CAST({v} AS VARCHAR)"),
    "boolean": sql.SQL("CAST({v} AS VARCHAR)"),
    "date": sql.SQL("strftime({v}, '%Y-%m-%d')"),
    "timestamp": sql.SQL("CAST(epoch_us({v}) AS VARCHAR)"),
    "text": sql.SQL("CAST(strlen({v}) AS VARCHAR) || ':' || {v}"),
    "bytes": sql.SQL("lower(hex({v}))"),
}
_COALESCE = sql.SQL("coalesce({}, {})")
_SEPARATOR = sql.SQL(" || '|' || ")
_AS_FLOAT_KEY = sql.SQL("({} + 0.0)")  # -0 and 0 are one key, as PostgreSQL compares them
_IS_NULL = sql.SQL("{} IS NULL")
_SLICE = sql.SQL("sum(CAST(('0x' || substr(h, {start}, {length})) AS UBIGINT)::HUGEINT)")
_DIGEST = sql.SQL(
    "SELECT count(*), coalesce(sum(nk), 0), coalesce(sum(CASE WHEN nk = 0 THEN 1 ELSE 0 END), 0) - "
    "count(DISTINCT CASE WHEN nk = 0 THEN k END), {slices} FROM "
    "(SELECT CASE WHEN {null_key} THEN 1 ELSE 0 END AS nk, row({keys}) AS k, "
    "sha256({text}) AS h FROM {relation} AS t) AS q"
)


def _text(composed: sql.Composable) -> str:
    return composed.as_string(None)


def _field(name: str, kind: str) -> sql.Composed:
    v = sql.Identifier("t", name)
    if kind == "double":
        rendered = _DOUBLE.format(v=v, h=_HEX_FLOAT.format(v=v), nan=sql.Literal(rows.NAN_BITS))
    elif kind in _FIELD:
        rendered = _FIELD[kind].format(v=v)
    else:
        raise ValueError(f"DuckDB renders no {kind} values")
    return _COALESCE.format(rendered, sql.Literal(rows.NULL))


def _row_text(fields: Sequence[tuple[str, str]]) -> sql.Composed:
    return _SEPARATOR.join(_field(n, k) for n, k in fields)


def field_text(name: str, kind: str) -> str:
    """One column's canonical text (its part of the row text) over the relation aliased ``t``."""
    return _text(_field(name, kind))


def row_text(fields: Sequence[tuple[str, str]]) -> str:
    """A row's canonical text from (column, kind) pairs, in the declared order, over the
    relation aliased ``t``."""
    return _text(_row_text(fields))


def _parts(fields: Sequence[tuple[str, str]], business_key: Sequence[str], float_keys: Sequence[str]) -> dict[str, sql.Composable]:
    """What both digests are made of: the slice sums, the NULL-key test, the key (a double
    key as PostgreSQL compares it) and the row text, over the relation aliased ``t``."""
    keys = [_AS_FLOAT_KEY.format(sql.Identifier("t", k)) if k in float_keys else sql.Identifier("t", k)
            for k in business_key]
    return {
        "slices": sql.SQL(", ").join(
            _SLICE.format(start=sql.Literal(1 + i * rows.SLICE_HEX), length=sql.Literal(rows.SLICE_HEX))
            for i in range(rows.SLICES)),
        "null_key": sql.SQL(" OR ").join(_IS_NULL.format(sql.Identifier("t", k)) for k in business_key)
        if business_key else sql.SQL("false"),
        "keys": sql.SQL(", ").join(keys) if business_key else sql.SQL("NULL"),
        "text": _row_text(fields),
    }


def digest_sql(relation: str, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
               float_keys: Sequence[str] = ()) -> str:
    """One row: count, NULL-key count, duplicate-key count, slice sums, over ``relation``
    (aliased ``t``). ``float_keys``: key columns of kind double."""
    return _text(_DIGEST.format(relation=sql.Identifier(relation), **_parts(fields, business_key, float_keys)))


_PARTITION_DIGEST = sql.SQL(
    "SELECT p, count(*), coalesce(sum(nk), 0), coalesce(sum(CASE WHEN nk = 0 THEN 1 ELSE 0 END), 0) - "
    "count(DISTINCT CASE WHEN nk = 0 THEN k END), {slices}, {total}{seal} FROM "
    "(SELECT t.{partition} AS p, CASE WHEN {null_key} THEN 1 ELSE 0 END AS nk, row({keys}) AS k, "
    "sha256({text}) AS h{total_column}{seal_column} FROM {relation} AS t "
    "WHERE t.{partition} IN (SELECT unnest($partitions))) AS q GROUP BY p"
)


def seal_hash(fields: Sequence[tuple[str, str]], alias: str | None = None) -> sql.Composed:
    """DuckDB's 64-bit hash of a row's ``fields`` (a double by its hexadecimal form, which tells
    -0 from 0; DuckDB's hash does not): what a DuckDB stage's seal sums."""
    def column(name: str) -> sql.Identifier:
        return sql.Identifier(alias, name) if alias else sql.Identifier(name)
    return sql.SQL("hash({})").format(sql.SQL(", ").join(
        sql.SQL("printf('%a', {})").format(column(n)) if kind == "double" else column(n) for n, kind in fields))


def partition_digest_sql(relation: str | sql.Composable, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
                         partition_key: str, total: str | None, float_keys: Sequence[str] = (), *,
                         sealed: bool = False) -> str:
    """Per partition among ``$partitions`` (a list parameter) that has rows: the partition
    value, count, NULL-key count, duplicate-key count, slice sums and the exact sum of
    ``total`` (NULL without one), over ``relation`` (a table's name, or a parenthesised query)
    in one grouped aggregate: what the DuckDB engine reads of its stages (core.engines.duckdb).
    ``sealed``: one more column, the seal (the exact sum of :func:`seal_hash` over the rows,
    as text), from the same pass."""
    return _text(_PARTITION_DIGEST.format(
        relation=sql.Identifier(relation) if isinstance(relation, str) else relation,
        partition=sql.Identifier(partition_key),
        total=sql.SQL("sum(tv)") if total else sql.SQL("NULL"),
        total_column=sql.SQL(", t.{} AS tv").format(sql.Identifier(total)) if total else sql.SQL(""),
        seal=sql.SQL(", CAST(sum(sh) AS VARCHAR)") if sealed else sql.SQL(""),
        seal_column=sql.SQL(", CAST({} AS HUGEINT) AS sh").format(seal_hash(fields, "t")) if sealed else sql.SQL(""),
        **_parts(fields, business_key, float_keys),
    ))


_BATCH_ROWS = 8192
_database: Any = None
_database_lock = threading.Lock()


def _connection() -> Any:
    """A connection of its own (a DuckDB cursor: safe to use in one thread) to this process's
    in-memory database, opened once: a new database costs ~30 ms, a cursor ~1 ms."""
    global _database
    with _database_lock:
        if _database is None:
            _database = connect()  # DuckDB itself is imported at the first reading (core.duck.connect)
        return _database.cursor()


def readings(table: pa.Table, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
             float_keys: Sequence[str] = ()) -> tuple[int, int, int, list[int]]:
    """(row count, NULL-key count, duplicate-key count, slice sums) of an Arrow table, computed
    by DuckDB in one aggregate."""
    # DuckDB scans an Arrow table in parallel by its record batches: a partition handed over as
    # one batch would be hashed on one core (measured: twice as long on two cores).
    table = pa.Table.from_batches(table.to_batches(max_chunksize=_BATCH_ROWS), schema=table.schema)
    with _connection() as duck:
        duck.register("partition_rows", table)  # a view of this connection only
        row = duck.execute(digest_sql("partition_rows", fields, business_key, float_keys)).fetchone()
    assert row is not None
    count, null_keys, duplicates, *sums = row
    return int(count), int(null_keys), int(duplicates), [int(s or 0) for s in sums]
