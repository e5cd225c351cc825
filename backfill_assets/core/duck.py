"""Every DuckDB connection the project opens, with what it must never do.

DuckDB 2.0 rewrites "the first row of each group" (a window's ``row_number() = 1``, or a
correlated ``ORDER BY ... LIMIT 1``) into ``arg_max``/``arg_min`` over a struct of the row, and
that struct gives a double's -0.0 back as 0.0: a value changes on its way through. Stage B's
build is such a window, so the two builds differed wherever the source held a -0.0 (a false
refusal), a transform's own ``row_number() = 1`` would write 0.0 for -0.0, and the diff's
example rows showed it. The rewrite (``top_n_window_elimination``) is turned off on every
connection; the test of the diff on every engine plants a -0.0 for it.

:func:`copy_batches` moves rows a library hands over in batches into a DuckDB temporary table,
a batch at a time, so that DuckDB holds them within its memory_limit (spilling beyond it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from psycopg import sql

DISABLED_OPTIMIZERS = "top_n_window_elimination"


def connect(database: str = ":memory:", config: Mapping[str, str] | None = None) -> Any:
    """``duckdb.connect`` with :data:`DISABLED_OPTIMIZERS` (and ``config``)."""
    import duckdb
    return duckdb.connect(database, config={"disabled_optimizers": DISABLED_OPTIMIZERS, **(config or {})})


_INCOMING = "incoming_batches"


def copy_batches(duck: Any, table: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Any:
    """The rows of ``batches`` (of ``schema``) in the temporary table ``table`` of the
    connection ``duck`` (replaced), read a batch at a time; the table as a relation."""
    first = next(batches, None)
    schema = schema if first is None else first.schema

    def chained() -> Iterator[pa.RecordBatch]:
        if first is not None:
            yield first
        yield from batches

    duck.register(_INCOMING, pa.RecordBatchReader.from_batches(schema, chained()))
    try:
        duck.execute(sql.SQL("CREATE OR REPLACE TEMPORARY TABLE {} AS SELECT {} FROM {}").format(
            sql.Identifier(table), sql.SQL(", ").join(sql.Identifier(n) for n in schema.names),
            sql.Identifier(_INCOMING)).as_string(None))
    finally:
        duck.unregister(_INCOMING)
    return duck.table(table)
