"""The visit of the (qualified) tree: each node to the rule that judges it, and the rules of
the clauses of queries (SELECT, set operations, joins, LATERAL VIEW, windows, GROUP BY,
LIMIT)."""

from __future__ import annotations

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.allowlist import _AGGREGATE_RULES, _WINDOW_ONLY
from backfill_assets.core.engines.spark.guard.findings import _EXACT_INSTEAD, _ORDER_INSTEAD, _Found
from backfill_assets.core.engines.spark.guard.functions import _FunctionRules
from backfill_assets.core.engines.spark.guard.kinds import _FLOAT, _UNKNOWN, Kinds, _inexact, _named
from backfill_assets.core.engines.spark.guard.names import _spark_name
from backfill_assets.core.engines.spark.guard.nodes import (
    _ARITHMETIC,
    _COMPARISONS,
    _DIALECT,
    _ancestors,
    _arg,
    _implicit,
    _is_function,
    _leftmost,
    _operator,
    _own_start,
)

# Parse-tree classes that need no rule of their own (their parts are walked and judged).
_PLAIN_CLASSES = frozenset({
    "Select", "Union", "Intersect", "Except", "With", "CTE", "Subquery", "From", "Join", "Where", "Group",
    "Having", "Order", "Ordered", "Alias", "Aliases", "TableAlias", "Identifier", "Column", "Star", "Paren",
    "Tuple", "Literal", "Boolean", "Null", "HexString", "DataType", "DataTypeParam", "ColumnDef", "Var",
    "Interval", "IntervalSpan", "Table", "Values", "Lateral", "Window", "WindowSpec", "Distinct", "Filter",
    "Limit", "Offset", "Lambda", "Not", "And", "Or", "Xor", "Is", "Neg", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor", "BitwiseNot", "DPipe", "Like", "ILike", "Escape", "EQ", "NEQ", "GT", "GTE", "LT", "LTE",
    "NullSafeEQ", "NullSafeNEQ", "In", "Between", "Add", "Sub", "Mul", "Div", "IntDiv", "Dot", "PropertyEQ",
    "GroupingSets", "Rollup", "Cube", "IgnoreNulls", "RespectNulls", "Cast", "TryCast", "Case", "If", "Bracket",
    "JSONPath", "JSONPathRoot", "JSONPathKey", "JSONPathSubscript",
})

_SELECT_ARGS = frozenset({
    "expressions", "from", "from_", "joins", "laterals", "where", "group", "having", "order", "limit",
    "offset", "distinct", "with", "with_",
})
_SET_ARGS = frozenset({"this", "expression", "distinct", "with", "with_", "order", "limit", "offset"})
_TABLE_ARGS = frozenset({"this", "alias", "db", "catalog", "sample", "version"})
_JOIN_ARGS = frozenset({"this", "kind", "side", "method", "on", "using"})
_CLAUSE_WORDS = {"pivots": "PIVOT", "windows": "WINDOW", "distribute": "DISTRIBUTE BY", "sort": "SORT BY",
                 "cluster": "CLUSTER BY", "qualify": "QUALIFY", "hint": "a hint", "into": "INTO"}
_JOIN_KINDS = frozenset({"", "INNER", "OUTER", "CROSS", "SEMI", "ANTI"})


