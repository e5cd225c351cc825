"""The determinism guard of ``transform_sql``: rules over the server's analysed query tree.

A transform must give the same rows from the same snapshot on every run: after a VACUUM,
under another plan, on another server, as another role. Both builds read one snapshot in
one physical order, so building twice cannot catch a result that depends on that order or
on the session; these rules refuse such constructs before anything is built. They read the
tree the server resolved (``core.engines.postgres.guard.querytree``), so every function, aggregate, window, type
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

The volatility and session rules are here; the order and equal-but-different rules are in
``core.engines.postgres.guard.roworder``; the catalog facts they read and the ``Finding`` they report are in
``core.engines.postgres.guard.catalog`` (re-exported here, where ``core.engines.postgres.guard.transform`` imports them).

Set-returning functions are allowed: an IMMUTABLE one returns the same rows in the same
order for the same arguments, and the volatility rule refuses the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from backfill_assets.core.engines.postgres.guard.catalog import (
    FUNCTION_FIELDS,
    OPERATOR_NODES,
    SORT_GROUP_OPERATORS,
    Catalog,
    Finding,
)
from backfill_assets.core.engines.postgres.guard.querytree import Node, as_int, expr_type, location, nodes
from backfill_assets.core.engines.postgres.guard.roworder import query_order

REG_TYPES = {2205, 2206, 2202, 2203, 2204, 4089, 4096, 3734, 3769, 4191, 24}
CLOCK_WORDS = ("now", "today", "tomorrow", "yesterday")


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
            out += query_order(query, catalog)
    return in_order(out)


def in_order(found: Iterable[Finding]) -> list[Finding]:
    """One finding per construct and place, in the order they appear in the statement."""
    unique = {(f.kind, f.construct, f.location): f for f in found}
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
        for oid, what in called(node, catalog):
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


_SUPPORT = " (a sort, merge or hash support function of the operator family of an operator it uses)"


def called(node: Node, catalog: Catalog) -> Iterator[tuple[int, str]]:
    """(function OID, how it is called) for every function a node makes the server call:
    its functions, its operators' functions, and the support functions of their btree and
    hash operator families, which sorting, merging, hashing and row comparison call instead
    of the operator's own function (a user's operator class may pair a built-in operator
    with a comparison or hash function of its own)."""
    kind = node["@"]
    for f in FUNCTION_FIELDS:
        if as_int(node.get(f), 0) > 0:
            yield as_int(node[f]), " (the window frame's RANGE offset)" if "InRange" in f else ""
    operators: list[tuple[int, str]] = []
    if kind in OPERATOR_NODES:
        operators.append((as_int(node["opno"]), " (an operator's function)"))
    if kind == "ROWCOMPAREEXPR":
        operators += [(as_int(op), " (a row comparison's function)") for op in node.get("opnos") or []]
    if kind == "SORTGROUPCLAUSE":
        operators += [(as_int(node.get(f), 0), " (a sort or grouping operator's function)")
                      for f in SORT_GROUP_OPERATORS]
    for op, what in operators:
        fn = catalog.operator_functions.get(op)
        if fn:
            yield fn, what
        for support in catalog.operator_support.get(op, ()):
            yield support, _SUPPORT
    if kind == "MINMAXEXPR":
        for support in catalog.type_comparison.get(as_int(node.get("minmaxtype"), 0), ()):
            yield support, " (the comparison support function GREATEST or LEAST calls)"
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
        elif kind == "CONST" and as_int(node["consttype"]) in catalog.clock_read:
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

