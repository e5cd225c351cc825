"""The determinism guard of ``transform_sql``: rules over the server's analysed query tree.

A transform must give the same rows from the same snapshot on every run: after a VACUUM,
under another plan, on another server, as another role. Both builds read one snapshot in
one physical order, so building twice cannot catch a result that depends on that order or
on the session; these rules refuse such constructs before anything is built. They read the
tree the server resolved (``core.querytree``), so every function, aggregate, window, type
and collation is the one the server chose, at every level: CTEs, subqueries in FROM,
scalar and ARRAY subqueries, set operations.

Classes (docs/reliability.md lists the cases tested for each):

- **volatility**: every function, aggregate, window function, operator, RANGE-frame support
  function and I/O conversion (the input function of the result type, the output function
  of the argument type) must be IMMUTABLE in ``pg_proc``.
- **session**: SQL value functions (``current_timestamp``, ``current_user``, ...), system
  columns, ``reg*`` literals (resolved through ``search_path``), and date/time literals that
  read the clock (``'now'``, ``'today'``, ``'tomorrow'``, ``'yesterday'``) are refused by name.
- **order**: window functions that number or pick rows by position (``row_number``,
  ``ntile``, ``lag``, ``lead``, ``first_value``, ``last_value``, ``nth_value``) are refused:
  newest-wins is the tool's job. ``rank``, ``dense_rank``, ``percent_rank`` and
  ``cume_dist`` give tied rows the same value and are allowed. Aggregates over a window
  need a frame that keeps tied rows together (RANGE or GROUPS, or ROWS over the whole
  partition). LIMIT/OFFSET, DISTINCT ON and ARRAY(subquery) need an ORDER BY that is
  provably total: it sorts by every output column, each of an *exact* type (below), so rows
  that tie are identical. Order-sensitive aggregates (``array_agg``, ``string_agg``,
  ``json_agg``, ..., float sums, any aggregate not known to be order-insensitive) need an
  ORDER BY or DISTINCT over every aggregated value, each of an exact type.
- **equal but different**: values that compare equal can print differently (numeric
  ``1.5`` and ``1.50``, float ``-0`` and ``0``, ``interval '1 day'`` and ``'24 hours'``).
  Where rows are collapsed by equality (DISTINCT, GROUP BY, UNION/INTERSECT/EXCEPT, min/max,
  DISTINCT aggregates, ordered-set aggregates), the value kept depends on row order, so
  those need exact types: integers, boolean, date, time, timestamp(tz), uuid, bytea, enums,
  text and varchar under a deterministic collation, numeric with a declared scale, and
  domains over them.

Set-returning functions are allowed: an IMMUTABLE one returns the same rows in the same
order for the same arguments, and the volatility rule refuses the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from backfill_assets.core.querytree import Node, as_int, expr_type, is_node, location, nodes

PG_CATALOG = "pg_catalog"
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
REG_TYPES = {2205, 2206, 2202, 2203, 2204, 4089, 4096, 3734, 3769, 4191, 24}
DATETIME_TYPES = {1082, 1083, 1114, 1184, 1266, 1186}
CLOCK_WORDS = ("now", "today", "tomorrow", "yesterday")

# FRAMEOPTION_* bits of src/include/nodes/parsenodes.h.
FRAME_ROWS = 0x4
FRAME_START_UNBOUNDED_PRECEDING = 0x20
FRAME_END_UNBOUNDED_FOLLOWING = 0x100
LIMIT_WITH_TIES = "1"
SETOP_UNION = "1"
ARRAY_SUBLINK = "6"
COERCE_SQL_SYNTAX = "3"


@dataclass(frozen=True)
class Function:
    signature: str  # regprocedure text, e.g. now()
    name: str
    schema: str
    kind: str  # f, a (aggregate), w (window), p
    volatility: str  # i, s, v

    @property
    def builtin(self) -> bool:
        return self.schema == PG_CATALOG


@dataclass(frozen=True)
class Catalog:
    """What the rules need from pg_catalog, read once per check (see core.transform)."""

    functions: dict[int, Function]
    operator_functions: dict[int, int]  # operator OID -> its function OID
    type_io: dict[int, tuple[int, int]]  # type OID -> (input, output) function OIDs
    exact: set[tuple[int, int, int]] = field(default_factory=set)  # (type, typmod, collation)

    def function(self, oid: int) -> Function | None:
        return self.functions.get(oid)

    def is_exact(self, typed: tuple[int, int, int] | None) -> bool:
        return typed is not None and typed in self.exact

    def is_exact_expr(self, expr: Any) -> bool:
        """Whether an expression's values are of an exact type; a relabelling (a domain
        passed as its base type) does not change the values, so its argument counts."""
        while isinstance(expr, dict):
            if self.is_exact(expr_type(expr)):
                return True
            expr = expr.get("expr") if expr["@"] == "TARGETENTRY" else (
                expr.get("arg") if expr["@"] == "RELABELTYPE" else None)
        return False


@dataclass(frozen=True)
class Finding:
    """One construct that can make the transform's rows change between runs."""

    kind: str  # volatility | session | order | equal-but-different
    construct: str
    location: int | None  # byte offset in the analysed statement
    problem: str
    instead: str


