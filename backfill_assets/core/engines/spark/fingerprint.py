"""The format-3 digest in Apache Spark (core.fingerprint.rows is its specification).

Built with the DataFrame API, not SQL text: Spark quotes identifiers with backticks and, unless
a session says otherwise, reads a double-quoted name as a string literal, so no statement text
is composed here at all. Each kind renders as the specification says:

- integers, booleans, fixed-scale decimals: Spark's cast to string (plain digits, ``true`` /
  ``false``, the declared scale);
- doubles: ``java.lang.Double.doubleToLongBits`` through Spark's ``reflect`` (every NaN as
  ``7ff8000000000000``, -0 apart from 0), as 16 lower-case hex digits;
- text: ``<UTF-8 byte length>:<text>`` (``octet_length``); bytes: lower-case hex;
- dates: ``yyyy-MM-dd``; time stamps: epoch microseconds (``unix_micros``), whatever the
  session's time zone.

The digest is an aggregate Spark runs in parallel: per partition the row count, the NULL and
duplicate business keys, the exact sums of three 60-bit slices of the rows' SHA-256, and the
total. Each slice is summed as two 30-bit halves in ``bigint`` (Spark's decimal sums cost
about as much again as the rest of the digest): a half's sum cannot overflow below 2**33 rows
a partition, whatever the session's ANSI mode, and a partition that large is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.core.fingerprint import rows

_HALF = 30  # bits: a 60-bit slice is summed as its high and low 30 bits
_MAX_ROWS = 1 << (63 - _HALF)  # below this, no half's sum reaches 2**63

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _field(F: Any, name: str, kind: str) -> Any:  # noqa: N803 - pyspark.sql.functions, passed in
    c = F.col(name)
    if kind in ("integer", "decimal", "boolean"):
        rendered = c.cast("string")
    elif kind == "double":
        # reflect cannot pass a NULL as a primitive double: it is given a value only where there is one.
        bits = F.call_function("reflect", F.lit("java.lang.Double"), F.lit("doubleToLongBits"), F.coalesce(c, F.lit(0.0)))
        rendered = F.when(c.isNotNull(), F.lower(F.lpad(F.hex(bits.cast("bigint")), 16, "0")))
    elif kind == "text":
        rendered = F.concat(F.octet_length(c).cast("string"), F.lit(":"), c)
    elif kind == "bytes":
        rendered = F.lower(F.hex(c))
    elif kind == "date":
        rendered = F.date_format(c, "yyyy-MM-dd")
    elif kind == "timestamp":
        rendered = F.unix_micros(c).cast("string")
    else:
        raise ValueError(f"Spark renders no {kind} values")
    return F.coalesce(rendered, F.lit(rows.NULL))


def row_text(fields: Sequence[tuple[str, str]]) -> Any:
    """A row's canonical text, as a Spark column, from (column, kind) pairs in the declared order."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
    return F.concat_ws(rows.SEPARATOR, *(_field(F, n, k) for n, k in fields))


def partition_readings(frame: DataFrame, fields: Sequence[tuple[str, str]], business_key: Sequence[str],
                       partition_key: str, total: str | None, float_keys: Sequence[str] = ()) -> list[tuple]:
    """Per partition of ``frame`` (a Spark DataFrame) that has rows: (partition value, count,
    NULL-key count, duplicate-key count, slice sums..., total or None), from one aggregate."""
    from pyspark.sql import functions as F  # noqa: N812

    keys = [(F.col(k) + F.lit(0.0)).alias(f"__k{i}") if k in float_keys else F.col(k).alias(f"__k{i}")
            for i, k in enumerate(business_key)]
    null_key = F.lit(False)
    for k in business_key:
        null_key = null_key | F.col(k).isNull()
    rows_of = frame.select(
        F.col(partition_key).alias("__p"),
        F.when(null_key, 1).otherwise(0).alias("__nk"),
        *keys,
        F.sha2(row_text(fields), 256).alias("__h"),
        *([F.col(total).alias("__t")] if total else []),
    )
    halves = []
    for i in range(rows.SLICES):
        piece = F.conv(F.substring("__h", 1 + i * rows.SLICE_HEX, rows.SLICE_HEX), 16, 10).cast("bigint")
        halves += [F.shiftright(piece, _HALF), piece.bitwiseAND(F.lit((1 << _HALF) - 1))]
    # Two aggregates, no distinct count: per (partition, key) first, where a key's rows are
    # counted (its duplicates are all but one, unless the key has a NULL), then per partition.
    per_key = rows_of.groupBy("__p", *[f"__k{i}" for i in range(len(business_key))]).agg(
        F.count(F.lit(1)).alias("__n"), F.max("__nk").alias("__nk"),
        *[F.sum(half).alias(f"__s{i}") for i, half in enumerate(halves)],
        *([F.sum("__t").alias("__t")] if total else []),
    )
    found = per_key.groupBy("__p").agg(
        F.sum("__n"), F.sum(F.when(F.col("__nk") == 1, F.col("__n")).otherwise(0)),
        F.sum(F.when(F.col("__nk") == 0, F.col("__n") - 1).otherwise(0)),
        *[F.sum(f"__s{i}") for i in range(len(halves))], F.sum("__t") if total else F.lit(None),
    ).collect()
    out = []
    for p, count, null_keys, duplicates, *rest in found:
        if count >= _MAX_ROWS:
            raise ValueError(f"partition {p!r} has {count:,} rows: Spark's digest sums them in 64 bits up to "
                             f"{_MAX_ROWS:,} a partition; split the partition key finer")
        sums = [((hi or 0) << _HALF) + (lo or 0) for hi, lo in zip(rest[0:-1:2], rest[1:-1:2], strict=True)]
        out.append((p, count, null_keys, duplicates, *sums, rest[-1]))
    return out


def readings(frame: DataFrame, columns: Sequence[Any], business_key: Sequence[str], partition_key: str,
             total: str | None) -> dict[Any, rows.Fingerprint]:
    """Each partition's readings, by partition value: equal to PostgreSQL's and DuckDB's for the
    same rows (``columns``: the ColumnInfo of every column, in order)."""
    fields = [(c.name, rows.kind_of(c)) for c in columns]
    float_keys = [c.name for c in columns if c.name in business_key and rows.kind_of(c) == "double"]
    out = {}
    for value, count, null_keys, duplicates, *sums, total_value in partition_readings(
            frame, fields, business_key, partition_key, total, float_keys):
        n = int(count)
        out[value] = rows.Fingerprint(n, int(null_keys or 0), int(duplicates or 0),
                                      None if total is None else rows.total_text(total_value),
                                      rows.content_hash(columns, n, [int(s or 0) for s in sums]))
    return out
