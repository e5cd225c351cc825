"""The format-3 digest in DuckDB's SQL (core.fingerprint.rows is its specification).

DuckDB computes it over Arrow data (a lake partition as deltalake or pyiceberg hand it over)
as a parallel aggregate; the next engine to run the whole process on DuckDB uses the same
expressions over its own tables. Identifiers are quoted by :func:`ident`; no value is ever
put into the text of a statement.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from backfill_assets.core.fingerprint import rows

# A double's IEEE 754 bits from its hexadecimal form ('-0x1.8p+1', subnormals '0x0.0...1p-1022',
# zero '0x0p+0'): the sign bit, the biased exponent (0 for zero and subnormals) and the
# 52-bit fraction, printed as 16 hex digits.
_HEX_FLOAT = "regexp_extract(printf('%a', {v}), '^(-?)0x([01])\\.?([0-9a-f]*)p([+-][0-9]+)$', ['s', 'lead', 'frac', 'exp'])"
# DuckDB prints it with its own formatting library (the same on every platform); a form the
# pattern does not match stops the statement rather than give wrong bits.
_HEX_FLOAT_FORM = "^-?0x[01](\\.[0-9a-f]+)?p[+-][0-9]+$"
_DOUBLE = (
    "CASE WHEN isnan({v}) THEN '" + rows.NAN_BITS + "' "
    "WHEN isinf({v}) THEN CASE WHEN {v} > 0 THEN '7ff0000000000000' ELSE 'fff0000000000000' END "
    "WHEN NOT regexp_full_match(printf('%a', {v}), '" + _HEX_FLOAT_FORM + "') "
    "THEN error('a double printed in an unexpected hexadecimal form: ' || printf('%a', {v})) "
    "ELSE printf('%03x', (CASE WHEN {h}.s = '-' THEN 2048 ELSE 0 END) "
    "+ (CASE WHEN {h}.lead = '1' THEN CAST({h}.exp AS INTEGER) + 1023 ELSE 0 END)) || rpad({h}.frac, 13, '0') END"
)
_FIELD = {
    "integer": "CAST({v} AS VARCHAR)",
    "decimal": "CAST({v} AS VARCHAR)",
    "boolean": "CAST({v} AS VARCHAR)",
    "date": "strftime({v}, '%Y-%m-%d')",
    "timestamp": "CAST(epoch_us({v}) AS VARCHAR)",
    "text": "CAST(strlen({v}) AS VARCHAR) || ':' || {v}",
    "bytes": "lower(hex({v}))",
}


def ident(name: str) -> str:
    """A DuckDB identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def field(name: str, kind: str) -> str:
    v = "t." + ident(name)
    if kind == "double":
        rendered = _DOUBLE.format(v=v, h=_HEX_FLOAT.format(v=v))
    elif kind in _FIELD:
        rendered = _FIELD[kind].format(v=v)
    else:
        raise ValueError(f"DuckDB renders no {kind} values")
    return f"coalesce({rendered}, '{rows.NULL}')"


def row_text(fields: Sequence[tuple[str, str]]) -> str:
    """A row's canonical text from (column, kind) pairs, in the declared order."""
    return " || '|' || ".join(field(n, k) for n, k in fields)


def digest_sql(relation: str, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
               float_keys: Sequence[str] = ()) -> str:
    """One row: count, NULL-key count, duplicate-key count, slice sums, over ``relation``
    (aliased ``t``). ``float_keys``: key columns of kind double (-0 and 0 are one key, as
    PostgreSQL compares them)."""
    keys = [("(t." + ident(k) + " + 0.0)") if k in float_keys else "t." + ident(k) for k in business_key]
    null_key = " OR ".join(f"t.{ident(k)} IS NULL" for k in business_key) or "false"
    slices = ", ".join(
        f"sum(CAST(('0x' || substr(h, {1 + i * rows.SLICE_HEX}, {rows.SLICE_HEX})) AS UBIGINT)::HUGEINT)"
        for i in range(rows.SLICES)
    )
    return (
        f"SELECT count(*), coalesce(sum(nk), 0), coalesce(sum(CASE WHEN nk = 0 THEN 1 ELSE 0 END), 0) - "
        f"count(DISTINCT CASE WHEN nk = 0 THEN k END), {slices} FROM "
        f"(SELECT CASE WHEN {null_key} THEN 1 ELSE 0 END AS nk, row({', '.join(keys)}) AS k, "
        f"sha256({row_text(fields)}) AS h FROM {relation} AS t) AS q"
    )


_database: Any = None
_database_lock = threading.Lock()


def _connection() -> Any:
    """A connection of its own (a DuckDB cursor: safe to use in one thread) to this process's
    in-memory database, opened once: a new database costs ~30 ms, a cursor ~1 ms."""
    global _database
    with _database_lock:
        if _database is None:
            import duckdb  # imported here: only lake readings need it

            _database = duckdb.connect()
        return _database.cursor()


def readings(table: pa.Table, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
             float_keys: Sequence[str] = ()) -> tuple[int, int, int, list[int]]:
    """(row count, NULL-key count, duplicate-key count, slice sums) of an Arrow table, computed
    by DuckDB in one aggregate."""
    with _connection() as con:
        con.register("partition_rows", table)  # a view of this connection only
        row = con.execute(digest_sql("partition_rows", fields, business_key, float_keys)).fetchone()
    assert row is not None
    count, null_keys, duplicates, *sums = row
    return int(count), int(null_keys), int(duplicates), [int(s or 0) for s in sums]
