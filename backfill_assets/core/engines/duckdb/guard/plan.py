"""The rules over the bound plan: the variant of each function the binder chose, each cast
(implicit ones too), and the types rows are collapsed by."""

from __future__ import annotations

import re

from backfill_assets.core.engines.duckdb.guard.catalog import _Catalog
from backfill_assets.core.engines.duckdb.guard.datatypes import _inexact, _type_name, _zoned, _zoned_name
from backfill_assets.core.engines.duckdb.guard.findings import _EXACT_INSTEAD, _TZ_INSTEAD, _clock, _Found, _session
from backfill_assets.core.engines.duckdb.guard.names import _CLOCK_FUNCTIONS, _session_use
from backfill_assets.core.engines.duckdb.guard.nodes import _bare, _function_name, _located, _Node, _nodes

# A time stamp literal with an explicit UTC offset, which needs no TimeZone setting to read.
_OFFSET_LITERAL = re.compile(r".*\d:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|UTC|[+-]\d{1,2}(:?\d{2}){0,2})",
                             re.IGNORECASE | re.DOTALL)


def _plan_findings(plan: _Node, catalog: _Catalog, group_places: dict[str, int]) -> list[_Found]:
    """What the binder chose: function variants, casts, and the types rows are collapsed by."""
    found: list[_Found] = []
    for node, where in _nodes(plan):
        if node.get("expression_class") == "BOUND_FUNCTION":
            path = (node.get("qname") or {}).get("path") or []
            if path == ["__cast"]:
                found += _cast(node, where)
            elif len(path) >= 2:
                found += _variant(node, catalog, where)
        kind = node.get("type")
        if kind == "LOGICAL_AGGREGATE_AND_GROUP_BY":
            for key in node.get("groups") or []:
                alias = str(key.get("alias") or "")
                place = _located(key, group_places.get(alias.lower()))
                found += _collapsed(f"GROUP BY {alias or 'key'}", [key.get("return_type")], place)
        elif kind == "LOGICAL_DISTINCT":
            below = (node.get("children") or [{}])[0].get("type", "")
            word = {"LOGICAL_UNION": "UNION", "LOGICAL_EXCEPT": "EXCEPT", "LOGICAL_INTERSECT": "INTERSECT"}
            found += _collapsed(word.get(below, "DISTINCT"),
                                [t.get("return_type") for t in node.get("distinct_targets") or []], None)
        elif kind in ("LOGICAL_INTERSECT", "LOGICAL_EXCEPT"):
            word = kind.removeprefix("LOGICAL_") + (" ALL" if node.get("setop_all") else "")
            found += _collapsed(word, _output_types((node.get("children") or [None])[0]), None)
    return found


def _output_types(operator: _Node | None) -> list[_Node | None]:
    """The column types an operator of the plan gives ([None]: the guard cannot tell)."""
    while isinstance(operator, dict) and operator.get("type") in (
            "LOGICAL_ORDER_BY", "LOGICAL_LIMIT", "LOGICAL_FILTER", "LOGICAL_DISTINCT"):
        operator = (operator.get("children") or [None])[0]
    if isinstance(operator, dict) and operator.get("type") == "LOGICAL_PROJECTION":
        return [e.get("return_type") for e in operator.get("expressions") or []]
    return [None]


def _collapsed(construct: str, types: list[_Node | None], where: int | None) -> list[_Found]:
    if all(isinstance(t, dict) and not _inexact(t) for t in types):
        return []
    named = ", ".join(dict.fromkeys(_type_name(t) for t in types if t is None or _inexact(t)))
    return [_Found("equal-but-different", f"{construct} ({named})", where,
                   f"{construct} collapses rows whose values compare equal, but equal values of {named} can "
                   "print differently (-0.0 and 0.0, INTERVAL '1 month' and '30 days', 'a' and 'A' under a "
                   "collation): which one is kept depends on the order rows arrive in", _EXACT_INSTEAD)]


def _cast(node: _Node, where: int | None) -> list[_Found]:
    """A cast between a time zone type and another reads the session's TimeZone setting."""
    children = node.get("children") or [{}]
    source = ((node.get("arguments") or [None])[0]) or children[0].get("return_type")
    target = node.get("return_type")
    if not isinstance(source, dict) or not isinstance(target, dict) or source.get("id") == "NULL":
        return []
    if not (_zoned(source) or _zoned(target)) or _bare(source) == _bare(target):
        return []
    if _zoned_name(str(source.get("id"))) and _zoned_name(str(target.get("id"))):
        return []
    constant = children[0]
    if constant.get("expression_class") == "BOUND_CONSTANT" and _OFFSET_LITERAL.fullmatch(
            str((constant.get("value") or {}).get("value", "")).strip()):
        return []
    construct = f"CAST({_type_name(source)} AS {_type_name(target)})"
    return [_Found("session", construct, where,
                   f"converting {_type_name(source)} to {_type_name(target)} (written or implicit) reads the "
                   "session's TimeZone setting", _TZ_INSTEAD)]


def _variant(node: _Node, catalog: _Catalog, where: int | None) -> list[_Found]:
    """The variant of a function the binder chose must be CONSISTENT."""
    name = _function_name(node)
    if _session_use(name) is not None:
        return [_session(name, where)]
    if name in _CLOCK_FUNCTIONS:
        return [_clock(name, where)]
    overloads = catalog.scalars.get(name)
    if not overloads:
        return [] if name in catalog.kinds else [_Found(
            "untrusted", f"{name}()", where, f"DuckDB binds {name}(), which its catalog does not list",
            "use DuckDB's built-in CONSISTENT functions")]
    if all(o.consistent for o in overloads):
        return []
    arguments = [a for a in node.get("arguments") or [] if isinstance(a, dict)]
    ids = tuple(str(a.get("id")) for a in arguments)
    exact = [o for o in overloads if o.parameters == ids]
    zoned = any(_zoned(t) for t in (*arguments, node.get("return_type")))
    if exact and all(o.consistent for o in exact):
        return []
    if not exact and not zoned and all(o.zoned for o in overloads if not o.consistent):
        return []
    signature = f"{name}({', '.join(_type_name(a) for a in arguments)})"
    if exact and all(o.stability == "VOLATILE" or o.side_effects for o in exact):
        return [_Found("volatility", signature, where, f"{signature} is VOLATILE in DuckDB",
                       "use only functions DuckDB labels CONSISTENT")]
    if zoned:
        return [_Found("session", signature, where,
                       f"{signature} depends on the session's TimeZone (and Calendar) setting", _TZ_INSTEAD)]
    return [_Found("volatility", signature, where,
                   f"{signature} is not CONSISTENT in DuckDB (or the guard cannot tell which variant DuckDB "
                   "chose): it can change between queries", "use only functions DuckDB labels CONSISTENT")]


def _group_places(parsed: _Node) -> dict[str, int]:
    """Column name -> where a GROUP BY names it (the plan does not place plain column keys)."""
    places: dict[str, int] = {}
    for node, _ in _nodes(parsed):
        for key in node.get("group_expressions") or []:
            names = key.get("column_names") if isinstance(key, dict) else None
            location = _located(key, None) if isinstance(key, dict) else None
            if names and location is not None:
                places.setdefault(str(names[-1]).lower(), location)
    return places


def _new_places(found: list[_Found], known: list[_Found]) -> list[_Found]:
    """Plan findings at a place the parse tree's rules have not already refused."""
    taken = {f.location for f in known if f.location is not None}
    return [f for f in found if f.location is None or f.location not in taken]
