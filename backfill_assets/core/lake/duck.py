"""Every DuckDB connection the project opens, with what it must never do.

DuckDB 2.0 rewrites "the first row of each group" (a window's ``row_number() = 1``, or a
correlated ``ORDER BY ... LIMIT 1``) into ``arg_max``/``arg_min`` over a struct of the row, and
that struct gives a double's -0.0 back as 0.0: a value changes on its way through. Stage B's
build is such a window, so the two builds differed wherever the source held a -0.0 (a false
refusal), a transform's own ``row_number() = 1`` would write 0.0 for -0.0, and the diff's
example rows showed it. The rewrite (``top_n_window_elimination``) is turned off on every
connection; the test of the diff on every engine plants a -0.0 for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DISABLED_OPTIMIZERS = "top_n_window_elimination"


def connect(database: str = ":memory:", config: Mapping[str, str] | None = None) -> Any:
    """``duckdb.connect`` with :data:`DISABLED_OPTIMIZERS` (and ``config``)."""
    import duckdb
    return duckdb.connect(database, config={"disabled_optimizers": DISABLED_OPTIMIZERS, **(config or {})})
