"""The entry point of the DuckDB guard: parse, check the shape, apply the rules to the parse
tree, the plan and the probe, and re-print the statement (which must pass the guard and
give the same columns)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import closing

import duckdb

from backfill_assets.core.duck import connect
from backfill_assets.core.engines.duckdb.guard.catalog import _Catalog
from backfill_assets.core.engines.duckdb.guard.database import (
    _CONFIG,
    _columns,
    _create_source,
    _parse,
    _plan,
    _source_columns,
)
from backfill_assets.core.engines.duckdb.guard.findings import _Found, _Locator, _problems
from backfill_assets.core.engines.duckdb.guard.nodes import _SOURCE, _Node
from backfill_assets.core.engines.duckdb.guard.plan import _group_places, _new_places, _plan_findings
from backfill_assets.core.engines.duckdb.guard.probe import _probe
from backfill_assets.core.engines.duckdb.guard.rules import _Rules
from backfill_assets.core.engines.duckdb.guard.shape import _check_shape
from backfill_assets.core.errors import SpecError, TransformError


def check_duck_transform(text: str, source_columns: Sequence[tuple[str, str]]) -> str:
    """Parse ``text`` with DuckDB's own parser and apply the rules; return the statement
    re-printed by DuckDB (one statement, no comments).

    ``source_columns``: (name, DuckDB type text such as 'BIGINT', 'VARCHAR', 'DECIMAL(12,2)',
    'TIMESTAMP WITH TIME ZONE') of ``source``.

    Raises:
        SpecError: it does not parse, is not exactly one SELECT, or reads another relation
            (or it does not bind against ``source``).
        TransformError: constructs that can change its rows between runs, each a
            :class:`TransformProblem`, with its line and column in ``text``.
    """
    with closing(connect(config=_CONFIG)) as conn:
        catalog = _Catalog.read(conn)
        _create_source(conn, source_columns)
        parsed, found = _examine(conn, text, catalog)
        if found:
            raise TransformError(_problems(found, _Locator(text)))
        return _reprint(conn, parsed, text, catalog)


def _examine(conn: duckdb.DuckDBPyConnection, text: str, catalog: _Catalog) -> tuple[_Node, list[_Found]]:
    """The parse tree of ``text`` and what the rules refuse in it (SpecError: its shape)."""
    locate = _Locator(text)
    parsed = _parse(conn, text, locate)
    _check_shape(parsed, locate)
    rules = _Rules(catalog, locate)
    found = rules.check(parsed)
    plan = _plan(conn, text)
    if isinstance(plan, str):
        if found:  # what the parse tree shows is refused already; the rest needs a plan
            return parsed, found
        raise SpecError(f"transform_sql is rejected by DuckDB against {_SOURCE} ({_source_columns(conn)}): {plan}")
    found += _new_places(_plan_findings(plan, catalog, _group_places(parsed)), found)
    found += rules.judge_types(_probe(conn, parsed, catalog), found)
    return parsed, found


def _reprint(conn: duckdb.DuckDBPyConnection, parsed: _Node, original: str, catalog: _Catalog) -> str:
    """The statement as DuckDB prints its parse tree: it must pass the guard too, and give
    the columns (names and types) of the original."""
    row = conn.execute("SELECT json_deserialize_sql(?)", [json.dumps(parsed)]).fetchone()
    text = str(row[0]) if row else ""
    try:
        _, found = _examine(conn, text, catalog)
    except SpecError as err:
        found = [_Found("untrusted", "the re-printed statement", None, str(err), "")]
    columns = _columns(conn, text)
    if found or columns is None or columns != _columns(conn, original):
        listed = "; ".join(f.problem for f in found) or "its columns differ"
        raise SpecError(f"transform_sql is refused: DuckDB re-prints it as another statement ({listed})")
    return text
