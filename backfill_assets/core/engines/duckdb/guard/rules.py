"""The rules the parse tree alone decides (functions by name and label, windows, aggregates,
LIMIT, DISTINCT ON, joins), and the findings of the aggregates once their types are learnt."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from backfill_assets.core.engines.duckdb.guard.catalog import _Catalog
from backfill_assets.core.engines.duckdb.guard.datatypes import _FLOATS, _inexact, _type_name
from backfill_assets.core.engines.duckdb.guard.findings import _EXACT_INSTEAD, _clock, _Found, _Locator, _session
from backfill_assets.core.engines.duckdb.guard.names import (
    _CLOCK_FUNCTIONS,
    _FLOAT_ONLY_AGGREGATES,
    _LIST_AGGREGATES,
    _ORDER_WINDOWS,
    _PICK_AGGREGATES,
    _RANK_WINDOWS,
    _SAFE_AGGREGATES,
    _SKETCH_AGGREGATES,
    _STATISTIC_AGGREGATES,
    _SUM_AGGREGATES,
    _TWO_VALUE_AGGREGATES,
    _TYPED,
    _UNORDERED_COLLECTORS,
    _VALUE_AGGREGATES,
    _VALUE_FUNCTIONS,
    _session_use,
)
from backfill_assets.core.engines.duckdb.guard.nodes import (
    _SOURCE,
    _arguments,
    _article,
    _bare,
    _located,
    _Node,
    _nodes,
    _orders,
    _role,
)

# Parse-tree classes of expressions that need no rule of their own (their parts are walked).
_PLAIN_CLASSES = frozenset({
    "CONSTANT", "OPERATOR", "COMPARISON", "CONJUNCTION", "CASE", "CAST", "BETWEEN", "STAR", "SUBQUERY",
    "COLLATE", "LAMBDA", "POSITIONAL_REFERENCE", "TYPE",
})
_JOIN_KINDS = frozenset({"REGULAR", "NATURAL", "CROSS", "DEPENDENT"})


def _typed_arguments(node: _Node, catalog: _Catalog) -> int:
    """How many leading arguments of an aggregate call the guard needs the type of (0: none)."""
    name = str(node.get("function_name", "")).lower()
    if node.get("class") == "FUNCTION" and not catalog.aggregate(name):
        return 0
    if node.get("class") == "WINDOW" and node.get("type") != "WINDOW_AGGREGATE":
        return 0
    if node.get("class") not in ("FUNCTION", "WINDOW") or name not in _TYPED:
        return 0
    return min(2 if name in _TWO_VALUE_AGGREGATES else 1, len(_arguments(node)))


@dataclass(frozen=True)
class _Typed:
    """An aggregate call whose argument types the probe learns."""

    name: str
    location: int | None
    distinct: bool


class _Rules:
    """The rules that the parse tree alone decides, and the aggregates left to be typed."""

    def __init__(self, catalog: _Catalog, locate: _Locator) -> None:
        self.catalog = catalog
        self.locate = locate
        self.found: list[_Found] = []
        self.typed: list[_Typed] = []

    def check(self, parsed: _Node) -> list[_Found]:
        """What the rules refuse in the parse tree; the aggregates left to be typed are kept in ``typed``."""
        for node, where in _nodes(parsed):
            role = _role(node)
            if role == "expression":
                self._expression(node, where)
            elif role == "modifier":
                self._modifier(node, where)
            elif role == "table" and node["type"] == "JOIN":
                self._join(node, where)
            if _typed_arguments(node, self.catalog):
                self.typed.append(_Typed(str(node["function_name"]).lower(), where, bool(node.get("distinct"))))
        return list(self.found)

    def _expression(self, node: _Node, where: int | None) -> None:
        kind = node["class"]
        if kind == "COLUMN_REF":
            self._column(node, where)
        elif kind == "FUNCTION":
            self._function(node, where)
        elif kind == "WINDOW":
            self._window(node, where)
        elif kind not in _PLAIN_CLASSES:
            self.found.append(_Found(
                "untrusted", f"a {kind} expression", where,
                f"the guard does not know the construct {kind} ({node.get('type')}), so it cannot tell "
                "whether it gives the same rows on every run", "write it with common SQL expressions"))

    def _column(self, node: _Node, where: int | None) -> None:
        names = [str(n).lower() for n in node.get("column_names") or []]
        if len(names) == 1 and names[0] in _VALUE_FUNCTIONS:
            found = _clock(names[0], where) if names[0] in _CLOCK_FUNCTIONS else _session(names[0], where)
            self.found.append(_Found(found.kind, found.construct, where, found.problem,
                                     found.instead + f" (a column named {names[0]} must be qualified: "
                                     f"{_SOURCE}.{names[0]})"))
        if names and names[-1] == "rowid":
            self.found.append(_Found(
                "order", "rowid", where, "rowid numbers rows in the order they were stored, which is not "
                "part of the snapshot", "use the source's own columns (its business key)"))

    def _function(self, node: _Node, where: int | None) -> None:
        name = str(node["function_name"]).lower()
        arguments = _arguments(node)
        if _session_use(name) is not None:
            self.found.append(_session(name, where))
        elif name in _CLOCK_FUNCTIONS or (name == "age" and len(arguments) == 1):
            self.found.append(_clock(f"{name}()" if name == "age" else name, where))
        elif not self.catalog.known(name):
            self.found.append(_Found(
                "untrusted", f"{name}()", where,
                f"{name}() is not a built-in function of DuckDB {duckdb.__version__}: a macro or an extension's "
                "function, whose definition the guard cannot see",
                "use DuckDB's built-in CONSISTENT functions, or write the macro's expression inline"))
        elif self.catalog.always_volatile(name):
            self.found.append(_Found(
                "volatility", f"{name}()", where,
                f"{name}() is VOLATILE in DuckDB (or has side effects): it gives another value on every call",
                "compute the value from the source's columns with CONSISTENT functions (e.g. hash() or md5() "
                "of the business key instead of random() or uuid())"))
        elif self.catalog.never_consistent(name):
            self.found.append(_Found(
                "volatility", f"{name}()", where,
                f"{name}() is CONSISTENT_WITHIN_QUERY in DuckDB, not CONSISTENT: it can change between queries "
                "(the clock, a setting)", "use only functions DuckDB labels CONSISTENT"))
        elif self.catalog.aggregate(name):
            self._aggregate(node, name, where)

    def _window(self, node: _Node, where: int | None) -> None:
        name = str(node["function_name"]).lower()
        if name in _ORDER_WINDOWS:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() numbers or picks rows by their position in the window: rows that tie in its "
                "ORDER BY get their positions in the order they arrive in",
                "use rank() or dense_rank() (tied rows get one value), or leave picking the newest row "
                "to the tool"))
        elif name in _RANK_WINDOWS:
            return
        elif node.get("type") == "WINDOW_AGGREGATE" and self.catalog.aggregate(name):
            self._aggregate(node, name, where)
            self._frame(node, name, where)
        else:
            self.found.append(_Found(
                "untrusted", f"{name}()", where, f"{name}() is a window function the guard does not know",
                "use rank(), dense_rank(), or an aggregate over a RANGE or GROUPS frame"))

    def _frame(self, node: _Node, name: str, where: int | None) -> None:
        start, end = str(node.get("start")), str(node.get("end"))
        whole = start == "UNBOUNDED_PRECEDING" and end == "UNBOUNDED_FOLLOWING"
        if (start.endswith("_ROWS") or end.endswith("_ROWS")) and not whole:
            self.found.append(_Found(
                "order", f"{name}() OVER (ROWS ...)", where,
                "a ROWS frame counts rows by position: rows that tie in the window's ORDER BY fall in or out "
                "of the frame in the order they arrive in",
                "use a RANGE or GROUPS frame (tied rows stay together), or the whole partition"))

    def _aggregate(self, node: _Node, name: str, where: int | None) -> None:
        if name in _PICK_AGGREGATES:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() picks one row's value: which one depends on the order rows arrive in (and on ties)",
                "use min() or max() of the value itself, or GROUP BY it"))
        elif name in _SKETCH_AGGREGATES:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() approximates from a sketch or sample whose contents depend on the order rows arrive in",
                "use an exact aggregate (quantile_disc, count, min, max)"))
        elif name in _UNORDERED_COLLECTORS:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() collects values in the order rows arrive in and takes no ORDER BY",
                "collect with list(x ORDER BY x) and convert that (to_json(list(x ORDER BY x)))"))
        elif name in _FLOAT_ONLY_AGGREGATES:
            self.found.append(_Found(
                "equal-but-different", f"{name}()", where,
                f"{name}() computes in DOUBLE over the values in the order they arrive in: the last digits "
                "differ between runs", "compute it from exact DECIMAL sums and counts in an outer query"))
        elif name in _LIST_AGGREGATES:
            self._list(node, name, where)
        elif name not in _TYPED and name not in _SAFE_AGGREGATES:
            self.found.append(_Found(
                "untrusted", f"{name}()", where,
                f"{name}() is an aggregate the guard does not know to be independent of the order rows "
                "arrive in", "use count, sum or avg over exact types, min, max, or list(x ORDER BY x)"))

    def _list(self, node: _Node, name: str, where: int | None) -> None:
        arguments, orders = _arguments(node), _orders(node)
        value = _bare(arguments[0]) if arguments else None
        if value is not None and any(_bare(o.get("expression")) == value for o in orders):
            return
        why = ("its ORDER BY does not include the aggregated value, so values that tie on it come"
               if orders else "without an ORDER BY, they come")
        self.found.append(_Found(
            "order", f"{name}()", where,
            f"{name}() collects values in a list: {why} in the order rows arrive in",
            f"order by the aggregated value itself: {name}(x ORDER BY x)"))

    def _modifier(self, node: _Node, where: int | None) -> None:
        kind = node["type"]
        if kind in ("LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER"):
            limit, offset = node.get("limit"), node.get("offset")
            word = "LIMIT" if limit is not None else "OFFSET"
            first = _located(limit if limit is not None else (offset or {}), where)
            self.found.append(_Found(
                "order", word, self.locate.keyword_before(first, word),
                f"which rows {word} keeps depends on the order rows arrive in (the guard does not prove an "
                "ORDER BY total)", "filter with WHERE, or keep rank() OVER (...) = 1 (the tool keeps the "
                "newest row of each key itself)"))
        elif kind == "DISTINCT_MODIFIER" and node.get("distinct_on_targets"):
            first = _located(node["distinct_on_targets"][0], where)
            self.found.append(_Found(
                "order", "DISTINCT ON", self.locate.keyword_before(first, "DISTINCT"),
                "DISTINCT ON keeps the first row of each group in the order rows arrive in (ties in its "
                "ORDER BY)", "GROUP BY the key and aggregate each column deterministically, or leave picking "
                "the newest row to the tool"))

    def _join(self, node: _Node, where: int | None) -> None:
        kind = str(node.get("ref_type"))
        if kind in ("POSITIONAL", "ASOF"):
            self.found.append(_Found(
                "order", f"{kind} JOIN", where,
                f"{_article(kind)} {kind} JOIN pairs rows by their position or nearest match, which depends on "
                "the order rows arrive in (and on ties)", "join on equal keys"))
        elif kind not in _JOIN_KINDS or node.get("ranking_expression") is not None:
            self.found.append(_Found(
                "untrusted", f"a {kind} join", where, f"the guard does not know the join {kind}",
                "use INNER, LEFT, RIGHT, FULL, SEMI, ANTI or CROSS joins"))

    def judge_types(self, types: list[list[_Node | None]], known: Sequence[_Found]) -> list[_Found]:
        """The findings of the typed aggregates, given the types the probe learnt ([]: unknown).
        A call refused already is not refused again for a type the probe could not learn."""
        refused = {f.location for f in known}
        out: list[_Found] = []
        for k, call in enumerate(self.typed):
            learnt = types[k] if k < len(types) else []
            unknown = not learnt or any(t is None for t in learnt)
            if not (unknown and call.location in refused):
                out += _typed_findings(call, learnt)
        return out


def _typed_findings(call: _Typed, learnt: list[_Node | None]) -> list[_Found]:
    name, where = call.name, call.location
    if not learnt or any(t is None for t in learnt):
        return [_Found("equal-but-different", f"{name}()", where,
                       f"the guard could not learn the type {name}() aggregates (DuckDB binds no CTE that the "
                       "statement does not read), so it cannot prove its result exact",
                       "remove CTEs the statement does not read, or cast the argument to an exact type "
                       "(DECIMAL(p,s), BIGINT, VARCHAR)")]
    types = [t for t in learnt if t is not None]
    named = ", ".join(dict.fromkeys(_type_name(t) for t in types))
    if name in _SUM_AGGREGATES | _STATISTIC_AGGREGATES and any(t.get("id") in _FLOATS for t in types):
        instead = ("cast to DECIMAL(p,s) before summing, e.g. sum(CAST(x AS DECIMAL(18,6)))"
                   if name in _SUM_AGGREGATES else
                   "compute it from exact sums (sum(x), sum(x * x), count(x) over DECIMAL values) in an "
                   "outer query")
        return [_Found("equal-but-different", f"{name}()", where,
                       f"{name}() over {named} computes in floating point, adding values in the order rows "
                       "arrive in, which DuckDB's parallel aggregation does not fix: the last digits differ "
                       "between runs", instead)]
    if (name in _VALUE_AGGREGATES | _LIST_AGGREGATES or call.distinct) and any(_inexact(t) for t in types):
        return [_Found("equal-but-different", f"{name}()", where,
                       f"{name}() over {named}: values that compare equal print differently (-0.0 and 0.0, "
                       "INTERVAL '1 month' and '30 days', 'a' and 'A' under a collation), and which one it "
                       "keeps depends on the order rows arrive in", _EXACT_INSTEAD)]
    return []