class _Rules(_FunctionRules):
    """The rules over the (qualified) tree; ``typed``: whether the columns are resolved."""

    def check(self, tree: exp.Expression) -> list[_Found]:
        """What the rules refuse in ``tree`` (each node judged once the positions inside it are known)."""
        for node in reversed(list(tree.walk(bfs=True))):  # each node after the nodes inside it
            starts = [s for c in node.iter_expressions() if (s := self.insides.get(id(c))) is not None]
            own = _own_start(node)
            self.insides[id(node)] = min([*starts, own] if own is not None else starts, default=None)
        for node in tree.walk():
            self._visit(node)
        return list(self.found)

    def _visit(self, node: exp.Expression) -> None:
        kind = type(node).__name__
        where = self.start(node)
        if _implicit(node) or _in_unknown_clause(node):
            return  # a conversion sqlglot adds and does not print in Spark's; a clause refused already
        if isinstance(node, exp.Select):
            self._select(node, where)
        elif isinstance(node, exp.SetOperation):
            self._set_operation(node)
        elif isinstance(node, exp.Table):
            self._clauses(node, _TABLE_ARGS, "the table reference", where)
        elif isinstance(node, exp.Join):
            self._join(node, where)
        elif isinstance(node, exp.Lateral):
            self._lateral(node, where)
        elif isinstance(node, exp.Window):
            self._window(node, where)
        elif isinstance(node, exp.Group):
            self._group(node)
        elif isinstance(node, exp.Limit | exp.Offset):
            self._limit(node, where)
        elif isinstance(node, (exp.Cast, exp.TryCast)):
            self._cast(node, where)
        elif isinstance(node, (*_COMPARISONS, exp.Between)):
            self._coerce(f"{_operator(node)}", where, list(node.iter_expressions()))
        elif isinstance(node, exp.In):
            self._in(node, where)
        elif isinstance(node, _ARITHMETIC):
            self._arithmetic(node, where)
        elif isinstance(node, (exp.Like, exp.ILike, exp.DPipe, exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor,
                               exp.BitwiseNot)):
            self._pure(_operator(node), where, list(node.iter_expressions()))
        elif isinstance(node, (exp.Case, exp.If)):
            self._conditional(node, where)
        elif isinstance(node, exp.Values):
            self._values(node, where)
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            self._untrusted(f"{_spark_name(node.expression, self.text)}()", where,
                            "a function qualified by a schema or catalog is not a built-in the guard knows",
                            "use Spark's built-in functions, unqualified")
        elif (isinstance(node, exp.Exists) and isinstance(node.this, (exp.Query, exp.Subquery))
              or kind in _PLAIN_CLASSES):
            return
        elif _is_function(node):
            self._function(node, where)
        elif not any(not _known(a) for a in _ancestors(node)):  # inside an unknown construct: refused already
            self._untrusted(f"a {kind} construct", where,
                            f"the guard does not know the construct {kind} ({node.sql(dialect=_DIALECT)[:40]}), so "
                            "it cannot tell whether it gives the same rows on every run",
                            "write it with common SQL expressions")

    def _clauses(self, node: exp.Expression, known: frozenset[str], what: str, where: int | None) -> None:
        for key, value in node.args.items():
            if key not in known and value not in (None, False, [], ""):
                word = _CLAUSE_WORDS.get(key.rstrip("_"), key.rstrip("_").upper())
                first = value[0] if isinstance(value, list) and value else value
                inside = self.start(first) if isinstance(first, exp.Expression) else None
                place = self.locate.keyword_before(inside, word.replace(" ", r"\s+")) if inside is not None else where
                self._untrusted(word, place, f"the guard does not know the clause {word} of {what}",
                                "write the query with SELECT, FROM, JOIN, WHERE, GROUP BY, HAVING and ORDER BY; "
                                "the order of rows is not part of the result")

    def _select(self, node: exp.Select, where: int | None) -> None:
        self._clauses(node, _SELECT_ARGS, "a SELECT", where)
        distinct = node.args.get("distinct")
        if distinct is not None:
            first = self.inside(node.expressions[0]) if node.expressions else None
            place = self.locate.keyword_before(first, "DISTINCT") if first is not None else None
            if place is None and isinstance(from_ := _arg(node, "from"), exp.Expression):
                place = self.locate.last(self.inside(from_), r"\bDISTINCT\b")
            if distinct.args.get("on") is not None:
                self._untrusted("DISTINCT ON", place, "DISTINCT ON is not Spark SQL", "GROUP BY the key")
            else:
                self._collapsed("DISTINCT", [self.kinds(p) for p in node.expressions], place)

    def _set_operation(self, node: exp.SetOperation) -> None:
        word = {"Union": "UNION", "Intersect": "INTERSECT", "Except": "EXCEPT"}.get(type(node).__name__, "SET")
        word += "" if node.args.get("distinct") is not False else " ALL"
        self._clauses(node, _SET_ARGS, word, None)
        place = self.locate.last(self.start(node.expression), r"\b(?:UNION|INTERSECT|EXCEPT|MINUS)\b")
        left = _leftmost(node)
        width = len(left.expressions) if left is not None else 0
        for index in range(width):
            columns = self._branch_columns(node, index)
            self._coerce(word, place, columns)
            if word != "UNION ALL":
                self._collapsed(word, [self._union(*columns)], place)

    def _join(self, node: exp.Join, where: int | None) -> None:
        kind = str(node.args.get("kind") or "").upper()
        side = str(node.args.get("side") or "").upper()
        method = str(node.args.get("method") or "").upper()
        if kind not in _JOIN_KINDS or side not in ("", "LEFT", "RIGHT", "FULL") or method not in ("", "NATURAL"):
            words = " ".join(w for w in (method, side, kind) if w)
            self._untrusted(f"{words} JOIN", where, f"the guard does not know the join {words}",
                            "use INNER, LEFT, RIGHT, FULL, SEMI, ANTI or CROSS joins")
        self._clauses(node, _JOIN_ARGS, "a JOIN", where)

    def _lateral(self, node: exp.Lateral, where: int | None) -> None:
        spec = self._spec(node.this) if _is_function(node.this) else None
        if not node.args.get("view") or spec is None or spec.rule != "generator":
            self._untrusted("LATERAL", where, "the guard checks LATERAL VIEW with explode or posexplode only",
                            "use LATERAL VIEW explode(...) or a join")

    def _window(self, node: exp.Window, where: int | None) -> None:
        function = node.this
        while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls, exp.Filter)):
            function = function.this
        if not _is_function(function) or node.args.get("alias") is not None:
            self._untrusted("OVER", where, "a named window (OVER w) is not checked by the guard",
                            "write the window inline: OVER (PARTITION BY ... ORDER BY ...)")
            return
        spec = self._spec(function)
        name = _spark_name(function, self.text)
        if spec is None or spec.rule in ("rank", "order") or name in _WINDOW_ONLY:
            return  # judged as a function
        if spec.rule not in _AGGREGATE_RULES:
            self._untrusted(f"{name}()", where, f"{name}() is not a window function", "use an aggregate or rank()")
            return
        frame = node.args.get("spec")
        if isinstance(frame, exp.WindowSpec) and str(frame.args.get("kind") or "").upper() == "ROWS":
            whole = (str(frame.args.get("start")).upper() == "UNBOUNDED"
                     and str(frame.args.get("start_side")).upper() == "PRECEDING"
                     and str(frame.args.get("end")).upper() == "UNBOUNDED"
                     and str(frame.args.get("end_side")).upper() == "FOLLOWING")
            if not whole:
                self._add("order", f"{name}() OVER (ROWS ...)", where,
                          "a ROWS frame counts rows by position: rows that tie in the window's ORDER BY fall in or "
                          "out of the frame in the order they arrive in",
                          "use a RANGE frame (tied rows stay together), or the whole partition")

    def _group(self, node: exp.Group) -> None:
        select = node.parent
        projections = select.expressions if isinstance(select, exp.Select) else []
        keys: list[exp.Expression] = []
        for key in node.expressions:
            if isinstance(key, (exp.GroupingSets, exp.Rollup, exp.Cube)):
                for part in key.expressions:
                    keys += part.expressions if isinstance(part, exp.Tuple) else [part]
            else:
                keys.append(key)
        if node.args.get("all"):
            keys += [p for p in projections if not self._aggregates(p)]
        for key in keys:
            key = key.this if isinstance(key, exp.Paren) else key
            if isinstance(key, exp.Literal) and not key.is_string and key.name.isdigit():
                position = int(key.name)
                key = projections[position - 1] if 0 < position <= len(projections) else key
            kinds = self.kinds(key)
            if _inexact(kinds):
                label = key.alias_or_name if isinstance(key, (exp.Column, exp.Alias)) else "key"
                self._collapsed(f"GROUP BY {label}", [kinds], self.start(key))

    def _aggregates(self, projection: exp.Expression) -> bool:
        for node in projection.walk():
            if isinstance(node, exp.Subquery):
                continue
            if _is_function(node) and not node.find_ancestor(exp.Window, exp.Subquery):
                spec = self._spec(node)
                if isinstance(node, exp.AggFunc) or (spec is not None and spec.rule in _AGGREGATE_RULES):
                    return True
        return False

    def _limit(self, node: exp.Limit | exp.Offset, where: int | None) -> None:
        value = node.expression
        if isinstance(node, exp.Limit) and isinstance(value, exp.Var) and value.name.upper() == "ALL":
            return
        word = "LIMIT" if isinstance(node, exp.Limit) else "OFFSET"
        self._add("order", word, self.locate.keyword_before(self.start(value) if value else where, word),
                  f"which rows {word} keeps depends on the order rows arrive in (the guard does not prove an "
                  "ORDER BY total)", _ORDER_INSTEAD)

    def _collapsed(self, construct: str, kinds_list: list[Kinds], where: int | None) -> None:
        if not self.typed:
            return
        inexact = [k for k in kinds_list if _inexact(k)]
        if not inexact:
            return
        named = _named(frozenset().union(*inexact) & {_FLOAT, _UNKNOWN})
        self._add("equal-but-different", f"{construct} ({named})", where,
                  f"{construct} collapses rows whose values compare equal, but equal values of {named} can print "
                  "differently (-0.0 and 0.0, NaN): which one is kept depends on the order rows arrive in",
                  _EXACT_INSTEAD)


def _known(node: exp.Expression) -> bool:
    return type(node).__name__ in _PLAIN_CLASSES or _is_function(node)


def _in_unknown_clause(node: exp.Expression) -> bool:
    """Whether ``node`` is (in) a clause of a SELECT, set operation, table or join that the
    guard refuses as such (PIVOT, WINDOW, DISTRIBUTE BY ...)."""
    parent, key = node.parent, node.arg_key
    known = (_SELECT_ARGS if isinstance(parent, exp.Select) else _SET_ARGS if isinstance(parent, exp.SetOperation)
             else _TABLE_ARGS if isinstance(parent, exp.Table) else _JOIN_ARGS if isinstance(parent, exp.Join)
             else None)
    return known is not None and key not in known
