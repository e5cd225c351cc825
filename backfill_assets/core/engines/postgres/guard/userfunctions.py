"""What the transform guard reads of the functions outside ``pg_catalog`` that a transform calls.

PostgreSQL does not check a volatility label: a function labelled IMMUTABLE may read a
table, the clock or a setting. So ``core.engines.postgres.guard.transform`` judges every function outside
``pg_catalog`` (extensions' functions included) that the spec does not trust, by what it
can read of it here:

- a SQL-language function: the server analyses its body as a temporary copy with a
  pre-parsed body (``BEGIN ATOMIC``, PostgreSQL 14 and later) in a savepoint that is always
  rolled back, and the stored query tree is judged by the rules of the transform, plus two
  of its own (:func:`relations_read`, :func:`first_row`). A body written as text is anyone's
  text, so it is never pasted: pglast parses it, only SELECT and VALUES statements are read,
  and the copy holds them as pglast prints them back; the copy's CREATE is parsed again as
  exactly one CREATE FUNCTION and sent over the extended protocol, which runs one statement;
- an aggregate: its support functions (transition, final, combine, ...);
- any other language (PL/pgSQL, C, ...): it cannot be read, and is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pglast
import psycopg
from pglast import ast
from pglast.stream import RawStream
from pglast.visitors import Visitor
from psycopg import sql

from backfill_assets.core.engines.postgres.guard.catalog import Catalog, Finding, Function
from backfill_assets.core.engines.postgres.guard.querytree import Node, as_int, is_node, nodes, parse_node_tree
from backfill_assets.core.engines.postgres.guard.roworder import sorted_totally

_FUNCTIONS = sql.SQL(
    "SELECT p.oid::bigint, p.oid::regprocedure::text, p.proname, n.nspname, p.prokind, "
    "p.provolatile, l.lanname, pg_catalog.oidvectortypes(p.proargtypes), p.proretset "
    "FROM pg_catalog.pg_proc AS p "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace "
    "JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang "
    "WHERE p.oid = ANY(%(oids)s::oid[])"
)
_AGGREGATE_SUPPORT = sql.SQL(
    "SELECT a.aggtransfn::oid::bigint, a.aggfinalfn::oid::bigint, a.aggcombinefn::oid::bigint, "
    "a.aggserialfn::oid::bigint, a.aggdeserialfn::oid::bigint, a.aggmtransfn::oid::bigint, "
    "a.aggminvtransfn::oid::bigint, a.aggmfinalfn::oid::bigint "
    "FROM pg_catalog.pg_aggregate AS a WHERE a.aggfnoid = %(oid)s::oid"
)
AGGREGATE_ROLES = ("transition", "final", "combine", "serialization", "deserialization",
                   "moving-aggregate transition", "moving-aggregate inverse transition",
                   "moving-aggregate final")
# The body as written (prosrc) or, for a pre-parsed one, as the server prints it back; the
# search_path the function sets for itself, which its body's names are resolved under.
_BODY_SOURCE = sql.SQL(
    "SELECT p.proname, p.prosrc, pg_catalog.pg_get_function_sqlbody(p.oid), "
    "pg_catalog.pg_get_function_arguments(p.oid), pg_catalog.pg_get_function_result(p.oid), "
    "(SELECT pg_catalog.substr(c.setting, 13) FROM pg_catalog.unnest(p.proconfig) AS c(setting) "
    "WHERE pg_catalog.starts_with(c.setting, 'search_path=')) "
    "FROM pg_catalog.pg_proc AS p WHERE p.oid = %(oid)s::oid"
)
_SET_SEARCH_PATH = sql.SQL("SELECT pg_catalog.set_config('search_path', %(path)s, true)")
# pglast reads string literals as standard SQL does ('a\b' is three characters): so does the
# server, whatever its default, in the transaction that analyses a statement pglast printed.
STANDARD_STRINGS = sql.SQL("SELECT pg_catalog.set_config('standard_conforming_strings', 'on', true)")
_CREATE_COPY = sql.SQL("CREATE FUNCTION {name}({arguments}) RETURNS {result} LANGUAGE sql IMMUTABLE\n{body}")
_ATOMIC = sql.SQL("BEGIN ATOMIC\n{statements}END")
_STATEMENT = sql.SQL("{statement};\n")
_COPY_TREE = sql.SQL(
    "SELECT p.prosqlbody::text FROM pg_catalog.pg_proc AS p "
    "WHERE p.pronamespace = pg_catalog.pg_my_temp_schema() AND p.proname = %(name)s "
    "AND p.proargtypes = (SELECT o.proargtypes FROM pg_catalog.pg_proc AS o WHERE o.oid = %(oid)s::oid)"
)
_RELATIONS = sql.SQL(
    "SELECT n.nspname, c.relname FROM pg_catalog.pg_class AS c "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE c.oid = ANY(%(oids)s::oid[]) ORDER BY 1, 2"
)

# Pre-parsed bodies (pg_proc.prosqlbody, BEGIN ATOMIC) came with PostgreSQL 14.
MIN_BODY_SERVER = 140000
# RTEKind of src/include/nodes/parsenodes.h (the same from PostgreSQL 12 to 16).
RTE_RELATION, RTE_FUNCTION, RTE_VALUES, RTE_RESULT = "0", "3", "5", "8"


# What a statement the guard reads must not contain (the transform's, or a function body's).
FORBIDDEN_NODES = {
    ast.InsertStmt: "INSERT", ast.UpdateStmt: "UPDATE", ast.DeleteStmt: "DELETE",
    ast.MergeStmt: "MERGE", ast.IntoClause: "SELECT INTO", ast.LockingClause: "FOR UPDATE/SHARE",
    ast.RangeTableSample: "TABLESAMPLE",
}
_PROGRAM_LIMIT = "54"  # the SQLSTATE class of program limits exceeded
_UNREADABLE = "labelled IMMUTABLE, but the guard cannot read its body"


def not_the_statement(err: psycopg.DatabaseError) -> bool:
    """Whether a server error says the check could not finish, rather than that the statement
    is wrong: a lock or statement timeout, a serialization failure, a deadlock, a lost
    connection, no memory or disk left, the server shutting down (OperationalError). A
    program limit (class 54: too complex, too many columns) is the statement's own."""
    return isinstance(err, psycopg.OperationalError) and not (err.sqlstate or "").startswith(_PROGRAM_LIMIT)


