"""The kinds of every value of the (qualified) tree, derived from the columns of ``source`` and
Spark's typing rules; where a value may be of several kinds, the guard assumes the worst."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from backfill_assets.core.engines.spark.guard.allowlist import _SPECS, _Spec
from backfill_assets.core.engines.spark.guard.findings import _Found, _Locator
from backfill_assets.core.engines.spark.guard.kinds import (
    _BINARY,
    _BOOLEAN,
    _DECIMAL,
    _FLOAT,
    _INTEGER,
    _INTERVAL,
    _NULL,
    _UNKNOWN,
    _UNKNOWN_VALUE,
    Kinds,
    _literal_kind,
    _strip,
    _type_kinds,
)
from backfill_assets.core.engines.spark.guard.names import _spark_name
from backfill_assets.core.engines.spark.guard.nodes import (
    _PREDICATES,
    _ancestors,
    _implicit,
    _inside,
    _is_function,
    _lambda_parameter,
    _leftmost,
    _own_start,
    _values,
)
from backfill_assets.core.engines.spark.guard.parse import _Source


class _KindRules:
    """The state of the rules over the (qualified) tree, and the kinds of its values;
    ``typed``: whether the columns are resolved."""

    def __init__(self, locate: _Locator, source: _Source, scopes: list[Scope],
                 typed: bool) -> None:
        self.locate = locate
        self.text = locate.text
        self.typed = typed
        self.columns = source.kinds
        self.scope_of: dict[int, Scope] = {id(c): scope for scope in scopes for c in scope.columns}
        self.memo: dict[int, Kinds] = {}
        self.insides: dict[int, int | None] = {}
        self.found: list[_Found] = []

    def inside(self, node: exp.Expression) -> int | None:
        """The first position sqlglot kept in a node or inside it."""
        return self.insides[id(node)] if id(node) in self.insides else _inside(node)

    def start(self, node: exp.Expression) -> int | None:
        """Where a node's text starts (else that of the nearest ancestor that has a position)."""
        inside = self.inside(node)
        if inside is not None:
            return inside
        return next((own for a in _ancestors(node) if (own := _own_start(a)) is not None), None)

    def _add(self, kind: str, construct: str, where: int | None, problem: str, instead: str) -> None:
        self.found.append(_Found(kind, construct, where, problem, instead))

    def _untrusted(self, construct: str, where: int | None, problem: str, instead: str) -> None:
        self._add("untrusted", construct, where, problem, instead)

    def kinds(self, node: exp.Expression | None) -> Kinds:
        """The kinds the value of ``node`` may have (over-approximated)."""
        if node is None:
            return frozenset({_NULL})
        if not self.typed:
            return frozenset({_UNKNOWN})
        key = id(node)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = frozenset({_UNKNOWN})  # a cycle is unknown
        result = self._kinds(node) or frozenset({_UNKNOWN})
        self.memo[key] = result
        return result

    def _kinds(self, node: exp.Expression) -> Kinds:
        if _implicit(node) or isinstance(node, (exp.Alias, exp.Paren, exp.IgnoreNulls, exp.RespectNulls,
                                                  exp.Filter)):
            return self.kinds(node.this)
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Identifier):  # a lambda's parameter, in its body
            lam = _lambda_parameter(node)
            return self._parameter(lam, node.name.lower()) if lam is not None else frozenset({_UNKNOWN})
        if isinstance(node, exp.Literal):
            return frozenset({_literal_kind(node)})
        if isinstance(node, exp.Boolean):
            return frozenset({_BOOLEAN})
        if isinstance(node, exp.Null):
            return frozenset({_NULL})
        if isinstance(node, exp.HexString):
            return frozenset({_BINARY})
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return _type_kinds(node.to)
        if isinstance(node, exp.Interval):
            return frozenset({_INTERVAL})
        if isinstance(node, _PREDICATES):
            return frozenset({_BOOLEAN})
        if isinstance(node, exp.Div):
            both = self._union(node.this, node.expression)
            return both if _FLOAT in both or _DECIMAL in both else both | {_FLOAT}
        if isinstance(node, exp.IntDiv):
            return frozenset({_INTEGER})
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.Neg, exp.BitwiseAnd, exp.BitwiseOr,
                             exp.BitwiseXor, exp.BitwiseNot, exp.DPipe)):
            return self._union(*node.iter_expressions())
        if isinstance(node, exp.Case):
            branches = [i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
            return self._union(*branches)
        if isinstance(node, exp.If):
            return self._union(node.args.get("true"), node.args.get("false"))
        if isinstance(node, exp.Subquery):
            return self._first_column(node.this)
        if isinstance(node, exp.Window):
            return self.kinds(node.this)
        if isinstance(node, exp.Bracket):
            return _strip(self.kinds(node.this)) | {_NULL}
        if isinstance(node, exp.Dot):
            return _strip(self.kinds(node.this))
        if _is_function(node):
            return self._result(node)
        return frozenset({_UNKNOWN})

    def _union(self, *nodes: exp.Expression | None) -> Kinds:
        out: set[str] = set()
        for node in nodes:
            if node is not None:
                out |= self.kinds(node)
        return frozenset(out - {_NULL} or {_NULL})

    def _result(self, node: exp.Expression) -> Kinds:
        spec = self._spec(node)
        if spec is None:
            return frozenset({_UNKNOWN})
        if spec.rule == "castfn":
            return frozenset(spec.result)
        values = _values(node)
        out: set[str] = set()
        for token in spec.result:
            if token == "same":
                out |= self._union(*values)
            elif token == "first":
                out |= self.kinds(values[0]) if values else {_UNKNOWN}
            elif token == "second":
                out |= self.kinds(values[1]) if len(values) > 1 else {_UNKNOWN}
            elif token == "elem":
                out |= _strip(self.kinds(values[0])) if values else {_UNKNOWN}
            elif token == "body":
                out |= self._union(*[lam.this for lam in node.find_all(exp.Lambda)])
            elif token == "rounded":
                first = self.kinds(values[0]) if values else frozenset({_UNKNOWN})
                out |= (first - {_FLOAT}) | {_INTEGER} if _FLOAT in first and len(values) == 1 else first
            elif token == "quotient":
                both = self._union(*values)
                out |= both if _FLOAT in both or _DECIMAL in both else both | {_FLOAT}
            else:
                out.add(token)
        return frozenset(out)

    def _column(self, column: exp.Column) -> Kinds:
        name = column.name.lower()
        if not column.table:
            lam = _lambda_parameter(column)
            return self._parameter(lam, name) if lam is not None else frozenset({_UNKNOWN})
        scope = self.scope_of.get(id(column))
        source = scope.sources.get(column.table) if scope is not None else None
        if isinstance(source, exp.Table):
            return self.columns.get(name, frozenset({_UNKNOWN}))
        if isinstance(source, Scope):
            return self._output(source.expression, name)
        return frozenset({_UNKNOWN})

    def _parameter(self, lam: exp.Lambda, name: str) -> Kinds:
        """A lambda parameter: the elements of the function's first argument (the accumulator
        of aggregate/reduce: its initial value; a second parameter may also be an index)."""
        function = lam.parent
        values = _values(function) if _is_function(function) else []
        position = [str(p.name).lower() for p in lam.expressions].index(name)
        elements = _strip(self.kinds(values[0])) if values else frozenset({_UNKNOWN})
        if isinstance(function, exp.Reduce):
            return self.kinds(values[1]) if position == 0 and len(values) > 1 else elements
        if position == 0:
            return elements
        others = [_strip(self.kinds(v)) for v in values[1:] if not isinstance(v, exp.Lambda)]
        return frozenset(elements.union(*others) | {_INTEGER})

    def _output(self, query: exp.Expression, name: str) -> Kinds:
        """The kinds of the column ``name`` of a CTE, subquery, VALUES or LATERAL VIEW."""
        if isinstance(query, exp.Subquery):
            return self._output(query.this, name)
        if isinstance(query, exp.Select):
            for projection in query.expressions:
                if isinstance(projection, exp.Aliases):
                    names = [str(a.name).lower() for a in projection.expressions]
                    if name in names:
                        return self._generated(projection.this, names.index(name))
                elif projection.alias_or_name.lower() == name:
                    return self.kinds(projection)
            return frozenset({_UNKNOWN})
        if isinstance(query, exp.SetOperation):
            left = _leftmost(query)
            names = [p.alias_or_name.lower() for p in left.expressions] if left is not None else []
            if name not in names:
                return frozenset({_UNKNOWN})
            return self._position(query, names.index(name))
        if isinstance(query, exp.Values):
            alias = query.args.get("alias")
            names = [str(c.name).lower() for c in alias.columns] if alias is not None else []
            if name not in names:
                return frozenset({_UNKNOWN})
            index = names.index(name)
            return self._union(*[row.expressions[index] if len(row.expressions) > index else None
                                 for row in query.expressions])
        if isinstance(query, exp.Lateral):
            alias = query.args.get("alias")
            names = [str(c.name).lower() for c in alias.columns] if alias is not None else []
            return self._generated(query.this, names.index(name)) if name in names else frozenset({_UNKNOWN})
        return frozenset({_UNKNOWN})

    def _generated(self, generator: exp.Expression, index: int) -> Kinds:
        """The kinds of the ``index``-th column a generator makes."""
        spec = self._spec(generator) if _is_function(generator) else None
        if spec is None or spec.rule != "generator":
            return frozenset({_UNKNOWN})
        values = _values(generator)
        elements = _strip(self.kinds(values[0])) if values else frozenset({_UNKNOWN})
        if spec.name.startswith("pos") and index == 0:
            return frozenset({_INTEGER})
        return elements

    def _position(self, query: exp.Expression, index: int) -> Kinds:
        return self._union(*self._branch_columns(query, index))

    def _branch_columns(self, query: exp.Expression, index: int) -> list[exp.Expression | None]:
        """The ``index``-th column of every SELECT a set operation combines."""
        if isinstance(query, exp.Subquery):
            return self._branch_columns(query.this, index)
        if isinstance(query, exp.SetOperation):
            return self._branch_columns(query.this, index) + self._branch_columns(query.expression, index)
        if isinstance(query, exp.Select):
            projections = query.expressions
            if any(isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
                   for p in projections) or index >= len(projections):
                return [_UNKNOWN_VALUE]
            return [projections[index]]
        return [_UNKNOWN_VALUE]

    def _first_column(self, query: exp.Expression) -> Kinds:
        return self._position(query, 0)

    def _spec(self, node: exp.Expression) -> _Spec | None:
        spec = _SPECS.get(_spark_name(node, self.text))
        return spec if spec is not None and type(node).__name__ in spec.classes else None
