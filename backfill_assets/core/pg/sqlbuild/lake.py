"""Reading a stage partition for a lake table: its typed values as CSV, in business-key order,
for pyarrow's CSV reader (see core/fingerprint/arrow.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import OrderKey, Query, col, order_by, table
from backfill_assets.core.vocabulary import TableRef

# CSV, not text: NULL is an unquoted empty field and the empty string a quoted one, and values
# with newlines are quoted, which pyarrow's CSV reader tells apart. Columns are not cast: COPY
# prints each value with its output function under the pinned session (UTC, ISO dates, shortest
# exact floats, hex bytea), the forms the reader parses exactly.
# Every row starts with a constant 0: pyarrow drops a byte-order mark (U+FEFF) at the start of
# the text it parses, which would otherwise be the first value of the first row of each batch.
_COPY_CSV = sql.SQL(
    "COPY (SELECT 0, {cols} FROM {rel} AS t WHERE {at} ORDER BY {order}) "
    "TO STDOUT (FORMAT csv)"
)


# What the CSV's text forms depend on (TimeZone does not: every offset is parsed).
_READ_SETTINGS = sql.SQL(
    "SELECT current_setting('extra_float_digits')::int, current_setting('DateStyle'), "
    "current_setting('bytea_output'), current_setting('client_encoding')"
)


def read_settings() -> Query:
    """The session settings a CSV read of typed values depends on: extra_float_digits (below
    1, floats print rounded), DateStyle, bytea_output and client_encoding."""
    return _READ_SETTINGS.format(), {}


def copy_partition_csv(
    rel: TableRef, columns: Sequence[str], by: PartitionBy | str, order: Sequence[OrderKey], partition: object,
) -> Query:
    """CSV COPY of one partition of ``rel`` (aliased ``t``): a constant 0, then ``columns`` in
    the given order, rows in ``order``. The partition (a value, or a window's bounds) is bound by
    psycopg on the client (COPY takes no parameters)."""
    by = as_by(by)
    query = _COPY_CSV.format(
        cols=sql.SQL(", ").join(col("t", c) for c in columns), rel=table(rel),
        at=by.at("t"), order=order_by("t", order),
    )
    return query, by.bind_one(partition)


# Values a lake column cannot hold, by the column's base type (the lake keeps years 1..9999,
# finite dates and time stamps, and no NaN in a decimal).
_UNHOLDABLE = {
    "date": sql.SQL("NOT isfinite({c}) OR {c} < DATE '0001-01-01' OR {c} > DATE '9999-12-31'"),
    "timestamptz": sql.SQL(
        "NOT isfinite({c}) OR {c} < TIMESTAMPTZ '0001-01-01 00:00:00+00' "
        "OR {c} > TIMESTAMPTZ '9999-12-31 23:59:59.999999+00'"
    ),
    "numeric": sql.SQL("{c} = 'NaN'::numeric"),
}
_UNHOLDABLE_COUNTS = sql.SQL(
    "SELECT {name}::text, {counts} FROM {rel} AS t WHERE {among} GROUP BY {key} ORDER BY {key}"
)


def unholdable_kinds() -> frozenset[str]:
    """The base types :func:`unholdable_values` checks."""
    return frozenset(_UNHOLDABLE)


def unholdable_values(rel: TableRef, by: PartitionBy | str, columns: Sequence[tuple[str, str]],
                      partitions: list) -> Query:
    """Per partition of ``rel`` among ``partitions``: how many values of each ``(column, base
    type)`` a lake column could not hold. Rows: (partition text, count per column...)."""
    counts = sql.SQL(", ").join(
        sql.SQL("count(*) FILTER (WHERE {})").format(_UNHOLDABLE[base].format(c=col("t", name)))
        for name, base in columns
    )
    by = as_by(by)
    key = by.key("t")
    return _UNHOLDABLE_COUNTS.format(name=by.name(key), key=key, counts=counts, rel=table(rel),
                                     among=by.among("t")), by.bind(partitions)
