"""DuckDB's trees as JSON (the parse tree of ``json_serialize_sql``, the plan of
``json_serialize_plan``): their nodes, positions and arguments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_SOURCE = "source"

_Node = dict[str, Any]

_NO_LOCATION = 2**64 - 1


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _located(node: _Node, where: int | None) -> int | None:
    location = node.get("query_location")
    return location if isinstance(location, int) and location != _NO_LOCATION else where


def _nodes(value: Any, where: int | None = None) -> Iterator[tuple[_Node, int | None]]:
    """Every node of a DuckDB tree (a dict with a class or a type name), with the nearest
    location: its own, or that of the closest ancestor that has one."""
    if isinstance(value, dict):
        where = _located(value, where)
        if "class" in value or "expression_class" in value or isinstance(value.get("type"), str):
            yield value, where
        for item in value.values():
            yield from _nodes(item, where)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item, where)


def _role(node: _Node) -> str:
    """What a parse-tree node is: expression, query, modifier, table, or data."""
    if "class" in node:
        return "expression"
    kind = str(node.get("type"))
    if kind.endswith("_NODE"):
        return "query"
    if kind.endswith("_MODIFIER"):
        return "modifier"
    return "table" if "query_location" in node else "data"


def _bare(value: Any) -> Any:
    """A tree without positions and aliases of expressions: two expressions written alike."""
    if isinstance(value, dict):
        skip = {"query_location", "query_location_length"} | ({"alias"} if "class" in value else set())
        return {k: _bare(v) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


def _arguments(node: _Node) -> list[_Node]:
    return [a.get("expression", a) for a in node.get("arguments") or []]


def _orders(node: _Node) -> list[_Node]:
    if node.get("class") == "WINDOW":
        return list(node.get("arg_orders") or [])
    return list((node.get("order_bys") or {}).get("orders") or [])


def _function_name(node: _Node) -> str:
    path = (node.get("qname") or {}).get("path") or []
    return str(path[-1]).lower() if path else ""