def referenced(tree: Any) -> tuple[set[int], set[int], set[int], set[tuple[int, int, int]]]:
    """Function, operator and type OIDs, and the expression types, that the rules ask the
    catalog about."""
    funcs: set[int] = set()
    ops: set[int] = set()
    types: set[int] = set()
    typed: set[tuple[int, int, int]] = set()
    for node in nodes(tree):
        kind = node["@"]
        for f in ("funcid", "aggfnoid", "winfnoid", "startInRangeFunc", "endInRangeFunc"):
            if as_int(node.get(f), 0) > 0:
                funcs.add(as_int(node[f]))
        if kind in ("OPEXPR", "DISTINCTEXPR", "NULLIFEXPR", "SCALARARRAYOPEXPR"):
            ops.add(as_int(node["opno"]))
        if kind == "ROWCOMPAREEXPR":
            ops.update(node.get("opnos") or [])
        if kind == "COERCEVIAIO":
            types.add(as_int(node["resulttype"]))
            arg = expr_type(node.get("arg"))
            if arg is not None:
                types.add(arg[0])
        t = expr_type(node)
        if t is not None:
            typed.add(t)
    return funcs, ops, types, typed


def findings(tree: Any, catalog: Catalog, sql_text: bytes) -> list[Finding]:
    """Every construct of the analysed ``tree`` that can change the rows between runs.

    ``sql_text`` is the analysed statement (its locations are byte offsets into it), used
    to name SQL value functions and to read date/time literals.
    """
    out: list[Finding] = []
    out += _volatility(tree, catalog)
    out += _session(tree, catalog, sql_text)
    for query in nodes(tree):
        if query["@"] == "QUERY":
            out += _query_order(query, catalog)
    # One finding per construct and place, in the order they appear in the statement.
    unique = {(f.kind, f.construct, f.location): f for f in out}
    return sorted(unique.values(), key=lambda f: (f.location is None, f.location or 0, f.construct))


# --- volatility --------------------------------------------------------------------------

_VOLATILITY = {"s": "STABLE", "v": "VOLATILE"}


# Built-in functions that read the session, the role, the transaction or the clock.
SESSION_FUNCTIONS = {
    "now": "the transaction's start time", "transaction_timestamp": "the transaction's start time",
    "statement_timestamp": "the statement's start time", "clock_timestamp": "the clock",
    "timeofday": "the clock", "current_setting": "a setting of the session",
    "current_user": "the role", "session_user": "the role", "current_role": "the role",
    "current_database": "the database's name", "current_schema": "the search_path",
    "current_schemas": "the search_path", "inet_client_addr": "the client's address",
    "inet_server_addr": "the server's address", "pg_backend_pid": "the session's process",
    "version": "the server's version", "txid_current": "the transaction",
    "pg_current_xact_id": "the transaction", "random": "a random generator",
}


def _volatility(tree: Any, catalog: Catalog) -> Iterator[Finding]:
    for node in nodes(tree):
        for oid, what in _called(node, catalog):
            fn = catalog.function(oid)
            if fn is None or fn.volatility == "i":
                continue
            if fn.builtin and fn.name in SESSION_FUNCTIONS:
                yield Finding(
                    "session", fn.signature, location(node),
                    f"{fn.signature}{what} reads {SESSION_FUNCTIONS[fn.name]}, not the data "
                    f"({_VOLATILITY.get(fn.volatility, fn.volatility)}, not IMMUTABLE): it "
                    "differs between runs, servers or roles",
                    "take the value from a source column, or a constant literal",
                )
                continue
            yield Finding(
                "volatility", fn.signature, location(node),
                f"{fn.signature}{what} is {_VOLATILITY.get(fn.volatility, fn.volatility)}, not IMMUTABLE: "
                "its result can change between runs (the clock, a setting, the session, other tables)",
                "use only IMMUTABLE functions and casts (pg_proc.provolatile = 'i')",
            )


def _called(node: Node, catalog: Catalog) -> Iterator[tuple[int, str]]:
    """(function OID, how it is called) for every function a node makes the server call."""
    kind = node["@"]
    for f in ("funcid", "aggfnoid", "winfnoid", "startInRangeFunc", "endInRangeFunc"):
        if as_int(node.get(f), 0) > 0:
            yield as_int(node[f]), " (the window frame's RANGE offset)" if "InRange" in f else ""
    if kind in ("OPEXPR", "DISTINCTEXPR", "NULLIFEXPR", "SCALARARRAYOPEXPR"):
        fn = catalog.operator_functions.get(as_int(node["opno"]))
        if fn:
            yield fn, " (an operator's function)"
    if kind == "ROWCOMPAREEXPR":
        for op in node.get("opnos") or []:
            if catalog.operator_functions.get(op):
                yield catalog.operator_functions[op], " (a row comparison's function)"
    if kind == "COERCEVIAIO":
        arg = expr_type(node.get("arg"))
        if arg is not None and arg[0] in catalog.type_io:
            yield catalog.type_io[arg[0]][1], " (called by a cast, to print the value)"
        result = as_int(node["resulttype"])
        if result in catalog.type_io:
            yield catalog.type_io[result][0], " (called by a cast, to read the value)"


