"""Validation of an optional ``transform_sql``.

Two gates, both before anything is written:

1. Shape, by PostgreSQL's own parser (pglast): exactly one plain SELECT, no data-modifying
   CTE, no SELECT INTO, no row locking, no TABLESAMPLE, and no relation other than the CTE
   ``source`` (the snapshot) or CTEs the statement defines itself.
2. Determinism, by the catalog: the server resolves every function, operator and I/O
   coercion the statement uses (inside a temporary view, in a transaction that is rolled
   back), and each must be IMMUTABLE in ``pg_proc.provolatile``. So ``now()``, ``random()``,
   ``nextval()``, ``clock_timestamp()``, ``timestamptz + interval`` and user-defined
   volatile functions are refused by the catalog, not by a word list.

Known limit: a literal the parser folds into a constant (``'now'::timestamptz``) is
evaluated once when the view is made and leaves no function behind to check. The two
independent builds still catch a transform whose result varies between runs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pglast
import psycopg
from pglast import ast
from pglast.stream import RawStream
from pglast.visitors import Visitor
from psycopg import sql

from backfill_assets.core import sqlbuild
from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import TableRef

_FORBIDDEN_NODES = {
    ast.InsertStmt: "INSERT", ast.UpdateStmt: "UPDATE", ast.DeleteStmt: "DELETE",
    ast.MergeStmt: "MERGE", ast.IntoClause: "SELECT INTO", ast.LockingClause: "FOR UPDATE/SHARE",
    ast.RangeTableSample: "TABLESAMPLE",
}


class _Shape(Visitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.relations: list[str] = []
        self.ctes: set[str] = set()

    def visit(self, ancestors, node):  # noqa: D102 - pglast's visitor protocol
        for kind, word in _FORBIDDEN_NODES.items():
            if isinstance(node, kind):
                self.problems.append(f"{word} is not allowed")
        if isinstance(node, ast.CommonTableExpr):
            self.ctes.add(node.ctename)
        if isinstance(node, ast.RangeVar):
            name = node.relname if node.schemaname is None else f"{node.schemaname}.{node.relname}"
            if node.schemaname is not None or node.catalogname is not None:
                self.relations.append(name)
            else:
                self.relations.append(node.relname)


def validate_transform_text(text: str) -> str:
    """Check the statement's shape and return it re-printed by pglast (one statement, no
    comments or trailing text).

    Raises:
        SpecError: it does not parse, is not exactly one SELECT, or reads another relation.
    """
    try:
        statements = pglast.parse_sql(text)
    except pglast.parser.ParseError as err:
        raise SpecError(f"transform_sql does not parse: {err}") from None
    if len(statements) != 1:
        raise SpecError(
            f"transform_sql must be exactly one SELECT statement; it has {len(statements)}"
        )
    stmt = statements[0].stmt
    if not isinstance(stmt, ast.SelectStmt):
        raise SpecError(
            f"transform_sql must be a SELECT; it is a {type(stmt).__name__.removesuffix('Stmt').upper()}"
        )
    shape = _Shape()
    shape(stmt)
    foreign = sorted({r for r in shape.relations if r not in shape.ctes and r != sqlbuild.SOURCE_CTE})
    if foreign:
        shape.problems.append(
            f"it reads {', '.join(foreign)}; a transform may read only the snapshot as "
            f"'{sqlbuild.SOURCE_CTE}' (other tables are mutable external state)"
        )
    if shape.problems:
        raise SpecError("transform_sql is refused: " + "; ".join(dict.fromkeys(shape.problems)))
    return RawStream()(stmt)


_CHECK_VIEW = "backfill_assets_transform_check"

_CREATE_VIEW = sql.SQL("CREATE TEMPORARY VIEW {view} AS {query}")

_NODE_TREE = sql.SQL(
    "SELECT r.ev_action::text FROM pg_catalog.pg_rewrite AS r "
    "WHERE r.ev_class = %(view)s::regclass"
)

# Built-in functions are pinned objects with no pg_depend rows, so the resolved query tree
# itself is read: every function, aggregate, window function, operator and I/O coercion the
# server chose, by OID.
_NOT_IMMUTABLE = sql.SQL(
    "SELECT p.oid::regprocedure::text, p.provolatile FROM pg_catalog.pg_proc AS p "
    "WHERE p.provolatile <> 'i' AND (p.oid = ANY(%(funcs)s::oid[]) "
    "OR p.oid IN (SELECT o.oprcode FROM pg_catalog.pg_operator AS o WHERE o.oid = ANY(%(ops)s::oid[])) "
    "OR p.oid IN (SELECT t.typinput FROM pg_catalog.pg_type AS t WHERE t.oid = ANY(%(types)s::oid[]))) "
    "ORDER BY 1"
)

_TREE_TOKEN = re.compile(
    r"(?<!\\)\{(?P<node>[A-Z_]+)|(?<!\\)\}"
    r"|:(?P<field>funcid|aggfnoid|winfnoid|opno|resulttype) (?P<oid>\d+)"
    r"|:opnos \(o (?P<oids>[\d ]+)\)"
)


def referenced_oids(node_tree: str) -> tuple[list[int], list[int], list[int]]:
    """Function, operator and I/O-coerced type OIDs named in a ``pg_node_tree`` text.

    A CoerceViaIO calls the result type's input function, so its ``resulttype`` counts;
    other nodes' result types do not.
    """
    funcs: set[int] = set()
    ops: set[int] = set()
    types: set[int] = set()
    stack: list[str] = []
    for m in _TREE_TOKEN.finditer(node_tree):
        if m.group("node"):
            stack.append(m.group("node"))
        elif m.group(0) == "}":
            if stack:
                stack.pop()
        elif m.group("oids"):
            ops.update(int(x) for x in m.group("oids").split())
        else:
            field, oid = m.group("field"), int(m.group("oid"))
            if field == "opno":
                ops.add(oid)
            elif field == "resulttype":
                if stack and stack[-1] == "COERCEVIAIO":
                    types.add(oid)
            else:
                funcs.add(oid)
    return sorted(funcs), sorted(ops), sorted(types)


_VOLATILITY = {"s": "STABLE", "v": "VOLATILE"}


def validate_transform_in_catalog(
    conn: psycopg.Connection, base: TableRef, base_columns: Sequence[str], partition_key: str,
    output_columns: Sequence[str], transform: str,
) -> None:
    """Resolve the transform on the server and refuse any non-IMMUTABLE function or operator.

    Also refuses a transform that does not produce every output column. Creates a temporary
    view inside a transaction that is always rolled back: nothing persists.

    Raises:
        SpecError: a function is not immutable, a column is missing, or the server rejects
            the statement.
    """
    # A view takes no parameters: the statement is sent as it is, so % is not doubled.
    query = sqlbuild.input_relation(
        base, base_columns, partition_key, output_columns, transform, filtered=False,
        escape_percent=False,
    )
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(_CREATE_VIEW.format(view=sql.Identifier(_CHECK_VIEW), query=query))
            tree = conn.execute(_NODE_TREE, {"view": _CHECK_VIEW}).fetchone()
            funcs, ops, types = referenced_oids(tree[0] if tree else "")
            rows = conn.execute(_NOT_IMMUTABLE, {"funcs": funcs, "ops": ops, "types": types}).fetchall()
    except psycopg.errors.UndefinedColumn as err:
        raise SpecError(
            "transform_sql does not produce every needed column "
            f"({', '.join(output_columns)}): {err.diag.message_primary}"
        ) from None
    except psycopg.DatabaseError as err:
        raise SpecError(f"transform_sql is rejected by the server: {err.diag.message_primary}") from None
    if rows:
        listed = ", ".join(f"{name} ({_VOLATILITY.get(v, v)})" for name, v in rows)
        raise SpecError(
            f"transform_sql calls functions that are not IMMUTABLE: {listed}; a transform must "
            "give the same rows on every run, so it may use only IMMUTABLE functions"
        )
