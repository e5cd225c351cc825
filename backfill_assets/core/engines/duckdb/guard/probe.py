"""The probe: the statement with each checked aggregate's argument wrapped in a no-op
``greatest(...)``, whose position in the plan names the aggregate and the type it aggregates."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Sequence
from typing import Any

import duckdb

from backfill_assets.core.engines.duckdb.guard.catalog import _Catalog
from backfill_assets.core.engines.duckdb.guard.database import _plan, _serialized
from backfill_assets.core.engines.duckdb.guard.nodes import (
    _NO_LOCATION,
    _arguments,
    _bare,
    _function_name,
    _located,
    _Node,
    _nodes,
    _orders,
)
from backfill_assets.core.engines.duckdb.guard.rules import _typed_arguments


def _wrapper(expression: _Node) -> _Node:
    """``greatest(expression)``: the same value and type, in a node the plan keeps a position for."""
    return {
        "class": "FUNCTION", "type": "FUNCTION", "alias": "", "query_location": _NO_LOCATION,
        "function_name": "greatest", "schema": "", "catalog": "", "filter": None,
        "order_bys": {"type": "ORDER_MODIFIER", "orders": []}, "distinct": False, "is_operator": False,
        "export_state": False, "arguments": [{"name": "", "expression": expression}],
        "qualified_name": {"path": ["greatest"]}, "is_legacy_function_call": False,
    }


def _typed_calls(tree: _Node, catalog: _Catalog) -> list[tuple[_Node, int]]:
    return [(node, n) for node, _ in _nodes(tree) if (n := _typed_arguments(node, catalog))]


def _probe(conn: duckdb.DuckDBPyConnection, parsed: _Node, catalog: _Catalog) -> list[list[_Node | None]]:
    """For each typed aggregate call (in the order of the tree), the types of the values it
    aggregates wherever the plan has it, after DuckDB's implicit casts ([]: unknown). All calls
    are probed at once; if that statement does not bind, each call alone."""
    count = len(_typed_calls(parsed, catalog))
    together = _probe_calls(conn, parsed, catalog, range(count))
    if together is not None:
        return together
    alone = [_probe_calls(conn, parsed, catalog, [k]) for k in range(count)]
    return [types[k] if types is not None else [] for k, types in enumerate(alone)]


def _probe_calls(conn: duckdb.DuckDBPyConnection, parsed: _Node, catalog: _Catalog, which: Sequence[int]
                 ) -> list[list[_Node | None]] | None:
    """The types of the calls ``which`` with their arguments wrapped (None: no plan)."""
    probe = copy.deepcopy(parsed)
    calls = _typed_calls(probe, catalog)
    for k in which:
        _wrap(*calls[k])
    row = conn.execute("SELECT json_deserialize_sql(?)", [json.dumps(probe)]).fetchone()
    text = str(row[0]) if row else ""
    reparsed = _typed_calls(_serialized(conn, text), catalog)
    plan = _plan(conn, text)
    if len(reparsed) != len(calls) or isinstance(plan, str):
        return None
    wrappers = {_located(expression, None): k for k in which
                for expression in _arguments(reparsed[k][0])[:reparsed[k][1]]}
    types: list[list[_Node | None]] = [[] for _ in calls]
    for k, aggregated in _wrapped_values(plan, wrappers):
        types[k].append(aggregated)
    return types


def _wrap(node: _Node, count: int) -> None:
    """Wrap the first ``count`` arguments of a call, and the ORDER BY terms equal to them (a
    DISTINCT aggregate must order by its arguments)."""
    for argument in (node.get("arguments") or [])[:count]:
        same = _bare(argument["expression"])
        for term in _orders(node):
            if _bare(term.get("expression")) == same:
                term["expression"] = _wrapper(term["expression"])
        argument["expression"] = _wrapper(argument["expression"])


def _wrapped_values(value: Any, wrappers: dict[int | None, int], aggregated: _Node | None = None
                    ) -> Iterator[tuple[int, _Node | None]]:
    """(call, type of the value its aggregate aggregates) for each wrapper the plan holds."""
    if isinstance(value, list):
        for item in value:
            yield from _wrapped_values(item, wrappers, aggregated)
        return
    if not isinstance(value, dict):
        return
    if value.get("expression_class") in ("BOUND_AGGREGATE", "BOUND_WINDOW"):
        for child in value.get("children") or []:
            yield from _wrapped_values(child, wrappers, child.get("return_type"))
        for key, item in value.items():
            if key != "children":
                yield from _wrapped_values(item, wrappers, None)
        return
    if value.get("expression_class") == "BOUND_FUNCTION" and _function_name(value) == "greatest":
        k = wrappers.get(_located(value, None))
        if k is not None:
            yield k, aggregated
    for item in value.values():
        yield from _wrapped_values(item, wrappers, aggregated)
