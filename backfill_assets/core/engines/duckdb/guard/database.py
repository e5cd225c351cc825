"""The guard's private in-memory DuckDB: ``source`` as an empty typed table, the parse tree
and the bound plan of a statement, and the columns it gives (nothing the user wrote is executed)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import duckdb
from psycopg import sql

from backfill_assets.core.engines.duckdb.guard.findings import _Locator
from backfill_assets.core.engines.duckdb.guard.nodes import _SOURCE, _article, _Node
from backfill_assets.core.errors import SpecError

_CONFIG = {
    # No file, network or Python variable is reachable, and no extension is installed or loaded.
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
}

_TYPE_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_ ]*(\(\d+(,\s*\d+)?\))?")


def _serialized(conn: duckdb.DuckDBPyConnection, text: str) -> _Node:
    row = conn.execute("SELECT json_serialize_sql(?)", [text]).fetchone()
    return json.loads(row[0]) if row else {"error": True, "error_message": "no answer"}


def _parse(conn: duckdb.DuckDBPyConnection, text: str, locate: _Locator) -> _Node:
    """The parse tree of the one SELECT of ``text`` (SpecError otherwise)."""
    parsed = _serialized(conn, text)
    if parsed.get("error") and parsed.get("error_type") == "parser":
        position = parsed.get("position")
        where = locate.describe(int(position)) if str(position or "").isdigit() else ""
        raise SpecError(f"transform_sql does not parse: DuckDB says {parsed.get('error_message')}{where}")
    if parsed.get("error"):
        try:
            kinds = [s.type.name for s in conn.extract_statements(text)]
        except duckdb.Error as err:
            raise SpecError(f"transform_sql does not parse: DuckDB says {err}") from None
        if len(kinds) != 1:
            raise SpecError(f"transform_sql must be exactly one SELECT statement; it has {len(kinds)}")
        if kinds[0] == "SELECT":
            raise SpecError(f"transform_sql cannot be read by the guard: DuckDB says {parsed.get('error_message')}")
        kind = "PIVOT or UNPIVOT (several statements)" if kinds[0] == "MULTI" else kinds[0]
        raise SpecError(f"transform_sql must be a SELECT; it is {_article(kind)} {kind}")
    if len(parsed["statements"]) != 1:
        raise SpecError(f"transform_sql must be exactly one SELECT statement; it has {len(parsed['statements'])}")
    return parsed


def _create_source(conn: duckdb.DuckDBPyConnection, columns: Sequence[tuple[str, str]]) -> None:
    """``source`` as an empty temporary table of the given columns."""
    if not columns:
        raise SpecError(f"{_SOURCE} has no columns to check transform_sql against")
    listed = []
    for name, type_text in columns:
        try:
            listed.append(sql.SQL("{} {}").format(sql.Identifier(name), type_sql(type_text)))
        except ValueError:
            raise SpecError(f"{_SOURCE} column {name!r} has an unexpected DuckDB type text {type_text!r}") from None
    statement = sql.SQL("CREATE TEMPORARY TABLE {} ({})").format(sql.Identifier(_SOURCE), sql.SQL(", ").join(listed))
    try:
        conn.execute(statement.as_string(None))
    except duckdb.Error as err:
        raise SpecError(f"the columns of {_SOURCE} are not a DuckDB table: {err}") from None


def type_sql(type_text: str) -> sql.SQL:
    """A DuckDB type as DuckDB describes it (``DECIMAL(12,2)``, ``TIMESTAMP WITH TIME ZONE``),
    checked for shape before it goes into a statement (ValueError otherwise)."""
    if not _TYPE_TEXT.fullmatch(type_text):
        raise ValueError(f"unexpected DuckDB type text {type_text!r}")
    return sql.SQL(type_text)


def _plan(conn: duckdb.DuckDBPyConnection, text: str) -> _Node | str:
    """The bound plan of ``text`` before the optimizer (nothing runs), or DuckDB's error."""
    try:
        row = conn.execute("SELECT json_serialize_plan(?, optimize := false)", [text]).fetchone()
    except duckdb.Error as err:
        return str(err)
    plan = json.loads(row[0]) if row else {"error": True, "error_message": "no plan"}
    if plan.get("error"):
        return str(plan.get("error_message", "an unknown error")).split("\n", 1)[0]
    return plan


def _columns(conn: duckdb.DuckDBPyConnection, text: str) -> tuple[list[str], list[str]] | None:
    """The names and types of a SELECT's columns, as DuckDB binds it (nothing runs)."""
    try:
        relation = conn.sql(text)
    except duckdb.Error:
        return None
    return list(relation.columns), [str(t) for t in relation.types]


def _source_columns(conn: duckdb.DuckDBPyConnection) -> str:
    describe = sql.SQL("DESCRIBE {}").format(sql.Identifier(_SOURCE)).as_string(None)
    return ", ".join(str(r[0]) for r in conn.execute(describe).fetchall())
