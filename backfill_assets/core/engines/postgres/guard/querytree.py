"""Read PostgreSQL's stored query trees (``pg_node_tree`` text) as Python values.

The server analyses a statement once and stores the result, for a view, in
``pg_rewrite.ev_action``: every function, aggregate, window, operator and cast it chose, by
OID, with the types, typmods and collations it resolved and the byte offset (``location``)
of each construct in the statement. The transform guard (``core.engines.postgres.guard.determinism``) reads that
tree instead of guessing from words.

Format (``src/backend/nodes/outfuncs.c`` and ``read.c``): a node is
``{NAME :field value ...}``; ``<>`` is NULL; ``( ... )`` is a list of nodes or strings,
``(i 1 2)``, ``(o 1 2)`` and ``(b 1 2)`` are integer, OID and bitmapset lists; a datum is
``N [ b1 ... bN ]``; a backslash escapes the next character of a token.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

Node = dict[str, Any]  # the node's type is under "@"; its fields by name

_TOKEN = re.compile(r"[(){}]|(?:\\.|[^\s(){}\\])+")
_UNESCAPE = re.compile(r"\\(.)")


class TreeSyntaxError(ValueError):
    """The text is not a pg_node_tree this reader understands."""


def parse_node_tree(text: str) -> Any:
    """Parse a ``pg_node_tree`` text into dicts (nodes), lists and scalars.

    Scalars stay strings (``"23"``, ``"true"``), except ``<>`` which is None.

    Raises:
        TreeSyntaxError: unbalanced or unexpected tokens.
    """
    tokens = _TOKEN.findall(text)
    value, end = _value(tokens, 0)
    if end != len(tokens):
        raise TreeSyntaxError(f"trailing tokens after position {end}")
    return value


def _value(tokens: list[str], i: int) -> tuple[Any, int]:
    if i >= len(tokens):
        raise TreeSyntaxError("unexpected end of the tree")
    token = tokens[i]
    if token == "{":
        return _node(tokens, i + 1)
    if token == "(":
        return _list(tokens, i + 1)
    if token in (")", "}"):
        raise TreeSyntaxError(f"unexpected {token!r} at token {i}")
    return (None if token == "<>" else _UNESCAPE.sub(r"\1", token)), i + 1


def _node(tokens: list[str], i: int) -> tuple[Node, int]:
    node: Node = {"@": tokens[i]}
    i += 1
    while i < len(tokens) and tokens[i] != "}":
        field = tokens[i]
        if not field.startswith(":"):
            raise TreeSyntaxError(f"expected a field name at token {i}, got {field!r}")
        name = field[1:]
        if name == "constvalue" and tokens[i + 1] != "<>":
            # A datum: its length, then its bytes in brackets; kept as the list of bytes.
            end = tokens.index("]", i + 2)
            node[name], i = tokens[i + 3:end], end + 1
            continue
        node[name], i = _value(tokens, i + 1)
    if i >= len(tokens):
        raise TreeSyntaxError("unclosed node")
    return node, i + 1


def _list(tokens: list[str], i: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    if i < len(tokens) and tokens[i] in ("i", "o", "b", "x"):
        i += 1  # a typed list of integers
        while i < len(tokens) and tokens[i] != ")":
            out.append(int(tokens[i]))
            i += 1
        return out, i + 1
    while i < len(tokens) and tokens[i] != ")":
        item, i = _value(tokens, i)
        out.append(item.strip('"') if isinstance(item, str) else item)
    if i >= len(tokens):
        raise TreeSyntaxError("unclosed list")
    return out, i + 1


def nodes(value: Any) -> Iterator[Node]:
    """Every node in ``value``, depth first, parents before children."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(reversed([v for k, v in item.items() if k != "@"]))
        elif isinstance(item, list):
            stack.extend(reversed(item))


def is_node(value: Any, *kinds: str) -> bool:
    return isinstance(value, dict) and value.get("@") in kinds


def as_int(value: Any, default: int = -1) -> int:
    return default if value is None else int(value)