# --- session, role, transaction and clock -----------------------------------------------


def _session(tree: Any, catalog: Catalog, sql_text: bytes) -> Iterator[Finding]:
    for node in nodes(tree):
        kind = node["@"]
        if kind == "SQLVALUEFUNCTION":
            name = _word_at(sql_text, location(node)) or "an SQL value function"
            yield Finding(
                "session", name, location(node),
                f"{name} is a value of the session, the role or the clock, not of the data: "
                "it differs between runs, servers or roles",
                "take the value from a source column, or a constant literal",
            )
        elif kind == "VAR" and as_int(node.get("varattno"), 0) < 0:
            yield Finding(
                "session", "a system column", location(node),
                "system columns (ctid, xmin, tableoid, ...) describe where and when a row was "
                "written, which changes with every copy, VACUUM and server",
                "use the source's own columns",
            )
        elif kind == "CONST" and as_int(node["consttype"]) in REG_TYPES and node.get("constisnull") != "true":
            yield Finding(
                "session", "a reg* literal", location(node),
                "a regclass/regproc/regtype... literal is resolved through search_path, which "
                "depends on the session and the role, and names OIDs that differ between servers",
                "compare names as text",
            )
        elif kind == "CONST" and as_int(node["consttype"]) in DATETIME_TYPES:
            literal = _literal_at(sql_text, location(node))
            if literal is not None and _reads_clock(literal):
                yield Finding(
                    "session", f"'{literal}'", location(node),
                    f"the date/time literal '{literal}' reads the clock when the statement is "
                    "parsed, so every run gets another value",
                    "write the date or time itself, e.g. '2024-01-01'",
                )


def _reads_clock(literal: str) -> bool:
    words = "".join(c if c.isalpha() else " " for c in literal.lower()).split()
    return any(w in CLOCK_WORDS for w in words)


def _word_at(text: bytes, offset: int | None) -> str | None:
    if offset is None or offset >= len(text):
        return None
    end = offset
    while end < len(text) and (chr(text[end]).isalnum() or text[end] == ord("_")):
        end += 1
    return text[offset:end].decode("utf-8", "replace").lower() or None


def _literal_at(text: bytes, offset: int | None) -> str | None:
    """The string literal starting at ``offset`` ('...' with '' for a quote), or None."""
    if offset is None or offset >= len(text):
        return None
    if text[offset:offset + 1] in (b"E", b"e"):
        offset += 1
    if text[offset:offset + 1] != b"'":
        return None
    out, i = bytearray(), offset + 1
    while i < len(text):
        if text[i] == ord("'"):
            if text[i + 1:i + 2] == b"'":
                out.append(ord("'"))
                i += 2
                continue
            return out.decode("utf-8", "replace")
        out.append(text[i])
        i += 1
    return None


# --- order, and equal values that print differently --------------------------------------


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


def _query_order(query: Node, catalog: Catalog) -> Iterator[Finding]:
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
            if isinstance(sub, dict) and not _sorted_totally(sub, catalog):
                yield Finding(
                    "order", "ARRAY(subquery)", location(node),
                    "ARRAY(subquery) lists rows in the order they arrive, and the subquery's "
                    "ORDER BY is missing or not total",
                    "use array_agg(x ORDER BY x), or ORDER BY every output column of the subquery",
                )


def _sorted_totally(query: Node, catalog: Catalog) -> bool:
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
    if with_ties or _sorted_totally(query, catalog):
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
        if not _sorted_totally(query, catalog):
            first = targets.get(as_int(distinct[0]["tleSortGroupRef"])) if distinct else None
            yield Finding(
                "order", "DISTINCT ON", _first_location(first),
                "DISTINCT ON keeps the first row of each group in an ORDER BY that is not "
                "total, so which row is kept depends on the order rows arrive in",
                "newest-wins per key is backfill_assets's job: declare business_key and "
                "ordering (with a final tiebreak) instead of DISTINCT ON",
            )
        distinct = []  # the rows kept are whole rows; their values are not collapsed
    having = query.get("havingQual") is not None
    for clause, what in ((distinct, "DISTINCT"), (query.get("groupClause") or [], "GROUP BY")):
        for sgc in clause:
            tle = targets.get(as_int(sgc["tleSortGroupRef"]))
            if tle is None or (tle.get("resjunk") == "true" and not having):
                continue
            if not catalog.is_exact_expr(tle):
                yield _equal_but_different(what, tle.get("resname"), _first_location(tle))
    yield from _set_operations(query, catalog)


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
