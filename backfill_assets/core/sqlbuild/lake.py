"""Reading a stage partition for a lake table: its typed values as CSV, in business-key order,
for pyarrow's CSV reader (see core/arrow_fingerprint.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.spec import TableRef
from backfill_assets.core.sqlbuild.parts import OrderKey, Query, col, order_by, table

# CSV, not text: NULL is an unquoted empty field and the empty string a quoted one, and values
# with newlines are quoted, which pyarrow's CSV reader tells apart. Columns are not cast: COPY
# prints each value with its output function under the pinned session (UTC, ISO dates, shortest
# exact floats, hex bytea), the forms the reader parses exactly.
_COPY_CSV = sql.SQL(
    "COPY (SELECT {cols} FROM {rel} AS t WHERE {pk} = %(partition)s ORDER BY {order}) "
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
    rel: TableRef, columns: Sequence[str], partition_key: str, order: Sequence[OrderKey], partition: object,
) -> Query:
    """CSV COPY of one partition of ``rel`` (aliased ``t``): ``columns`` in the given order,
    rows in ``order``. The partition value is bound by psycopg on the client (COPY takes no
    parameters)."""
    query = _COPY_CSV.format(
        cols=sql.SQL(", ").join(col("t", c) for c in columns), rel=table(rel),
        pk=col("t", partition_key), order=order_by("t", order),
    )
    return query, {"partition": partition}
