"""The shape of the statement, refused as a SpecError: exactly one SELECT that reads only
``source`` and its own CTEs."""

from __future__ import annotations

import re

from backfill_assets.core.engines.duckdb.guard.findings import _Locator
from backfill_assets.core.engines.duckdb.guard.nodes import _SOURCE, _Node, _nodes, _role
from backfill_assets.core.errors import SpecError

_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE"})
_MODIFIERS = frozenset({"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER"})
_TABLE_REFS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "TABLE_FUNCTION", "SHOW_REF"})
_SAMPLE_WORDS = re.compile(rb"\bUSING\s+SAMPLE\b|\bTABLESAMPLE\b", re.IGNORECASE)


def _check_shape(parsed: _Node, locate: _Locator) -> None:
    """Exactly one SELECT that reads only ``source`` and its own CTEs."""
    ctes = {entry["key"].lower() for node, _ in _nodes(parsed) for entry in _cte_entries(node)}
    allowed = ctes | {_SOURCE}
    problems: list[str] = []
    for node, where in _nodes(parsed):
        at = locate.describe(where)
        role = _role(node)
        if node.get("sample") is not None:
            at = at or locate.describe(locate.pattern(_SAMPLE_WORDS))
            problems.append(f"USING SAMPLE / TABLESAMPLE{at} is not allowed: a sample picks rows at random")
        if role == "query" and node["type"] not in _QUERY_NODES:
            problems.append(_query_node_problem(node["type"], at))
        elif role == "modifier" and node["type"] not in _MODIFIERS:
            problems.append(f"the clause {node['type']}{at} is not allowed (the guard does not know it)")
        elif role == "table":
            problems += _table_problems(node, at, allowed)
        elif role == "expression" and node["class"] == "PARAMETER":
            problems.append(f"a parameter{at} is not allowed: transform_sql is run as it is written")
    if problems:
        raise SpecError("transform_sql is refused: " + "; ".join(dict.fromkeys(problems)))


def _cte_entries(node: _Node) -> list[_Node]:
    ctes = node.get("cte_map")
    return list(ctes.get("map") or []) if isinstance(ctes, dict) else []


def _query_node_problem(kind: str, at: str) -> str:
    if kind == "RECURSIVE_CTE_NODE":
        return f"WITH RECURSIVE{at} is not allowed (the guard does not check recursive queries)"
    if kind.endswith("_QUERY_NODE"):
        return f"a data-modifying CTE ({kind.removesuffix('_QUERY_NODE')}){at} is not allowed"
    return f"a {kind}{at} is not allowed (the guard does not know it)"


def _table_problems(node: _Node, at: str, allowed: set[str]) -> list[str]:
    kind = node["type"]
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = function.get("function_name", "a table function")
        return [(f"it calls the table function {name}{at}: a transform may read only '{_SOURCE}' (table "
                 "functions read files, settings or the catalog, or make rows of their own)")]
    if kind == "SHOW_REF":
        return [f"DESCRIBE, SHOW and SUMMARIZE{at} are not allowed: a transform reads rows of '{_SOURCE}'"]
    if kind not in _TABLE_REFS:
        return [f"the table reference {kind}{at} is not allowed (the guard does not know it)"]
    if kind != "BASE_TABLE":
        return []
    name = node["table_name"]
    problems = []
    if node.get("schema_name") or node.get("catalog_name"):
        qualified = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"), name) if p)
        problems.append(f"it reads {qualified}{at}: a schema- or catalog-qualified table is a table of the "
                        f"database, not the snapshot; write '{_SOURCE}'")
    elif name.lower() not in allowed:
        problems.append(f"it reads {name}{at}; a transform may read only the snapshot as '{_SOURCE}' "
                        "(other tables are mutable external state)")
    if node.get("at_clause") is not None:
        problems.append(f"time travel (AT ...){at} is not allowed: a transform reads the pinned snapshot")
    return problems