def read_functions(conn: psycopg.Connection, oids: Iterable[int]) -> dict[int, Function]:
    """Function OID -> what the guard needs to know of it, in one catalog read."""
    rows = conn.execute(_FUNCTIONS, {"oids": sorted(set(oids))}).fetchall()
    return {int(r[0]): Function(r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[8])) for r in rows}


def aggregate_support(conn: psycopg.Connection, oid: int) -> list[tuple[int, str]]:
    """(function OID, its role) for each support function of an aggregate."""
    row = conn.execute(_AGGREGATE_SUPPORT, {"oid": oid}).fetchone()
    return [(int(f), role) for f, role in zip(row or (), AGGREGATE_ROLES) if f]


@dataclass(frozen=True)
class Body:
    """A SQL function's body as the server analysed it."""

    tree: Any  # the stored query tree: a Query, or a list of lists of Query
    text: bytes  # the statement that was analysed: the tree's locations are offsets into it

    @property
    def statements(self) -> list[Node]:
        """The body's top-level queries, in order: the last gives the result."""
        out: list[Node] = []
        stack = [self.tree]
        while stack:
            item = stack.pop(0)
            if is_node(item, "QUERY"):
                out.append(item)
            elif isinstance(item, list):
                stack[:0] = item
        return out


def analyse_body(conn: psycopg.Connection, oid: int) -> Body | str:
    """Have the server analyse the body of SQL function ``oid``, or say why it cannot.

    A temporary copy of the function (same name, arguments and result, the body pre-parsed)
    is created in a savepoint that is always rolled back; its stored tree is read before.
    A body written as text is re-printed by pglast, and read only if it is SELECT and VALUES
    statements (:func:`reprinted_body`).

    Raises:
        psycopg.OperationalError: the server could not finish (see :func:`not_the_statement`).
    """
    if conn.info.server_version < MIN_BODY_SERVER:
        return "a SQL function, and PostgreSQL before 14 cannot analyse a function's body without calling it"
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(STANDARD_STRINGS)
            name, source, parsed, arguments, result, search_path = conn.execute(
                _BODY_SOURCE, {"oid": oid}).fetchone()
            if parsed is not None:
                # A pre-parsed body, as the server prints it back: its own text, not the user's.
                body = sql.SQL(parsed)
            else:
                statements = reprinted_body(source)
                if isinstance(statements, str):
                    return statements
                body = _ATOMIC.format(statements=sql.Composed(
                    [_STATEMENT.format(statement=sql.SQL(s)) for s in statements]))
            statement = _CREATE_COPY.format(
                name=sql.Identifier("pg_temp", name), arguments=sql.SQL(arguments), result=sql.SQL(result),
                body=body,
            )
            text = statement.as_string(conn)
            unreadable = _not_one_create_function(text)
            if unreadable is not None:
                return unreadable
            if search_path is not None:
                conn.execute(_SET_SEARCH_PATH, {"path": search_path})
            # Binary: the extended protocol, which refuses a second statement (the simple one,
            # used for a query without parameters, would run them all). The copy takes no
            # parameters, so % is not doubled.
            conn.execute(statement, binary=True)
            stored = conn.execute(_COPY_TREE, {"name": name, "oid": oid}).fetchone()
    except psycopg.DatabaseError as err:
        if not_the_statement(err):
            raise
        return f"labelled IMMUTABLE, but the server cannot analyse its body ({err.diag.message_primary})"
    if stored is None or stored[0] is None:
        return "labelled IMMUTABLE, but the server kept no analysed body for it"
    return Body(parse_node_tree(stored[0]), text.encode("utf-8"))


class _Forbidden(Visitor):
    def __init__(self) -> None:
        self.found: list[str] = []

    def visit(self, ancestors, node):  # noqa: D102 - pglast's visitor protocol
        self.found += [word for kind, word in FORBIDDEN_NODES.items() if isinstance(node, kind)]


