"""Validation of an optional ``transform_sql``.

Two gates, both before anything is written:

1. Shape, by PostgreSQL's own parser (pglast): exactly one plain SELECT, no data-modifying
   CTE, no SELECT INTO, no row locking, no TABLESAMPLE, and no relation other than the CTE
   ``source`` (the snapshot) or CTEs the statement defines itself.
2. Determinism, by the server and the catalog: the server analyses the statement (inside a
   temporary view, in a transaction that is rolled back) and the rules of
   ``core.engines.postgres.guard.determinism`` read the query tree it stored: functions that are not IMMUTABLE,
   values of the session, the role or the clock, and constructs whose result depends on
   the order rows arrive in. Each refusal names the construct, where it is in the SQL, and
   what to do instead.
3. Functions outside ``pg_catalog`` (the user's, and extensions' in any schema), whose
   IMMUTABLE label PostgreSQL does not check: each one the transform calls, directly or
   through an operator, an aggregate, a cast, a sort or hash (the support functions of an
   operator's btree and hash operator families), is refused unless the spec lists it
   in ``trusted_functions`` or the guard can see into it. A SQL function's body is analysed
   by the server and judged by these same rules, recursively (core.engines.postgres.guard.userfunctions); it may
   read no table. A PL/pgSQL or C function cannot be read, and is refused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

import pglast
import psycopg
from pglast import ast
from pglast.stream import RawStream
from pglast.visitors import Visitor
from psycopg import sql

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.engines.postgres.guard.catalog import Finding, Function
from backfill_assets.core.engines.postgres.guard.determinism import called, findings, in_order
from backfill_assets.core.engines.postgres.guard.querytree import location, nodes, parse_node_tree
from backfill_assets.core.engines.postgres.guard.reading import read_catalog
from backfill_assets.core.engines.postgres.guard.userfunctions import (
    FORBIDDEN_NODES,
    STANDARD_STRINGS,
    Body,
    aggregate_support,
    analyse_body,
    first_row,
    not_the_statement,
    read_functions,
    relations_read,
)
from backfill_assets.core.engines.postgres.inputs import input_reads
from backfill_assets.core.errors import SpecError, TransformError, TransformProblem
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.spec import Spec, TrustedFunction
from backfill_assets.core.vocabulary import TableRef


class _Shape(Visitor):
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.relations: list[str] = []
        self.ctes: set[str] = set()

    def visit(self, ancestors, node):  # noqa: D102 - pglast's visitor protocol
        for kind, word in FORBIDDEN_NODES.items():
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


def validate_transform_text(text: str, inputs: Collection[str] = ()) -> str:
    """Check the statement's shape and return it re-printed by pglast (one statement, no
    comments or trailing text).

    Raises:
        SpecError: it does not parse, is not exactly one SELECT, or reads a relation that is
            neither 'source' nor one of the spec's ``inputs`` (by name).
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
    declared = {sqlbuild.SOURCE_CTE, *inputs}
    shadowed = sorted(shape.ctes & declared)
    if shadowed:
        shape.problems.append(f"its own WITH names {', '.join(shadowed)}, which the snapshot's inputs are read by; "
                              "name that CTE otherwise")
    foreign = sorted({r for r in shape.relations if r not in shape.ctes and r not in declared})
    if foreign:
        named = (f"the snapshot as '{sqlbuild.SOURCE_CTE}' and the spec's inputs ({', '.join(sorted(inputs))})"
                 if inputs else f"the snapshot as '{sqlbuild.SOURCE_CTE}'")
        shape.problems.append(
            f"it reads {', '.join(foreign)}; a transform may read only {named}: other tables are mutable "
            "external state (declare one under inputs, and it is pinned with the source)"
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
def validate_transform_in_catalog(
    conn: psycopg.Connection, base: TableRef, base_columns: Sequence[str], partition_key: str,
    output_columns: Sequence[str], transform: str, original: str | None = None,
    trusted_functions: Sequence[TrustedFunction] = (), inputs: Sequence[sqlbuild.InputRead] = (),
) -> None:
    """Have the server analyse the transform and refuse it if its rows could change between
    runs from the same snapshot (see :mod:`backfill_assets.core.engines.postgres.guard.determinism`), or if it calls
    a function outside pg_catalog that is neither trusted nor seen to be deterministic.

    Also refuses a transform that does not produce every output column. Creates a temporary
    view (and temporary copies of the SQL functions it calls) inside a transaction that is
    always rolled back: nothing persists.

    Args:
        transform: the statement as validated and re-printed by :func:`validate_transform_text`.
        original: the user's text, so that problems are located in it (line and column).
        trusted_functions: the spec's: functions the guard accepts without looking into them.

    Raises:
        TransformError: naming each construct, where it is, and what to do instead.
        SpecError: a column is missing, or the server rejects the statement.
        psycopg.OperationalError: untouched, when the server could not finish the check
            rather than refused the statement: a lock or statement timeout, a serialization
            failure, a deadlock, a lost connection, a lack of memory or disk (callers map the
            retryable ones onto TransientDatabaseError, see core.pg.db.transient_errors).
    """
    # A view takes no parameters: the statement is sent as it is, so % is not doubled.
    query = sqlbuild.input_relation(
        base, base_columns, partition_key, output_columns, transform, filtered=False,
        escape_percent=False, inputs=inputs,
    )
    statement = _CREATE_VIEW.format(view=sql.Identifier(_CHECK_VIEW), query=query)
    try:
        with conn.transaction(force_rollback=True):
            # The re-printed statement is read as pglast read it, whatever the server's default.
            conn.execute(STANDARD_STRINGS)
            # Binary: the extended protocol, which runs one statement and no more.
            conn.execute(statement, binary=True)
            row = conn.execute(_NODE_TREE, {"view": _CHECK_VIEW}).fetchone()
            tree = parse_node_tree(row[0] if row else "()")
            text = statement.as_string(conn).encode("utf-8")
            found, _ = _Guard(conn, [t.name for t in trusted_functions]).check(tree, text)
    except psycopg.errors.UndefinedColumn as err:
        raise SpecError(
            "transform_sql does not produce every needed column "
            f"({', '.join(output_columns)}): {err.diag.message_primary}"
        ) from None
    except psycopg.DatabaseError as err:
        if not_the_statement(err):
            raise  # a timeout, a lost connection...: not the transform's fault, and may pass on a retry
        raise SpecError(f"transform_sql is rejected by the server: {err.diag.message_primary}") from None
    if found:
        offset = text.rfind(transform.encode("utf-8"))
        where = _locator(transform, original if original is not None else transform)
        raise TransformError([
            TransformProblem(f.kind, f.construct, *where(None if f.location is None or offset < 0
                                                         else f.location - offset), f.problem, f.instead)
            for f in found
        ])


# How deep the guard follows SQL functions that call SQL functions; deeper ones are refused.
MAX_FUNCTION_DEPTH = 8
_LABELS = {"i": "IMMUTABLE", "s": "STABLE", "v": "VOLATILE"}


class _Guard:
    """The rules of core.engines.postgres.guard.determinism over an analysed tree, and the judgement of each function
    outside pg_catalog that the tree calls, remembered for the rest of one check."""

    def __init__(self, conn: psycopg.Connection, trusted: Collection[str]) -> None:
        self.conn = conn
        self.trusted = frozenset(trusted)
        self.verdicts: dict[int, str | None] = {}  # function OID -> why it is refused, or None

    def check(self, tree: object, text: bytes, stack: tuple[int, ...] = (),
              first_row_of: Body | None = None) -> tuple[list[Finding], set[int]]:
        """The findings of ``tree`` (``text``: the statement analysed), and the functions of
        ``stack`` (the SQL functions being judged) that were assumed to pass (a recursion).
        ``first_row_of``: the body of a function that returns the first row of its last query."""
        catalog = read_catalog(self.conn, tree)
        found = findings(tree, catalog, text)
        refused_first_row = first_row(first_row_of, catalog) if first_row_of is not None else None
        if refused_first_row is not None:
            found.append(refused_first_row)
        assumed: set[int] = set()
        for node in nodes(tree):
            for oid, what in called(node, catalog):
                fn = catalog.function(oid)
                # The volatility rule refuses a function that is not IMMUTABLE, trusted or not.
                if fn is None or fn.builtin or fn.volatility != "i" or fn.trust_name in self.trusted:
                    continue
                why, hit = self._verdict(oid, fn, stack)
                assumed |= hit
                if why is not None:
                    found.append(_untrusted(fn, what, why, location(node)))
        return in_order(found), assumed

    def _verdict(self, oid: int, fn: Function, stack: tuple[int, ...]) -> tuple[str | None, set[int]]:
        """Why ``fn`` is refused (None: it is not), and the functions of ``stack`` assumed to pass."""
        if oid in self.verdicts:
            return self.verdicts[oid], set()
        if oid in stack:
            # A recursion adds no other construct: the rest of the cycle decides.
            return None, {oid}
        if len(stack) >= MAX_FUNCTION_DEPTH:
            return (f"labelled IMMUTABLE, but the guard reads SQL functions only {MAX_FUNCTION_DEPTH} "
                    "calls deep, and this one is deeper"), set()
        why, assumed = self._judge(oid, fn, (*stack, oid))
        assumed.discard(oid)
        # A pass that assumed a caller passes is not final: that caller may still be refused.
        if why is not None or not assumed:
            self.verdicts[oid] = why
        return why, assumed

    def _judge(self, oid: int, fn: Function, stack: tuple[int, ...]) -> tuple[str | None, set[int]]:
        if fn.kind == "a":
            return self._aggregate(oid, stack)
        if fn.language != "sql":
            return (f"written in {fn.language}, which the guard cannot read: PostgreSQL does not check "
                    "its IMMUTABLE label, so it may read a table, the clock or a setting"), set()
        body = analyse_body(self.conn, oid)
        if isinstance(body, str):
            return body, set()
        read = relations_read(self.conn, body)
        if read:
            return (f"labelled IMMUTABLE, but its body reads {', '.join(read)}: a table is state "
                    "outside the snapshot, which can change between runs"), set()
        found, assumed = self.check(body.tree, body.text, stack, None if fn.returns_set else body)
        if found:
            return "labelled IMMUTABLE, but its body is refused: " + "; ".join(f.problem for f in found), assumed
        return None, assumed

    def _aggregate(self, oid: int, stack: tuple[int, ...]) -> tuple[str | None, set[int]]:
        """An aggregate (always IMMUTABLE in pg_proc) is judged by its support functions."""
        support = aggregate_support(self.conn, oid)
        functions = read_functions(self.conn, [f for f, _ in support])
        problems: list[str] = []
        assumed: set[int] = set()
        for support_oid, role in support:
            fn = functions.get(support_oid)
            if fn is None:
                continue
            if fn.volatility != "i":
                problems.append(f"its {role} function {fn.qualified} is "
                                f"{_LABELS.get(fn.volatility, fn.volatility)}, not IMMUTABLE")
                continue
            if fn.builtin or fn.trust_name in self.trusted:
                continue
            why, hit = self._verdict(support_oid, fn, stack)
            assumed |= hit
            if why is not None:
                problems.append(f"its {role} function {fn.qualified} is {why}")
        return ("an aggregate, and " + "; ".join(problems) if problems else None), assumed


def _untrusted(fn: Function, what: str, why: str, loc: int | None) -> Finding:
    return Finding(
        "untrusted", fn.qualified, loc, f"{fn.qualified}{what} is {why}",
        "if you know its result depends on its arguments alone, list it in the spec: "
        f"trusted_functions: [{{name: {fn.trust_name}, reason: \"why its result depends on its arguments "
        "alone\"}]; otherwise compute the value from the source's columns with built-in IMMUTABLE functions",
    )


def _locations(text: str) -> list[tuple[str, int]]:
    """(node type, byte offset) of every located node of the raw parse tree, in order."""
    out: list[tuple[str, int]] = []

    def walk(value: object, kind: str) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("location"), int) and value["location"] >= 0:
                out.append((kind, value["location"]))
            for key, item in value.items():
                walk(item, key if key[:1].isupper() else kind)
        elif isinstance(value, list):
            for item in value:
                walk(item, kind)

    walk(json.loads(pglast.parser.parse_sql_json(text)), "")
    return out


