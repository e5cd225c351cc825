"""The parse tree as sqlglot's Spark parser builds it: positions kept in nodes, ancestors,
arguments, and the node classes the rules share."""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.allowlist import _SPEC_CLASSES

_SOURCE = "source"
_DIALECT = "spark"

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_PREDICATES = (*_COMPARISONS, exp.And, exp.Or, exp.Xor, exp.Not, exp.Is, exp.In, exp.Between, exp.Like,
               exp.ILike, exp.Escape, exp.Exists)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg)


def _arg(node: exp.Expression, key: str) -> object:
    """An argument of a node, under its name in this sqlglot or the next (``from``/``from_``)."""
    value = node.args.get(key)
    return value if value is not None else node.args.get(f"{key}_")


def _own_start(node: exp.Expression) -> int | None:
    start = node.meta.get("start") if node.meta else None
    return start if isinstance(start, int) else None


def _start(node: exp.Expression) -> int | None:
    """Where a node's text starts: its own position, else the first position inside it, else
    that of the nearest ancestor that has one."""
    inside = _inside(node)
    if inside is not None:
        return inside
    parent = node.parent
    while parent is not None:
        if (own := _own_start(parent)) is not None:
            return own
        parent = parent.parent
    return None


def _inside(node: exp.Expression) -> int | None:
    """The first position sqlglot kept in a node or inside it."""
    own = _own_start(node)
    if own is not None:
        return own
    return min((s for n in node.walk() if (s := _own_start(n)) is not None), default=None)


def _lambda_parameter(column: exp.Expression) -> exp.Lambda | None:
    """The lambda whose parameter ``column`` (a column or identifier in its body) names."""
    name = column.name.lower()
    node = column.parent
    while node is not None:
        if isinstance(node, exp.Lambda) and name in {str(p.name).lower() for p in node.expressions}:
            return node
        node = node.parent
    return None


def _ancestors(node: exp.Expression) -> Iterator[exp.Expression]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _is_function(node: exp.Expression) -> bool:
    return isinstance(node, exp.Func) or type(node).__name__ in _SPEC_CLASSES


def _implicit(node: exp.Expression) -> bool:
    """A node sqlglot's Spark parser adds around an argument (year(x) is Year(TsOrDsToDate(x)),
    date_format(x, f) is TimeToStr(TimeStrToTime(x), f)) and prints as the argument alone."""
    return (type(node).__name__ in ("TsOrDsToDate", "TimeStrToTime") and _own_start(node) is None
            and not node.args.get("safe") and not node.args.get("format"))


def _unwrapped(node: exp.Expression, outer: exp.Expression) -> exp.Expression:
    """The child of ``outer`` that holds ``node`` (through FILTER and parentheses)."""
    while node.parent is not outer and node.parent is not None:
        node = node.parent
    return node


def _leftmost(query: exp.Expression) -> exp.Select | None:
    while isinstance(query, (exp.SetOperation, exp.Subquery)):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _operator(node: exp.Expression) -> str:
    words = {"EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=", "NullSafeEQ": "<=>",
             "NullSafeNEQ": "IS DISTINCT FROM", "Between": "BETWEEN", "Add": "+", "Sub": "-", "Mul": "*",
             "Div": "/", "IntDiv": "DIV", "Mod": "%", "Neg": "-", "Like": "LIKE", "ILike": "ILIKE", "DPipe": "||",
             "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^", "BitwiseNot": "~"}
    return words.get(type(node).__name__, type(node).__name__)


def _values(node: exp.Expression) -> list[exp.Expression]:
    """The value arguments of a function: not its type, unit, ordering or lambda."""
    out: list[exp.Expression] = []
    for child in node.iter_expressions():
        if isinstance(child, exp.Distinct):
            out += child.expressions
        elif isinstance(child, exp.Order):
            if child.this is not None:
                out.append(child.this)
        elif not isinstance(child, (exp.DataType, exp.Var, exp.Identifier, exp.Lambda, exp.Ordered, exp.Star,
                                    exp.Where, exp.IntervalSpan, exp.JSONPath)):
            out.append(child)
    return out