def _kind(stmt: object) -> str:
    """A statement's kind as SQL words: DropStmt -> DROP, TransactionStmt (END) -> TRANSACTION."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(stmt).__name__.removesuffix("Stmt")).upper()


def _problems(statements: Iterable[object], allowed: tuple[type, ...]) -> list[str]:
    """What makes ``statements`` more than reading: another kind of statement, or a forbidden
    clause (a data-modifying CTE, SELECT INTO, row locking, TABLESAMPLE)."""
    problems: list[str] = []
    for stmt in statements:
        if not isinstance(stmt, allowed):
            problems.append(f"a {_kind(stmt)} statement")
            continue
        forbidden = _Forbidden()
        forbidden(stmt)
        problems += forbidden.found
    return list(dict.fromkeys(problems))


def reprinted_body(source: str) -> list[str] | str:
    """A SQL function's body written as text, as statements pglast re-printed, or why the
    guard does not read it: it does not parse, is not only SELECT and VALUES statements, or
    does not print back to the same statements."""
    try:
        parsed = [raw.stmt for raw in pglast.parse_sql(source)]
    except pglast.parser.ParseError as err:
        return f"{_UNREADABLE}, which does not parse ({err})"
    problems = _problems(parsed, (ast.SelectStmt,))
    if problems:
        return f"{_UNREADABLE}: it reads bodies of SELECT and VALUES statements only, and this one has {', '.join(problems)}"
    printed = [RawStream()(stmt) for stmt in parsed]
    try:
        again = [raw.stmt for raw in pglast.parse_sql(";\n".join(printed))] if printed else []
    except pglast.parser.ParseError:
        again = None
    if again != parsed:
        return f"{_UNREADABLE}: pglast does not print it back as the same statements"
    return printed


def _body_statements(body: object) -> list[object]:
    """The statements of a parsed CREATE FUNCTION's sql_body (BEGIN ATOMIC: lists of them)."""
    if isinstance(body, (list, tuple)):
        return [s for item in body for s in _body_statements(item)]
    return [] if body is None else [body]


def _not_one_create_function(text: str) -> str | None:
    """None if ``text`` is one CREATE FUNCTION whose body only reads; else why not. The copy's
    statement is built of the server's text of the function: checked before it is sent."""
    try:
        parsed = [raw.stmt for raw in pglast.parse_sql(text)]
    except pglast.parser.ParseError as err:
        return f"{_UNREADABLE}, whose copy does not parse ({err})"
    if len(parsed) != 1 or not isinstance(parsed[0], ast.CreateFunctionStmt):
        return f"{_UNREADABLE}: its copy is not one CREATE FUNCTION statement"
    problems = _problems(_body_statements(parsed[0].sql_body), (ast.SelectStmt, ast.ReturnStmt))
    if problems:
        return f"{_UNREADABLE}: it reads bodies of SELECT, VALUES and RETURN only, and this one has {', '.join(problems)}"
    return None


def relations_read(conn: psycopg.Connection, body: Body) -> list[str]:
    """The tables, views and sequences a body reads or writes, as schema.name."""
    oids = {as_int(n.get("relid")) for n in nodes(body.tree)
            if n["@"] == "RANGETBLENTRY" and n.get("rtekind") == RTE_RELATION}
    if not oids:
        return []
    return [f"{s}.{r}" for s, r in conn.execute(_RELATIONS, {"oids": sorted(oids)}).fetchall()]


def first_row(body: Body, catalog: Catalog) -> Finding | None:
    """A function that returns one value returns the first row of its last query: refused
    when that query can return several rows in an order that is not fixed."""
    statements = body.statements
    if not statements or _first_row_fixed(statements[-1], catalog):
        return None
    return Finding(
        "order", "the first row", None,
        "it returns the first row of its last query, and that query can return several rows "
        "in an order that is not fixed (a join, GROUP BY, DISTINCT, a set operation, a window "
        "or a subquery in FROM, without an ORDER BY over every output column)",
        "ORDER BY every output column of the function's last query, or aggregate its rows",
    )


def _first_row_fixed(query: Node, catalog: Catalog) -> bool:
    """Whether the query gives at most one row, or its rows in a fixed order: sorted
    totally, or straight from one IMMUTABLE set-returning function or VALUES list."""
    if sorted_totally(query, catalog):
        return True
    grouped = query.get("groupClause") or query.get("groupingSets")
    if query.get("hasAggs") == "true" and not grouped and query.get("hasTargetSRFs") != "true":
        return True  # one row
    if (query.get("setOperations") is not None or grouped or query.get("distinctClause")
            or query.get("hasWindowFuncs") == "true"):
        return False
    fromlist = (query.get("jointree") or {}).get("fromlist") or []
    if not fromlist:
        return True
    rtable = query.get("rtable") or []
    if len(fromlist) != 1 or not is_node(fromlist[0], "RANGETBLREF"):
        return False
    index = as_int(fromlist[0].get("rtindex"), 0) - 1
    return 0 <= index < len(rtable) and rtable[index].get("rtekind") in (RTE_FUNCTION, RTE_VALUES, RTE_RESULT)