def _locator(reprinted: str, original: str):
    """Map a byte offset in the re-printed transform to (line, column, snippet) of the
    user's text. The two parse to the same tree, so their located nodes pair up in order;
    where they do not, positions are given in the re-printed text."""
    ours, theirs = _locations(reprinted), _locations(original)
    if [k for k, _ in ours] != [k for k, _ in theirs]:
        original, theirs = reprinted, ours
    pairs = sorted(zip((o for _, o in ours), (t for _, t in theirs)))
    data = original.encode("utf-8")

    def where(offset: int | None) -> tuple[int | None, int | None, str]:
        if offset is None or offset < 0:
            return None, None, ""
        exact = [t for r, t in pairs if r == offset]
        before = [(r, t) for r, t in pairs if r <= offset]
        target = exact[0] if exact else (before[-1][1] + offset - before[-1][0] if before else offset)
        target = min(max(target, 0), len(data))
        head = data[:target].decode("utf-8", "replace")
        line = head.count("\n") + 1
        column = len(head) - (head.rfind("\n") + 1) + 1
        rest = data[target:].decode("utf-8", "replace").split("\n", 1)[0].strip()
        return line, column, rest[:40] + ("..." if len(rest) > 40 else "")

    return where


class PostgresGuard:
    """The PostgreSQL guard as a target's inspection asks it (core.context.TransformGuard)."""

    def parsed(self, text: str, inputs: Collection[str] = ()) -> str:
        return validate_transform_text(text, inputs)

    def check(self, conn: psycopg.Connection, spec: Spec, inspection: Inspection, transform: str | None) -> None:
        """The columns, relations and functions the transform reads (the inputs' too), against the catalog."""
        if transform is not None:
            validate_transform_in_catalog(
                conn, spec.source_ref, [c.name for c in inspection.source_columns],
                spec.partition_key, spec.input_columns, transform, original=spec.transform_sql,
                trusted_functions=spec.trusted_functions, inputs=input_reads(conn, spec, None, None),
            )


GUARD = PostgresGuard()
