"""What the determinism guard asks pg_catalog and what it reports.

``referenced`` lists the function, operator and type OIDs of an analysed query tree;
``core.engines.postgres.guard.transform`` reads those from the catalog into a ``Catalog``; the rules of
``core.engines.postgres.guard.determinism`` and ``core.engines.postgres.guard.roworder`` judge the tree against it and report each
construct that can change the rows between runs as a ``Finding``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backfill_assets.core.engines.postgres.guard.querytree import as_int, expr_type, nodes

PG_CATALOG = "pg_catalog"


@dataclass(frozen=True)
class Function:
    signature: str  # regprocedure text, e.g. now()
    name: str
    schema: str
    kind: str  # f, a (aggregate), w (window), p
    volatility: str  # i, s, v
    language: str = "internal"  # pg_language.lanname: sql, plpgsql, c, internal, ...
    argument_types: str = ""  # e.g. "integer, text"
    returns_set: bool = False

    @property
    def builtin(self) -> bool:
        return self.schema == PG_CATALOG

    @property
    def trust_name(self) -> str:
        """How ``trusted_functions`` names it: ``schema.function`` (every overload)."""
        return f"{self.schema}.{self.name}"

    @property
    def qualified(self) -> str:
        """``schema.function(argument types)``, as refusals name it."""
        return f"{self.trust_name}({self.argument_types})"


@dataclass(frozen=True)
class Catalog:
    """What the rules need from pg_catalog, read once per check (see core.engines.postgres.guard.transform)."""

    functions: dict[int, Function]
    operator_functions: dict[int, int]  # operator OID -> its function OID
    type_io: dict[int, tuple[int, int]]  # type OID -> (input, output) function OIDs
    exact: set[tuple[int, int, int]] = field(default_factory=set)  # (type, typmod, collation)
    # Constant types whose literal is read by a date/time input function (date, time,
    # timestamp, and arrays, ranges, multiranges, domains and composites of them).
    clock_read: set[int] = field(default_factory=set)
    # Operator OID -> the support functions of the btree and hash operator families it
    # belongs to (comparison, sort support, hash, extended hash), for its argument types:
    # what a sort, a merge or hash join, a hashed grouping or a row comparison calls instead
    # of the operator's own function.
    operator_support: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Type OID -> the comparison and sort support functions of its default btree operator
    # class, which GREATEST and LEAST call.
    type_comparison: dict[int, tuple[int, ...]] = field(default_factory=dict)

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

    kind: str  # volatility | session | order | equal-but-different | untrusted
    construct: str
    location: int | None  # byte offset in the analysed statement
    problem: str
    instead: str


# The node fields that name a function the server calls, and the nodes that call an operator.
FUNCTION_FIELDS = ("funcid", "aggfnoid", "winfnoid", "startInRangeFunc", "endInRangeFunc")
OPERATOR_NODES = ("OPEXPR", "DISTINCTEXPR", "NULLIFEXPR", "SCALARARRAYOPEXPR")
# The operators a sort or grouping clause (ORDER BY, GROUP BY, DISTINCT, PARTITION BY) calls.
SORT_GROUP_OPERATORS = ("eqop", "sortop")
# Support functions (pg_amproc.amprocnum) that sorting, merging and hashing call: btree's
# comparison (1) and sort support (2), hash's standard (1) and extended (2) hash functions.
SUPPORT_NUMBERS = (1, 2)


def referenced(tree: Any) -> tuple[set[int], set[int], set[int], set[tuple[int, int, int]]]:
    """Function, operator and type OIDs, and the expression types, that the rules ask the
    catalog about."""
    funcs: set[int] = set()
    ops: set[int] = set()
    types: set[int] = set()
    typed: set[tuple[int, int, int]] = set()
    for node in nodes(tree):
        kind = node["@"]
        for f in FUNCTION_FIELDS:
            if as_int(node.get(f), 0) > 0:
                funcs.add(as_int(node[f]))
        if kind in OPERATOR_NODES:
            ops.add(as_int(node["opno"]))
        if kind == "ROWCOMPAREEXPR":
            ops.update(node.get("opnos") or [])
        if kind == "SORTGROUPCLAUSE":
            ops.update(as_int(node.get(f), 0) for f in SORT_GROUP_OPERATORS if as_int(node.get(f), 0) > 0)
        if kind == "COERCEVIAIO":
            types.add(as_int(node["resulttype"]))
            arg = expr_type(node.get("arg"))
            if arg is not None:
                types.add(arg[0])
        t = expr_type(node)
        if t is not None:
            typed.add(t)
    return funcs, ops, types, typed


def compared_types(tree: Any) -> set[int]:
    """The types that GREATEST and LEAST compare (with their default btree operator class)."""
    return {as_int(n.get("minmaxtype"), 0) for n in nodes(tree) if n["@"] == "MINMAXEXPR"} - {0}