def location(node: Node) -> int | None:
    """The node's byte offset in the statement, or None where the server kept none."""
    loc = node.get("location")
    return None if loc is None or int(loc) < 0 else int(loc)


# (type, typmod, collation) fields of the expression nodes that carry them.
_TYPED = {
    "VAR": ("vartype", "vartypmod", "varcollid"),
    "CONST": ("consttype", "consttypmod", "constcollid"),
    "PARAM": ("paramtype", "paramtypmod", "paramcollid"),
    "AGGREF": ("aggtype", None, "aggcollid"),
    "WINDOWFUNC": ("wintype", None, "wincollid"),
    "OPEXPR": ("opresulttype", None, "opcollid"),
    "DISTINCTEXPR": ("opresulttype", None, "opcollid"),
    "NULLIFEXPR": ("opresulttype", None, "opcollid"),
    "RELABELTYPE": ("resulttype", "resulttypmod", "resultcollid"),
    "COERCEVIAIO": ("resulttype", None, "resultcollid"),
    "ARRAYCOERCEEXPR": ("resulttype", "resulttypmod", "resultcollid"),
    "COERCETODOMAIN": ("resulttype", "resulttypmod", "resultcollid"),
    "FIELDSELECT": ("resulttype", "resulttypmod", "resultcollid"),
    "SUBSCRIPTINGREF": ("refrestype", "reftypmod", "refcollid"),
    "CASEEXPR": ("casetype", None, "casecollid"),
    "COALESCEEXPR": ("coalescetype", None, "coalescecollid"),
    "MINMAXEXPR": ("minmaxtype", None, "minmaxcollid"),
    "ARRAYEXPR": ("array_typeid", None, "array_collid"),
    "ROWEXPR": ("row_typeid", None, None),
    "SQLVALUEFUNCTION": ("type", "typmod", None),
    "CASETESTEXPR": ("typeId", "typeMod", "collation"),
}
_BOOL = 16
_INT4 = 23
_COERCE_CASTS = {"1", "2"}  # CoercionForm: an explicit or implicit cast


def expr_type(expr: Any) -> tuple[int, int, int] | None:
    """(type OID, typmod, collation OID) of an expression node, or None when this reader
    cannot tell (callers treat that as the least safe type)."""
    if not isinstance(expr, dict):
        return None
    kind = expr["@"]
    if kind == "TARGETENTRY":
        return expr_type(expr.get("expr"))
    if kind in ("BOOLEXPR", "NULLTEST", "BOOLEANTEST", "SCALARARRAYOPEXPR", "ROWCOMPAREEXPR"):
        return _BOOL, -1, 0
    if kind == "GROUPINGFUNC":
        return _INT4, -1, 0
    if kind == "COLLATEEXPR":
        inner = expr_type(expr.get("arg"))
        return None if inner is None else (inner[0], inner[1], as_int(expr.get("collOid"), 0))
    if kind == "FUNCEXPR":
        typmod = -1
        args = expr.get("args") or []
        # A length coercion (numeric(14,2), varchar(10)) carries its typmod as a constant.
        if expr.get("funcformat") in _COERCE_CASTS and len(args) >= 2 and is_node(args[1], "CONST"):
            typmod = _const_int4(args[1])
        return as_int(expr["funcresulttype"]), typmod, as_int(expr.get("funccollid"), 0)
    fields = _TYPED.get(kind)
    if fields is None:
        return None
    type_f, typmod_f, coll_f = fields
    return (
        as_int(expr.get(type_f)),
        as_int(expr.get(typmod_f)) if typmod_f else -1,
        as_int(expr.get(coll_f), 0) if coll_f else 0,
    )


def _const_int4(const: Node) -> int:
    # A by-value datum prints as the bytes of a Datum in the server's byte order; the
    # servers this runs on (x86-64, ARM64) are little-endian.
    data = const.get("constvalue")
    if not isinstance(data, list) or len(data) < 4:
        return -1
    return int.from_bytes(bytes(int(b) & 0xFF for b in data[:4]), "little", signed=True)
