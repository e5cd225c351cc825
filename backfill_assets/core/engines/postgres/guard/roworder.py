"""The row-order rules of the determinism guard, and equal values that print differently.

The **order** and **equal but different** classes of ``core.engines.postgres.guard.determinism``: constructs whose
result depends on the order rows arrive in, checked per query level (``query_order``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from backfill_assets.core.engines.postgres.guard.catalog import Catalog, Finding
from backfill_assets.core.engines.postgres.guard.querytree import Node, as_int, expr_type, is_node, location, nodes

# Window functions whose value for a row depends only on its peers' ORDER BY values.
PEER_WINDOW_FUNCTIONS = {"rank", "dense_rank", "percent_rank", "cume_dist"}
# Aggregates whose result does not depend on the order of their input (given exact
# arguments where DISTINCT collapses values, and no floating-point accumulation).
ORDER_FREE_AGGREGATES = {
    "count", "sum", "avg", "bool_and", "bool_or", "every", "bit_and", "bit_or", "bit_xor",
    "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp",
}
PICK_ONE_AGGREGATES = {"min", "max"}
FLOAT_TYPES = {700, 701}

# FRAMEOPTION_* bits of src/include/nodes/parsenodes.h.
FRAME_ROWS = 0x4
FRAME_START_UNBOUNDED_PRECEDING = 0x20
FRAME_END_UNBOUNDED_FOLLOWING = 0x100
LIMIT_WITH_TIES = "1"
SETOP_UNION = "1"
ARRAY_SUBLINK = "6"


def own_nodes(query: Node) -> Iterator[Node]:
    """The nodes of one query level: not those of the queries nested in it (CTEs,
    subqueries in FROM, sublinks), which are checked as queries of their own."""
    stack = [v for k, v in query.items() if k != "@"]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item["@"] == "QUERY":
                continue
            yield item
            stack.extend(v for k, v in item.items() if k != "@")
        elif isinstance(item, list):
            stack.extend(item)


def query_order(query: Node, catalog: Catalog) -> Iterator[Finding]:
    yield from _row_limits(query, catalog)
    yield from _collapsing(query, catalog)
    windows = {as_int(w["winref"]): w for w in query.get("windowClause") or []}
    for node in own_nodes(query):
        if node["@"] == "WINDOWFUNC":
            yield from _window(node, windows.get(as_int(node["winref"])), catalog)
        elif node["@"] == "AGGREF":
            yield from _aggregate(node, node.get("args") or [], node.get("aggorder") or [],
                                  node.get("aggdistinct") or [], catalog)
        elif node["@"] == "SUBLINK" and node.get("subLinkType") == ARRAY_SUBLINK:
            sub = node.get("subselect")
            if isinstance(sub, dict) and not sorted_totally(sub, catalog):
                yield Finding(
                    "order", "ARRAY(subquery)", location(node),
                    "ARRAY(subquery) lists rows in the order they arrive, and the subquery's "
                    "ORDER BY is missing or not total",
                    "use array_agg(x ORDER BY x), or ORDER BY every output column of the subquery",
                )


def sorted_totally(query: Node, catalog: Catalog) -> bool:
    """Whether the query's ORDER BY is provably total over its output: it sorts by every
    output column that is not a constant, each of an exact type, so tied rows are identical."""
    sorted_refs = {as_int(s["tleSortGroupRef"]) for s in query.get("sortClause") or []}
    if not sorted_refs:
        return False
    for tle in query.get("targetList") or []:
        if tle.get("resjunk") == "true" or is_node(tle.get("expr"), "CONST"):
            continue
        if as_int(tle.get("ressortgroupref"), 0) not in sorted_refs or not catalog.is_exact_expr(tle):
            return False
    return True


def _first_location(*values: Any) -> int | None:
    for value in values:
        for node in nodes(value):
            if location(node) is not None:
                return location(node)
    return None


def _row_limits(query: Node, catalog: Catalog) -> Iterator[Finding]:
    count, offset = query.get("limitCount"), query.get("limitOffset")
    if is_node(count, "CONST") and count.get("constisnull") == "true":
        count = None  # LIMIT ALL
    if count is None and offset is None:
        return
    with_ties = query.get("limitOption") == LIMIT_WITH_TIES and offset is None
    if with_ties or sorted_totally(query, catalog):
        return
    yield Finding(
        "order", "LIMIT/OFFSET" if offset is not None else "LIMIT", _first_location(count, offset),
        "LIMIT/OFFSET/FETCH keeps some rows and drops others by their position, and the "
        "query's ORDER BY is missing or not total, so which rows are kept depends on the "
        "order they arrive in",
        "filter with WHERE; newest-wins per key is backfill_assets's job (declare "
        "business_key and ordering); otherwise ORDER BY every output column, or use "
        "FETCH FIRST n ROWS WITH TIES",
    )


def _collapsing(query: Node, catalog: Catalog) -> Iterator[Finding]:
    """DISTINCT ON, DISTINCT, GROUP BY and set operations."""
    targets = {as_int(t.get("ressortgroupref"), 0): t for t in query.get("targetList") or []}
    distinct = query.get("distinctClause") or []
    if query.get("hasDistinctOn") == "true":
        if not sorted_totally(query, catalog):
            first = targets.get(as_int(distinct[0]["tleSortGroupRef"])) if distinct else None
            yield Finding(
                "order", "DISTINCT ON", _first_location(first),
                "DISTINCT ON keeps the first row of each group in an ORDER BY that is not "
                "total, so which row is kept depends on the order rows arrive in",
                "newest-wins per key is backfill_assets's job: declare business_key and "
                "ordering (with a final tiebreak) instead of DISTINCT ON",
            )
        distinct = []  # the rows kept are whole rows; their values are not collapsed
    for clause, what in ((distinct, "DISTINCT"), (query.get("groupClause") or [], "GROUP BY")):
        for sgc in clause:
            tle = targets.get(as_int(sgc["tleSortGroupRef"]))
            if tle is None or (tle.get("resjunk") == "true" and not _shown(tle.get("expr"), query)):
                continue
            if not catalog.is_exact_expr(tle):
                yield _equal_but_different(what, tle.get("resname"), _first_location(tle))
    yield from _set_operations(query, catalog)


def _shown(expr: Any, query: Node) -> bool:
    """Whether a group key that is not itself an output column is still shown: used outside
    an aggregate in an output column or in HAVING (``SELECT v::text ... GROUP BY v`` prints
    whichever of the group's equal values was kept; inside an aggregate every row counts)."""
    wanted = _without_locations(expr)
    roots = [t.get("expr") for t in query.get("targetList") or [] if t.get("resjunk") != "true"]
    stack = [*roots, query.get("havingQual")]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if item["@"] in ("AGGREF", "QUERY"):
                continue
            if _without_locations(item) == wanted:
                return True
            stack.extend(v for k, v in item.items() if k != "@")
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _without_locations(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_locations(v) for k, v in value.items() if k != "location"}
    if isinstance(value, list):
        return [_without_locations(v) for v in value]
    return value


def _set_operations(query: Node, catalog: Catalog) -> Iterator[Finding]:
    setop = query.get("setOperations")
    if setop is None:
        return
    collapsing = [
        n for n in nodes(setop)
        if n["@"] == "SETOPERATIONSTMT" and not (n.get("op") == SETOP_UNION and n.get("all") == "true")
    ]
    if not collapsing:
        return
    top = setop
    names = [t.get("resname") for t in query.get("targetList") or [] if t.get("resjunk") != "true"]
    columns = zip(top.get("colTypes") or [], top.get("colTypmods") or [], top.get("colCollations") or [])
    for name, (typ, typmod, coll) in zip(names, columns):
        if not catalog.is_exact((typ, typmod, coll)):
            yield _equal_but_different("UNION/INTERSECT/EXCEPT", name, None)


def _equal_but_different(what: str, column: str | None, loc: int | None) -> Finding:
    return Finding(
        "equal-but-different", f"{what} on {column or 'an expression'}", loc,
        f"{what} collapses values that compare equal, and values of this type can compare "
        "equal yet print differently (numeric 1.5 and 1.50, float -0 and 0, interval '1 day' "
        "and '24 hours'), so which one is kept depends on the order rows arrive in",
        "cast the column to a type whose equal values print the same (e.g. numeric(14,2), "
        "bigint, text), or leave duplicates to backfill_assets's newest-wins",
    )


def _window(node: Node, clause: Node | None, catalog: Catalog) -> Iterator[Finding]:
    fn = catalog.function(as_int(node["winfnoid"]))
    name = fn.name if fn else "a window function"
    if fn is None or fn.kind != "a":
        if fn is not None and fn.builtin and fn.name in PEER_WINDOW_FUNCTIONS:
            return
        yield Finding(
            "order", f"{name}() OVER (...)", location(node),
            f"{name}() numbers or picks rows by their position in the window, and rows that "
            "tie on its PARTITION BY and ORDER BY get their positions in the order they "
            "arrive (a VACUUM, another plan or another server changes it)",
            "newest-wins per key is backfill_assets's job: declare business_key and ordering "
            "(with a final tiebreak); rank() and dense_rank() give tied rows the same value",
        )
        return
    args = [{"@": "TARGETENTRY", "expr": a} for a in node.get("args") or []]
    yield from _aggregate(node, args, [], [], catalog, window=True)
    frame = as_int(clause.get("frameOptions"), 0) if clause else 0
    whole = FRAME_START_UNBOUNDED_PRECEDING | FRAME_END_UNBOUNDED_FOLLOWING
    if frame & FRAME_ROWS and frame & whole != whole:
        yield Finding(
            "order", f"{name}() OVER (ROWS ...)", location(node),
            "a ROWS frame counts rows, so which of the rows that tie on the window's ORDER BY "
            "fall inside it depends on the order they arrive in",
            "use RANGE or GROUPS (they keep tied rows together), or ROWS BETWEEN UNBOUNDED "
            "PRECEDING AND UNBOUNDED FOLLOWING",
        )


def _aggregate(node: Node, args: list[Node], order: list[Node], distinct: list[Node],
               catalog: Catalog, *, window: bool = False) -> Iterator[Finding]:
    fnoid = as_int(node.get("aggfnoid") or node.get("winfnoid"))
    fn = catalog.function(fnoid)
    name = fn.name if fn else "an aggregate"
    builtin = fn is not None and fn.builtin
    values = [a for a in args if a.get("resjunk") != "true" and not is_node(a.get("expr"), "CONST")]
    exact = all(catalog.is_exact_expr(a) for a in values)
    kind = node.get("aggkind", "n")
    if builtin and name == "count" or kind == "h":
        return
    if kind == "o" or (builtin and name in PICK_ONE_AGGREGATES) or (distinct and name != "count"):
        if not exact:
            yield Finding(
                "equal-but-different", f"{name}(...)", location(node),
                f"{name}() keeps one of the values that compare equal, and values of this "
                "type can compare equal yet print differently (numeric 1.5 and 1.50, float -0 "
                "and 0), so which one it keeps depends on the order rows arrive in",
                "aggregate a type whose equal values print the same, e.g. a cast to "
                "numeric(14,2) or bigint",
            )
        return
    floats = any((expr_type(a) or (0,))[0] in FLOAT_TYPES for a in values)
    if builtin and name in ORDER_FREE_AGGREGATES and not floats:
        return
    if builtin and name in ORDER_FREE_AGGREGATES:
        problem = (f"{name}() over floating-point values rounds at each step, so its result "
                   "depends on the order rows arrive in")
        instead = f"aggregate an exact type, e.g. {name}(x::numeric)"
    else:
        problem = (f"{name}() combines rows in the order they arrive"
                   + (" (an aggregate over a window cannot have its own ORDER BY)" if window else
                      ", and its ORDER BY is missing or does not sort by every aggregated value"))
        instead = (f"use {name}(... ORDER BY <every aggregated value>), e.g. "
                   "string_agg(note, ',' ORDER BY note), over exact types"
                   + ("; aggregate in a subquery instead of over a window" if window else ""))
    sorted_refs = {as_int(s["tleSortGroupRef"]) for s in [*order, *distinct]}
    total = exact and all(as_int(a.get("ressortgroupref"), 0) in sorted_refs for a in values)
    if window or not total:
        yield Finding("order", f"{name}(...)", location(node), problem, instead)
