"""The guard of ``transform_sql`` in DuckDB's dialect: what DuckDB's own parser and binder show.

A transform reshapes the pinned snapshot, the relation ``source``, before newest-wins; the
two builds of a partition must be bit-identical, so the transform must give the same rows
from the same snapshot on every run. Building twice cannot catch a construct that depends on
the order rows arrive in, on the clock or on the session, when both builds share them: this
guard refuses such constructs before anything is built. What it cannot prove is refused.

It reads three things, from a private in-memory DuckDB that holds nothing but an empty,
typed ``source`` (nothing the user wrote is executed):

1. the parse tree (``json_serialize_sql``), for the shape and the names;
2. the bound plan (``json_serialize_plan``), for what the binder chose: each function's
   variant, each cast (implicit ones too), the types of GROUP BY keys and DISTINCT targets;
3. the plan of a probe, the statement with each checked aggregate's argument wrapped in a
   no-op ``greatest(...)``, whose position names the aggregate: the type it aggregates.

Refused, as a :class:`SpecError` (the shape, checked first):

- anything but exactly one SELECT (INSERT, COPY, PRAGMA, SET, ATTACH, CREATE, PIVOT, EXPLAIN,
  DESCRIBE/SHOW/SUMMARIZE, a data-modifying CTE), a parameter, WITH RECURSIVE;
- a relation other than ``source`` or a CTE of the statement, a schema- or catalog-qualified
  table, a table function (``read_parquet``, ``range``, ``glob``, ``duckdb_tables`` ...), time
  travel (``AT (...)``), ``USING SAMPLE`` and ``TABLESAMPLE``.

Refused, as a :class:`TransformError` listing each construct with its place (the kinds of
:class:`TransformProblem`):

- **volatility**: a function DuckDB labels VOLATILE or with side effects (``random``,
  ``uuid``, ``nextval`` ...), or CONSISTENT_WITHIN_QUERY for the variant bound (``now``,
  ``current_date``, ``get_current_timestamp``, one-argument ``age`` (labelled CONSISTENT,
  but it reads the clock) ...): only CONSISTENT functions are allowed.
- **session**: values of the session, settings, environment or catalog, by name whatever
  their label (``current_setting``, ``getenv``, ``current_user``, ``current_schema``,
  ``version``, ``duckdb_*``, ``pragma_*`` ...), including the keywords DuckDB binds as
  functions (``CURRENT_DATE``, ``USER`` ...: an unqualified column of that name is refused
  too); variants over TIMESTAMP WITH TIME ZONE (``year(ts)``, ``date_trunc('day', ts)``,
  ``strftime(ts, ...)``) and casts between time zone types and others (implicit ones too:
  ``ts > '2024-01-01'``), which read the TimeZone setting. A string literal with an explicit
  UTC offset may be cast.
- **order**: LIMIT and OFFSET (even with ORDER BY: the guard does not try to prove an order
  total), DISTINCT ON, POSITIONAL and ASOF joins, ``rowid``; aggregates that pick a row or
  sketch (``first``, ``last``, ``any_value``, ``arbitrary``, ``arg_min``/``arg_max``/
  ``min_by``/``max_by`` (ties), ``mode``, ``approx_quantile``, ``json_group_array`` ...);
  ``list``/``array_agg``/``string_agg``/``group_concat``/``listagg`` unless their ORDER BY
  includes the aggregated value (ARRAY(subquery) is one of them); the window functions
  ``row_number``, ``first_value``, ``last_value``, ``nth_value``, ``lag``, ``lead``,
  ``ntile``, ``fill`` (``rank``, ``dense_rank``, ``percent_rank``, ``cume_dist`` give ties
  one value and are allowed); an aggregate over a ROWS frame other than the whole partition.
- **equal-but-different**: sums, averages, products and statistics computed in FLOAT or
  DOUBLE (``sum``, ``avg``, ``fsum``, ``stddev*``, ``var*``, ``corr``, ``covar*``,
  ``regr_*``, ``entropy``, ``geomean`` ...): the result depends on the order of additions,
  which parallel aggregation does not fix. Where rows are collapsed or ordered by equality,
  values that compare equal but print differently (-0.0 and 0.0, INTERVAL '1 month' and
  '30 days', 'a' and 'A' under a collation): GROUP BY keys, DISTINCT, UNION, INTERSECT,
  EXCEPT, and ``min``/``max``/``median``/``quantile*``/``histogram``/list aggregates over
  such types. An aggregated value whose type the guard cannot learn is refused.
- **untrusted**: a function DuckDB's catalog does not list (a user's macro, an extension's
  function), an aggregate or window function the guard does not know, a variant the guard
  cannot tell, and any construct of the parse tree the guard does not recognise.

The guard judges functions as a fresh DuckDB has them: the connection that runs the
transform must not define macros or functions of the same names (a macro in its default
schema would shadow a built-in), and must run both builds with the same settings.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import duckdb
from psycopg import sql

from backfill_assets.core.errors import SpecError, TransformError, TransformProblem

_SOURCE = "source"

_Node = dict[str, Any]

_NO_LOCATION = 2**64 - 1
_CONFIG = {
    # No file, network or Python variable is reachable, and no extension is installed or loaded.
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
}

# --- names ----------------------------------------------------------------------------------

_CLOCK_FUNCTIONS = frozenset({
    "now", "today", "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "get_current_time", "get_current_timestamp", "current_localtime", "current_localtimestamp",
    "transaction_timestamp", "statement_timestamp", "clock_timestamp",
})

_SESSION_FUNCTIONS = {
    "current_setting": "a setting of the session", "getvariable": "a variable of the session",
    "getenv": "the environment of the process", "current_user": "the user", "session_user": "the user",
    "user": "the user", "current_role": "the role", "current_schema": "the search path",
    "current_schemas": "the search path", "in_search_path": "the search path",
    "current_database": "the database attached", "current_catalog": "the database attached",
    "current_query": "the text of the running query", "current_query_id": "the running query",
    "current_connection_id": "the connection", "current_transaction_id": "the transaction",
    "txid_current": "the transaction", "version": "the DuckDB version", "platform": "the platform",
    "user_agent": "the client", "get_block_size": "the database file", "database_size": "the database file",
    "which_secret": "the secrets of the session", "stats": "the optimizer's statistics",
    "pg_postmaster_start_time": "the time the database started", "pg_conf_load_time": "the configuration",
    "pg_has_role": "the role", "pg_my_temp_schema": "the catalog", "pg_is_other_temp_schema": "the catalog",
    "obj_description": "the catalog", "col_description": "the catalog", "shobj_description": "the catalog",
    "pg_get_viewdef": "the catalog", "pg_get_constraintdef": "the catalog", "pg_get_expr": "the catalog",
    "inet_client_addr": "the client's address", "inet_client_port": "the client's port",
    "inet_server_addr": "the server's address", "inet_server_port": "the server's port",
}
_SESSION_PATTERN = re.compile(r"(duckdb_|pragma_).*|has_.*_privilege|pg_.*_is_visible")

# Keywords DuckDB binds as functions when no column of that name is in scope.
_VALUE_FUNCTIONS = frozenset({
    "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "current_user", "current_role", "session_user", "user", "current_schema", "current_catalog",
})

# Functions the parser produces that DuckDB's catalog does not list as scalar or aggregate.
_NOT_IN_CATALOG = frozenset({"unnest"})

_PICK_AGGREGATES = frozenset({
    "first", "last", "any_value", "arbitrary", "arg_min", "arg_max", "argmin", "argmax", "arg_min_null",
    "arg_max_null", "arg_min_nulls_last", "arg_max_nulls_last", "min_by", "max_by", "mode",
})
_SKETCH_AGGREGATES = frozenset({"approx_quantile", "reservoir_quantile", "approx_top_k", "lttb"})
_UNORDERED_COLLECTORS = frozenset({
    "json_group_array", "json_group_object", "json_group_structure", "variant_group_array", "variant_group_object",
})
_LIST_AGGREGATES = frozenset({"list", "array_agg", "string_agg", "group_concat", "listagg"})
_SUM_AGGREGATES = frozenset({
    "sum", "sum_no_overflow", "avg", "mean", "favg", "fsum", "sumkahan", "kahan_sum", "product",
    "weighted_avg", "wavg",
})
_REGRESSIONS = frozenset({
    "regr_avgx", "regr_avgy", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy",
})
_STATISTIC_AGGREGATES = frozenset({
    "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "sem", "corr", "covar_pop",
    "covar_samp", "kurtosis", "kurtosis_pop", "skewness", *_REGRESSIONS,
})
_FLOAT_ONLY_AGGREGATES = frozenset({"entropy", "geomean", "geometric_mean"})
_VALUE_AGGREGATES = frozenset({
    "min", "max", "histogram", "histogram_exact", "median", "quantile", "quantile_cont", "quantile_disc", "mad",
})
_SAFE_AGGREGATES = frozenset({
    "count", "count_star", "count_if", "countif", "bool_and", "bool_or", "bit_and", "bit_or", "bit_xor",
    "bitstring_agg", "approx_count_distinct", "regr_count",
})
_TWO_VALUE_AGGREGATES = frozenset({"corr", "covar_pop", "covar_samp", "weighted_avg", "wavg", *_REGRESSIONS})
# Macros of DuckDB's catalog that aggregate.
_AGGREGATE_MACROS = frozenset({"weighted_avg", "wavg", "geomean", "geometric_mean", *_UNORDERED_COLLECTORS})
_TYPED = _SUM_AGGREGATES | _STATISTIC_AGGREGATES | _VALUE_AGGREGATES | _LIST_AGGREGATES

_ORDER_WINDOWS = frozenset({"row_number", "first_value", "last_value", "nth_value", "lag", "lead", "ntile", "fill"})
_RANK_WINDOWS = frozenset({"rank", "dense_rank", "rank_dense", "percent_rank", "cume_dist"})

# Parse-tree classes of expressions that need no rule of their own (their parts are walked).
_PLAIN_CLASSES = frozenset({
    "CONSTANT", "OPERATOR", "COMPARISON", "CONJUNCTION", "CASE", "CAST", "BETWEEN", "STAR", "SUBQUERY",
    "COLLATE", "LAMBDA", "POSITIONAL_REFERENCE", "TYPE",
})
_QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE"})
_MODIFIERS = frozenset({"ORDER_MODIFIER", "LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER", "DISTINCT_MODIFIER"})
_TABLE_REFS = frozenset({"BASE_TABLE", "JOIN", "SUBQUERY", "EXPRESSION_LIST", "EMPTY", "TABLE_FUNCTION", "SHOW_REF"})
_JOIN_KINDS = frozenset({"REGULAR", "NATURAL", "CROSS", "DEPENDENT"})

_FLOATS = frozenset({"FLOAT", "DOUBLE"})
_INEXACT = _FLOATS | {"INTERVAL"}
# A time stamp literal with an explicit UTC offset, which needs no TimeZone setting to read.
_OFFSET_LITERAL = re.compile(r".*\d:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|UTC|[+-]\d{1,2}(:?\d{2}){0,2})",
                             re.IGNORECASE | re.DOTALL)
_SAMPLE_WORDS = re.compile(rb"\bUSING\s+SAMPLE\b|\bTABLESAMPLE\b", re.IGNORECASE)
_TYPE_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_ ]*(\(\d+(,\s*\d+)?\))?")

_CONSTANT_INSTEAD = "take the value from a source column, or write it as a constant literal"
_TZ_INSTEAD = ("work on TIMESTAMP values (make_timestamp(epoch_us(ts)) is the UTC time stamp of a TIMESTAMP "
               "WITH TIME ZONE, and depends on no setting), and write literals with an explicit UTC offset")
_EXACT_INSTEAD = ("cast the value to an exact type first: DECIMAL(p,s) for numbers, VARCHAR for intervals "
                  "(CAST(x AS VARCHAR) tells -0.0 from 0.0 and '1 month' from '30 days'), lower(x) for "
                  "case-insensitive text")


@dataclass(frozen=True)
class _Found:
    """A construct refused, at a byte offset of the user's text (None: the guard cannot place it)."""

    kind: str
    construct: str
    location: int | None
    problem: str
    instead: str


def check_duck_transform(text: str, source_columns: Sequence[tuple[str, str]]) -> str:
    """Parse ``text`` with DuckDB's own parser and apply the rules; return the statement
    re-printed by DuckDB (one statement, no comments).

    ``source_columns``: (name, DuckDB type text such as 'BIGINT', 'VARCHAR', 'DECIMAL(12,2)',
    'TIMESTAMP WITH TIME ZONE') of ``source``.

    Raises:
        SpecError: it does not parse, is not exactly one SELECT, or reads another relation
            (or it does not bind against ``source``).
        TransformError: constructs that can change its rows between runs, each a
            :class:`TransformProblem`, with its line and column in ``text``.
    """
    with closing(duckdb.connect(config=_CONFIG)) as conn:
        catalog = _Catalog.read(conn)
        _create_source(conn, source_columns)
        parsed, found = _examine(conn, text, catalog)
        if found:
            raise TransformError(_problems(found, _Locator(text)))
        return _reprint(conn, parsed, text, catalog)


def _examine(conn: duckdb.DuckDBPyConnection, text: str, catalog: _Catalog) -> tuple[_Node, list[_Found]]:
    """The parse tree of ``text`` and what the rules refuse in it (SpecError: its shape)."""
    locate = _Locator(text)
    parsed = _parse(conn, text, locate)
    _check_shape(parsed, locate)
    rules = _Rules(catalog, locate)
    found = rules.check(parsed)
    plan = _plan(conn, text)
    if isinstance(plan, str):
        if found:  # what the parse tree shows is refused already; the rest needs a plan
            return parsed, found
        raise SpecError(f"transform_sql is rejected by DuckDB against {_SOURCE} ({_source_columns(conn)}): {plan}")
    found += _new_places(_plan_findings(plan, catalog, _group_places(parsed)), found)
    found += rules.judge_types(_probe(conn, parsed, catalog), found)
    return parsed, found


# --- the text, the parse tree, the plan --------------------------------------------------------


class _Locator:
    """Byte offsets of DuckDB's trees -> line, column and snippet of the user's text."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")

    def where(self, offset: int | None) -> tuple[int | None, int | None, str]:
        if offset is None or offset < 0 or offset > len(self.data):
            return None, None, ""
        head = self.data[:offset].decode("utf-8", "ignore")
        line = head.count("\n") + 1
        column = len(head) - (head.rfind("\n") + 1) + 1
        rest = self.data[offset:].decode("utf-8", "replace").split("\n", 1)[0].strip()
        return line, column, rest[:40] + ("..." if len(rest) > 40 else "")

    def describe(self, offset: int | None) -> str:
        line, column, snippet = self.where(offset)
        if line is None:
            return ""
        return f" at line {line}, column {column}" + (f" (`{snippet}`)" if snippet else "")

    def pattern(self, pattern: re.Pattern[bytes]) -> int | None:
        """Where ``pattern`` first matches (to place a clause the tree does not place)."""
        found = pattern.search(self.data)
        return found.start() if found else None

    def keyword_before(self, offset: int | None, word: str) -> int | None:
        """Where the last ``word`` (a keyword) before ``offset`` starts, else ``offset``."""
        if offset is None:
            return None
        found = self.data[:offset].upper().rfind(word.encode())
        return found if found >= 0 else offset


def _problems(found: Sequence[_Found], locate: _Locator) -> list[TransformProblem]:
    unique = {(f.kind, f.construct, f.location): f for f in found}
    ordered = sorted(unique.values(), key=lambda f: (f.location is None, f.location or 0, f.construct))
    return [TransformProblem(f.kind, f.construct, *locate.where(f.location), f.problem, f.instead) for f in ordered]


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


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _located(node: _Node, where: int | None) -> int | None:
    location = node.get("query_location")
    return location if isinstance(location, int) and location != _NO_LOCATION else where


def _nodes(value: Any, where: int | None = None) -> Iterator[tuple[_Node, int | None]]:
    """Every node of a DuckDB tree (a dict with a class or a type name), with the nearest
    location: its own, or that of the closest ancestor that has one."""
    if isinstance(value, dict):
        where = _located(value, where)
        if "class" in value or "expression_class" in value or isinstance(value.get("type"), str):
            yield value, where
        for item in value.values():
            yield from _nodes(item, where)
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item, where)


def _role(node: _Node) -> str:
    """What a parse-tree node is: expression, query, modifier, table, or data."""
    if "class" in node:
        return "expression"
    kind = str(node.get("type"))
    if kind.endswith("_NODE"):
        return "query"
    if kind.endswith("_MODIFIER"):
        return "modifier"
    return "table" if "query_location" in node else "data"


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


def _reprint(conn: duckdb.DuckDBPyConnection, parsed: _Node, original: str, catalog: _Catalog) -> str:
    """The statement as DuckDB prints its parse tree: it must pass the guard too, and give
    the columns (names and types) of the original."""
    row = conn.execute("SELECT json_deserialize_sql(?)", [json.dumps(parsed)]).fetchone()
    text = str(row[0]) if row else ""
    try:
        _, found = _examine(conn, text, catalog)
    except SpecError as err:
        found = [_Found("untrusted", "the re-printed statement", None, str(err), "")]
    columns = _columns(conn, text)
    if found or columns is None or columns != _columns(conn, original):
        listed = "; ".join(f.problem for f in found) or "its columns differ"
        raise SpecError(f"transform_sql is refused: DuckDB re-prints it as another statement ({listed})")
    return text


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


def _bare(value: Any) -> Any:
    """A tree without positions and aliases of expressions: two expressions written alike."""
    if isinstance(value, dict):
        skip = {"query_location", "query_location_length"} | ({"alias"} if "class" in value else set())
        return {k: _bare(v) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        return [_bare(v) for v in value]
    return value


# --- the shape (SpecError) -------------------------------------------------------------------


def _check_shape(parsed: _Node, locate: _Locator) -> None:
    """Exactly one SELECT that reads only ``source`` and its own CTEs."""
    ctes = {entry["key"].lower() for node, _ in _nodes(parsed) for entry in _cte_entries(node)}
    allowed = ctes | {_SOURCE}
    problems: list[str] = []
    for node, where in _nodes(parsed):
        at = locate.describe(where)
        role = _role(node)
        if node.get("sample") is not None:
            at = at or locate.describe(locate.pattern(_SAMPLE_WORDS))
            problems.append(f"USING SAMPLE / TABLESAMPLE{at} is not allowed: a sample picks rows at random")
        if role == "query" and node["type"] not in _QUERY_NODES:
            problems.append(_query_node_problem(node["type"], at))
        elif role == "modifier" and node["type"] not in _MODIFIERS:
            problems.append(f"the clause {node['type']}{at} is not allowed (the guard does not know it)")
        elif role == "table":
            problems += _table_problems(node, at, allowed)
        elif role == "expression" and node["class"] == "PARAMETER":
            problems.append(f"a parameter{at} is not allowed: transform_sql is run as it is written")
    if problems:
        raise SpecError("transform_sql is refused: " + "; ".join(dict.fromkeys(problems)))


def _cte_entries(node: _Node) -> list[_Node]:
    ctes = node.get("cte_map")
    return list(ctes.get("map") or []) if isinstance(ctes, dict) else []


def _query_node_problem(kind: str, at: str) -> str:
    if kind == "RECURSIVE_CTE_NODE":
        return f"WITH RECURSIVE{at} is not allowed (the guard does not check recursive queries)"
    if kind.endswith("_QUERY_NODE"):
        return f"a data-modifying CTE ({kind.removesuffix('_QUERY_NODE')}){at} is not allowed"
    return f"a {kind}{at} is not allowed (the guard does not know it)"


def _table_problems(node: _Node, at: str, allowed: set[str]) -> list[str]:
    kind = node["type"]
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        name = function.get("function_name", "a table function")
        return [(f"it calls the table function {name}{at}: a transform may read only '{_SOURCE}' (table "
                 "functions read files, settings or the catalog, or make rows of their own)")]
    if kind == "SHOW_REF":
        return [f"DESCRIBE, SHOW and SUMMARIZE{at} are not allowed: a transform reads rows of '{_SOURCE}'"]
    if kind not in _TABLE_REFS:
        return [f"the table reference {kind}{at} is not allowed (the guard does not know it)"]
    if kind != "BASE_TABLE":
        return []
    name = node["table_name"]
    problems = []
    if node.get("schema_name") or node.get("catalog_name"):
        qualified = ".".join(p for p in (node.get("catalog_name"), node.get("schema_name"), name) if p)
        problems.append(f"it reads {qualified}{at}: a schema- or catalog-qualified table is a table of the "
                        f"database, not the snapshot; write '{_SOURCE}'")
    elif name.lower() not in allowed:
        problems.append(f"it reads {name}{at}; a transform may read only the snapshot as '{_SOURCE}' "
                        "(other tables are mutable external state)")
    if node.get("at_clause") is not None:
        problems.append(f"time travel (AT ...){at} is not allowed: a transform reads the pinned snapshot")
    return problems


# --- the rules over the parse tree --------------------------------------------------------------


@dataclass(frozen=True)
class _Overload:
    parameters: tuple[str, ...]
    returns: str
    stability: str | None
    side_effects: bool

    @property
    def consistent(self) -> bool:
        return self.stability == "CONSISTENT" and not self.side_effects

    @property
    def zoned(self) -> bool:
        return any(_zoned_name(t) for t in (*self.parameters, self.returns))


class _Catalog:
    """DuckDB's own functions, as ``duckdb_functions()`` of a fresh database lists them."""

    _QUERY = ("SELECT function_name, function_type, stability, has_side_effects, parameter_types, return_type "
              "FROM duckdb_functions() WHERE function_type IN ('scalar', 'aggregate', 'macro', 'window')")

    def __init__(self, rows: Sequence[tuple]) -> None:
        self.kinds: dict[str, set[str]] = {}
        self.scalars: dict[str, list[_Overload]] = {}
        for name, kind, stability, side_effects, parameters, returns in rows:
            self.kinds.setdefault(name.lower(), set()).add(kind)
            if kind == "scalar":
                self.scalars.setdefault(name.lower(), []).append(
                    _Overload(tuple(parameters or ()), str(returns or ""), stability, bool(side_effects)))

    @classmethod
    def read(cls, conn: duckdb.DuckDBPyConnection) -> _Catalog:
        return cls(conn.execute(cls._QUERY).fetchall())

    def known(self, name: str) -> bool:
        return name in self.kinds or name in _NOT_IN_CATALOG

    def aggregate(self, name: str) -> bool:
        return "aggregate" in self.kinds.get(name, set()) or name in _AGGREGATE_MACROS

    def always_volatile(self, name: str) -> bool:
        overloads = self.scalars.get(name, [])
        return bool(overloads) and all(o.stability == "VOLATILE" or o.side_effects for o in overloads)

    def never_consistent(self, name: str) -> bool:
        overloads = self.scalars.get(name, [])
        return bool(overloads) and not any(o.consistent for o in overloads)


def _session_use(name: str) -> str | None:
    """What a function of the session reads (None: it is not one)."""
    if name in _SESSION_FUNCTIONS:
        return _SESSION_FUNCTIONS[name]
    return "the catalog or the session" if _SESSION_PATTERN.fullmatch(name) else None


def _session(name: str, where: int | None) -> _Found:
    return _Found("session", name, where,
                  f"{name} reads {_session_use(name)}, not the data: it differs between sessions, settings, "
                  "machines or versions", _CONSTANT_INSTEAD)


def _clock(name: str, where: int | None) -> _Found:
    return _Found("volatility", name, where,
                  f"{name} reads the clock: every run gets another value",
                  "take the time from a source column, or write the date or time itself (DATE '2024-01-01')")


def _arguments(node: _Node) -> list[_Node]:
    return [a.get("expression", a) for a in node.get("arguments") or []]


def _orders(node: _Node) -> list[_Node]:
    if node.get("class") == "WINDOW":
        return list(node.get("arg_orders") or [])
    return list((node.get("order_bys") or {}).get("orders") or [])


def _typed_arguments(node: _Node, catalog: _Catalog) -> int:
    """How many leading arguments of an aggregate call the guard needs the type of (0: none)."""
    name = str(node.get("function_name", "")).lower()
    if node.get("class") == "FUNCTION" and not catalog.aggregate(name):
        return 0
    if node.get("class") == "WINDOW" and node.get("type") != "WINDOW_AGGREGATE":
        return 0
    if node.get("class") not in ("FUNCTION", "WINDOW") or name not in _TYPED:
        return 0
    return min(2 if name in _TWO_VALUE_AGGREGATES else 1, len(_arguments(node)))


@dataclass(frozen=True)
class _Typed:
    """An aggregate call whose argument types the probe learns."""

    name: str
    location: int | None
    distinct: bool


class _Rules:
    """The rules that the parse tree alone decides, and the aggregates left to be typed."""

    def __init__(self, catalog: _Catalog, locate: _Locator) -> None:
        self.catalog = catalog
        self.locate = locate
        self.found: list[_Found] = []
        self.typed: list[_Typed] = []

    def check(self, parsed: _Node) -> list[_Found]:
        for node, where in _nodes(parsed):
            role = _role(node)
            if role == "expression":
                self._expression(node, where)
            elif role == "modifier":
                self._modifier(node, where)
            elif role == "table" and node["type"] == "JOIN":
                self._join(node, where)
            if _typed_arguments(node, self.catalog):
                self.typed.append(_Typed(str(node["function_name"]).lower(), where, bool(node.get("distinct"))))
        return list(self.found)

    def _expression(self, node: _Node, where: int | None) -> None:
        kind = node["class"]
        if kind == "COLUMN_REF":
            self._column(node, where)
        elif kind == "FUNCTION":
            self._function(node, where)
        elif kind == "WINDOW":
            self._window(node, where)
        elif kind not in _PLAIN_CLASSES:
            self.found.append(_Found(
                "untrusted", f"a {kind} expression", where,
                f"the guard does not know the construct {kind} ({node.get('type')}), so it cannot tell "
                "whether it gives the same rows on every run", "write it with common SQL expressions"))

    def _column(self, node: _Node, where: int | None) -> None:
        names = [str(n).lower() for n in node.get("column_names") or []]
        if len(names) == 1 and names[0] in _VALUE_FUNCTIONS:
            found = _clock(names[0], where) if names[0] in _CLOCK_FUNCTIONS else _session(names[0], where)
            self.found.append(_Found(found.kind, found.construct, where, found.problem,
                                     found.instead + f" (a column named {names[0]} must be qualified: "
                                     f"{_SOURCE}.{names[0]})"))
        if names and names[-1] == "rowid":
            self.found.append(_Found(
                "order", "rowid", where, "rowid numbers rows in the order they were stored, which is not "
                "part of the snapshot", "use the source's own columns (its business key)"))

    def _function(self, node: _Node, where: int | None) -> None:
        name = str(node["function_name"]).lower()
        arguments = _arguments(node)
        if _session_use(name) is not None:
            self.found.append(_session(name, where))
        elif name in _CLOCK_FUNCTIONS or (name == "age" and len(arguments) == 1):
            self.found.append(_clock(f"{name}()" if name == "age" else name, where))
        elif not self.catalog.known(name):
            self.found.append(_Found(
                "untrusted", f"{name}()", where,
                f"{name}() is not a built-in function of DuckDB {duckdb.__version__}: a macro or an extension's "
                "function, whose definition the guard cannot see",
                "use DuckDB's built-in CONSISTENT functions, or write the macro's expression inline"))
        elif self.catalog.always_volatile(name):
            self.found.append(_Found(
                "volatility", f"{name}()", where,
                f"{name}() is VOLATILE in DuckDB (or has side effects): it gives another value on every call",
                "compute the value from the source's columns with CONSISTENT functions (e.g. hash() or md5() "
                "of the business key instead of random() or uuid())"))
        elif self.catalog.never_consistent(name):
            self.found.append(_Found(
                "volatility", f"{name}()", where,
                f"{name}() is CONSISTENT_WITHIN_QUERY in DuckDB, not CONSISTENT: it can change between queries "
                "(the clock, a setting)", "use only functions DuckDB labels CONSISTENT"))
        elif self.catalog.aggregate(name):
            self._aggregate(node, name, where)

    def _window(self, node: _Node, where: int | None) -> None:
        name = str(node["function_name"]).lower()
        if name in _ORDER_WINDOWS:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() numbers or picks rows by their position in the window: rows that tie in its "
                "ORDER BY get their positions in the order they arrive in",
                "use rank() or dense_rank() (tied rows get one value), or leave picking the newest row "
                "to the tool"))
        elif name in _RANK_WINDOWS:
            return
        elif node.get("type") == "WINDOW_AGGREGATE" and self.catalog.aggregate(name):
            self._aggregate(node, name, where)
            self._frame(node, name, where)
        else:
            self.found.append(_Found(
                "untrusted", f"{name}()", where, f"{name}() is a window function the guard does not know",
                "use rank(), dense_rank(), or an aggregate over a RANGE or GROUPS frame"))

    def _frame(self, node: _Node, name: str, where: int | None) -> None:
        start, end = str(node.get("start")), str(node.get("end"))
        whole = start == "UNBOUNDED_PRECEDING" and end == "UNBOUNDED_FOLLOWING"
        if (start.endswith("_ROWS") or end.endswith("_ROWS")) and not whole:
            self.found.append(_Found(
                "order", f"{name}() OVER (ROWS ...)", where,
                "a ROWS frame counts rows by position: rows that tie in the window's ORDER BY fall in or out "
                "of the frame in the order they arrive in",
                "use a RANGE or GROUPS frame (tied rows stay together), or the whole partition"))

    def _aggregate(self, node: _Node, name: str, where: int | None) -> None:
        if name in _PICK_AGGREGATES:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() picks one row's value: which one depends on the order rows arrive in (and on ties)",
                "use min() or max() of the value itself, or GROUP BY it"))
        elif name in _SKETCH_AGGREGATES:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() approximates from a sketch or sample whose contents depend on the order rows arrive in",
                "use an exact aggregate (quantile_disc, count, min, max)"))
        elif name in _UNORDERED_COLLECTORS:
            self.found.append(_Found(
                "order", f"{name}()", where,
                f"{name}() collects values in the order rows arrive in and takes no ORDER BY",
                "collect with list(x ORDER BY x) and convert that (to_json(list(x ORDER BY x)))"))
        elif name in _FLOAT_ONLY_AGGREGATES:
            self.found.append(_Found(
                "equal-but-different", f"{name}()", where,
                f"{name}() computes in DOUBLE over the values in the order they arrive in: the last digits "
                "differ between runs", "compute it from exact DECIMAL sums and counts in an outer query"))
        elif name in _LIST_AGGREGATES:
            self._list(node, name, where)
        elif name not in _TYPED and name not in _SAFE_AGGREGATES:
            self.found.append(_Found(
                "untrusted", f"{name}()", where,
                f"{name}() is an aggregate the guard does not know to be independent of the order rows "
                "arrive in", "use count, sum or avg over exact types, min, max, or list(x ORDER BY x)"))

    def _list(self, node: _Node, name: str, where: int | None) -> None:
        arguments, orders = _arguments(node), _orders(node)
        value = _bare(arguments[0]) if arguments else None
        if value is not None and any(_bare(o.get("expression")) == value for o in orders):
            return
        why = ("its ORDER BY does not include the aggregated value, so values that tie on it come"
               if orders else "without an ORDER BY, they come")
        self.found.append(_Found(
            "order", f"{name}()", where,
            f"{name}() collects values in a list: {why} in the order rows arrive in",
            f"order by the aggregated value itself: {name}(x ORDER BY x)"))

    def _modifier(self, node: _Node, where: int | None) -> None:
        kind = node["type"]
        if kind in ("LIMIT_MODIFIER", "LIMIT_PERCENT_MODIFIER"):
            limit, offset = node.get("limit"), node.get("offset")
            word = "LIMIT" if limit is not None else "OFFSET"
            first = _located(limit if limit is not None else (offset or {}), where)
            self.found.append(_Found(
                "order", word, self.locate.keyword_before(first, word),
                f"which rows {word} keeps depends on the order rows arrive in (the guard does not prove an "
                "ORDER BY total)", "filter with WHERE, or keep rank() OVER (...) = 1 (the tool keeps the "
                "newest row of each key itself)"))
        elif kind == "DISTINCT_MODIFIER" and node.get("distinct_on_targets"):
            first = _located(node["distinct_on_targets"][0], where)
            self.found.append(_Found(
                "order", "DISTINCT ON", self.locate.keyword_before(first, "DISTINCT"),
                "DISTINCT ON keeps the first row of each group in the order rows arrive in (ties in its "
                "ORDER BY)", "GROUP BY the key and aggregate each column deterministically, or leave picking "
                "the newest row to the tool"))

    def _join(self, node: _Node, where: int | None) -> None:
        kind = str(node.get("ref_type"))
        if kind in ("POSITIONAL", "ASOF"):
            self.found.append(_Found(
                "order", f"{kind} JOIN", where,
                f"{_article(kind)} {kind} JOIN pairs rows by their position or nearest match, which depends on "
                "the order rows arrive in (and on ties)", "join on equal keys"))
        elif kind not in _JOIN_KINDS or node.get("ranking_expression") is not None:
            self.found.append(_Found(
                "untrusted", f"a {kind} join", where, f"the guard does not know the join {kind}",
                "use INNER, LEFT, RIGHT, FULL, SEMI, ANTI or CROSS joins"))

    def judge_types(self, types: list[list[_Node | None]], known: Sequence[_Found]) -> list[_Found]:
        """The findings of the typed aggregates, given the types the probe learnt ([]: unknown).
        A call refused already is not refused again for a type the probe could not learn."""
        refused = {f.location for f in known}
        out: list[_Found] = []
        for k, call in enumerate(self.typed):
            learnt = types[k] if k < len(types) else []
            unknown = not learnt or any(t is None for t in learnt)
            if not (unknown and call.location in refused):
                out += _typed_findings(call, learnt)
        return out


def _typed_findings(call: _Typed, learnt: list[_Node | None]) -> list[_Found]:
    name, where = call.name, call.location
    if not learnt or any(t is None for t in learnt):
        return [_Found("equal-but-different", f"{name}()", where,
                       f"the guard could not learn the type {name}() aggregates (DuckDB binds no CTE that the "
                       "statement does not read), so it cannot prove its result exact",
                       "remove CTEs the statement does not read, or cast the argument to an exact type "
                       "(DECIMAL(p,s), BIGINT, VARCHAR)")]
    types = [t for t in learnt if t is not None]
    named = ", ".join(dict.fromkeys(_type_name(t) for t in types))
    if name in _SUM_AGGREGATES | _STATISTIC_AGGREGATES and any(t.get("id") in _FLOATS for t in types):
        instead = ("cast to DECIMAL(p,s) before summing, e.g. sum(CAST(x AS DECIMAL(18,6)))"
                   if name in _SUM_AGGREGATES else
                   "compute it from exact sums (sum(x), sum(x * x), count(x) over DECIMAL values) in an "
                   "outer query")
        return [_Found("equal-but-different", f"{name}()", where,
                       f"{name}() over {named} computes in floating point, adding values in the order rows "
                       "arrive in, which DuckDB's parallel aggregation does not fix: the last digits differ "
                       "between runs", instead)]
    if (name in _VALUE_AGGREGATES | _LIST_AGGREGATES or call.distinct) and any(_inexact(t) for t in types):
        return [_Found("equal-but-different", f"{name}()", where,
                       f"{name}() over {named}: values that compare equal print differently (-0.0 and 0.0, "
                       "INTERVAL '1 month' and '30 days', 'a' and 'A' under a collation), and which one it "
                       "keeps depends on the order rows arrive in", _EXACT_INSTEAD)]
    return []


# --- the probe: the types aggregates aggregate ----------------------------------------------------


def _wrapper(expression: _Node) -> _Node:
    """``greatest(expression)``: the same value and type, in a node the plan keeps a position for."""
    return {
        "class": "FUNCTION", "type": "FUNCTION", "alias": "", "query_location": _NO_LOCATION,
        "function_name": "greatest", "schema": "", "catalog": "", "filter": None,
        "order_bys": {"type": "ORDER_MODIFIER", "orders": []}, "distinct": False, "is_operator": False,
        "export_state": False, "arguments": [{"name": "", "expression": expression}],
        "qualified_name": {"path": ["greatest"]}, "is_legacy_function_call": False,
    }


def _typed_calls(tree: _Node, catalog: _Catalog) -> list[tuple[_Node, int]]:
    return [(node, n) for node, _ in _nodes(tree) if (n := _typed_arguments(node, catalog))]


def _probe(conn: duckdb.DuckDBPyConnection, parsed: _Node, catalog: _Catalog) -> list[list[_Node | None]]:
    """For each typed aggregate call (in the order of the tree), the types of the values it
    aggregates wherever the plan has it, after DuckDB's implicit casts ([]: unknown). All calls
    are probed at once; if that statement does not bind, each call alone."""
    count = len(_typed_calls(parsed, catalog))
    together = _probe_calls(conn, parsed, catalog, range(count))
    if together is not None:
        return together
    alone = [_probe_calls(conn, parsed, catalog, [k]) for k in range(count)]
    return [types[k] if types is not None else [] for k, types in enumerate(alone)]


def _probe_calls(conn: duckdb.DuckDBPyConnection, parsed: _Node, catalog: _Catalog, which: Sequence[int]
                 ) -> list[list[_Node | None]] | None:
    """The types of the calls ``which`` with their arguments wrapped (None: no plan)."""
    probe = copy.deepcopy(parsed)
    calls = _typed_calls(probe, catalog)
    for k in which:
        _wrap(*calls[k])
    row = conn.execute("SELECT json_deserialize_sql(?)", [json.dumps(probe)]).fetchone()
    text = str(row[0]) if row else ""
    reparsed = _typed_calls(_serialized(conn, text), catalog)
    plan = _plan(conn, text)
    if len(reparsed) != len(calls) or isinstance(plan, str):
        return None
    wrappers = {_located(expression, None): k for k in which
                for expression in _arguments(reparsed[k][0])[:reparsed[k][1]]}
    types: list[list[_Node | None]] = [[] for _ in calls]
    for k, aggregated in _wrapped_values(plan, wrappers):
        types[k].append(aggregated)
    return types


def _wrap(node: _Node, count: int) -> None:
    """Wrap the first ``count`` arguments of a call, and the ORDER BY terms equal to them (a
    DISTINCT aggregate must order by its arguments)."""
    for argument in (node.get("arguments") or [])[:count]:
        same = _bare(argument["expression"])
        for term in _orders(node):
            if _bare(term.get("expression")) == same:
                term["expression"] = _wrapper(term["expression"])
        argument["expression"] = _wrapper(argument["expression"])


def _wrapped_values(value: Any, wrappers: dict[int | None, int], aggregated: _Node | None = None
                    ) -> Iterator[tuple[int, _Node | None]]:
    """(call, type of the value its aggregate aggregates) for each wrapper the plan holds."""
    if isinstance(value, list):
        for item in value:
            yield from _wrapped_values(item, wrappers, aggregated)
        return
    if not isinstance(value, dict):
        return
    if value.get("expression_class") in ("BOUND_AGGREGATE", "BOUND_WINDOW"):
        for child in value.get("children") or []:
            yield from _wrapped_values(child, wrappers, child.get("return_type"))
        for key, item in value.items():
            if key != "children":
                yield from _wrapped_values(item, wrappers, None)
        return
    if value.get("expression_class") == "BOUND_FUNCTION" and _function_name(value) == "greatest":
        k = wrappers.get(_located(value, None))
        if k is not None:
            yield k, aggregated
    for item in value.values():
        yield from _wrapped_values(item, wrappers, aggregated)


# --- the rules over the bound plan ------------------------------------------------------------


def _function_name(node: _Node) -> str:
    path = (node.get("qname") or {}).get("path") or []
    return str(path[-1]).lower() if path else ""


def _type_name(t: _Node | None) -> str:
    if not isinstance(t, dict):
        return "an unknown type"
    kind, info = str(t.get("id")), t.get("type_info") or {}
    if kind == "DECIMAL" and "width" in info:
        return f"DECIMAL({info['width']},{info['scale']})"
    if kind == "LIST" and isinstance(info.get("child_type"), dict):
        return _type_name(info["child_type"]) + "[]"
    if kind == "VARCHAR" and info.get("collation"):
        return f"VARCHAR COLLATE {info['collation']}"
    return kind


def _parts(t: _Node) -> Iterator[_Node]:
    """A type and every type inside it (list elements, struct fields, map keys and values)."""
    yield t
    yield from _inner_types(t.get("type_info"))


def _inner_types(value: Any) -> Iterator[_Node]:
    if isinstance(value, dict):
        if "id" in value and "type_info" in value:
            yield from _parts(value)
            return
        for item in value.values():
            yield from _inner_types(item)
    elif isinstance(value, list):
        for item in value:
            yield from _inner_types(item)


def _inexact(t: _Node) -> bool:
    """Whether equal values of the type can print differently."""
    return any(p.get("id") in _INEXACT or (p.get("id") == "VARCHAR" and (p.get("type_info") or {}).get("collation"))
               for p in _parts(t))


def _zoned_name(type_text: str) -> bool:
    return "TIME ZONE" in type_text.upper() or type_text.upper().startswith("TIMESTAMPTZ")


def _zoned(t: _Node | None) -> bool:
    return isinstance(t, dict) and any(_zoned_name(str(p.get("id"))) for p in _parts(t))


def _plan_findings(plan: _Node, catalog: _Catalog, group_places: dict[str, int]) -> list[_Found]:
    """What the binder chose: function variants, casts, and the types rows are collapsed by."""
    found: list[_Found] = []
    for node, where in _nodes(plan):
        if node.get("expression_class") == "BOUND_FUNCTION":
            path = (node.get("qname") or {}).get("path") or []
            if path == ["__cast"]:
                found += _cast(node, where)
            elif len(path) >= 2:
                found += _variant(node, catalog, where)
        kind = node.get("type")
        if kind == "LOGICAL_AGGREGATE_AND_GROUP_BY":
            for key in node.get("groups") or []:
                alias = str(key.get("alias") or "")
                place = _located(key, group_places.get(alias.lower()))
                found += _collapsed(f"GROUP BY {alias or 'key'}", [key.get("return_type")], place)
        elif kind == "LOGICAL_DISTINCT":
            below = (node.get("children") or [{}])[0].get("type", "")
            word = {"LOGICAL_UNION": "UNION", "LOGICAL_EXCEPT": "EXCEPT", "LOGICAL_INTERSECT": "INTERSECT"}
            found += _collapsed(word.get(below, "DISTINCT"),
                                [t.get("return_type") for t in node.get("distinct_targets") or []], None)
        elif kind in ("LOGICAL_INTERSECT", "LOGICAL_EXCEPT"):
            word = kind.removeprefix("LOGICAL_") + (" ALL" if node.get("setop_all") else "")
            found += _collapsed(word, _output_types((node.get("children") or [None])[0]), None)
    return found


def _output_types(operator: _Node | None) -> list[_Node | None]:
    """The column types an operator of the plan gives ([None]: the guard cannot tell)."""
    while isinstance(operator, dict) and operator.get("type") in (
            "LOGICAL_ORDER_BY", "LOGICAL_LIMIT", "LOGICAL_FILTER", "LOGICAL_DISTINCT"):
        operator = (operator.get("children") or [None])[0]
    if isinstance(operator, dict) and operator.get("type") == "LOGICAL_PROJECTION":
        return [e.get("return_type") for e in operator.get("expressions") or []]
    return [None]


def _collapsed(construct: str, types: list[_Node | None], where: int | None) -> list[_Found]:
    if all(isinstance(t, dict) and not _inexact(t) for t in types):
        return []
    named = ", ".join(dict.fromkeys(_type_name(t) for t in types if t is None or _inexact(t)))
    return [_Found("equal-but-different", f"{construct} ({named})", where,
                   f"{construct} collapses rows whose values compare equal, but equal values of {named} can "
                   "print differently (-0.0 and 0.0, INTERVAL '1 month' and '30 days', 'a' and 'A' under a "
                   "collation): which one is kept depends on the order rows arrive in", _EXACT_INSTEAD)]


def _cast(node: _Node, where: int | None) -> list[_Found]:
    """A cast between a time zone type and another reads the session's TimeZone setting."""
    children = node.get("children") or [{}]
    source = ((node.get("arguments") or [None])[0]) or children[0].get("return_type")
    target = node.get("return_type")
    if not isinstance(source, dict) or not isinstance(target, dict) or source.get("id") == "NULL":
        return []
    if not (_zoned(source) or _zoned(target)) or _bare(source) == _bare(target):
        return []
    if _zoned_name(str(source.get("id"))) and _zoned_name(str(target.get("id"))):
        return []
    constant = children[0]
    if constant.get("expression_class") == "BOUND_CONSTANT" and _OFFSET_LITERAL.fullmatch(
            str((constant.get("value") or {}).get("value", "")).strip()):
        return []
    construct = f"CAST({_type_name(source)} AS {_type_name(target)})"
    return [_Found("session", construct, where,
                   f"converting {_type_name(source)} to {_type_name(target)} (written or implicit) reads the "
                   "session's TimeZone setting", _TZ_INSTEAD)]


def _variant(node: _Node, catalog: _Catalog, where: int | None) -> list[_Found]:
    """The variant of a function the binder chose must be CONSISTENT."""
    name = _function_name(node)
    if _session_use(name) is not None:
        return [_session(name, where)]
    if name in _CLOCK_FUNCTIONS:
        return [_clock(name, where)]
    overloads = catalog.scalars.get(name)
    if not overloads:
        return [] if name in catalog.kinds else [_Found(
            "untrusted", f"{name}()", where, f"DuckDB binds {name}(), which its catalog does not list",
            "use DuckDB's built-in CONSISTENT functions")]
    if all(o.consistent for o in overloads):
        return []
    arguments = [a for a in node.get("arguments") or [] if isinstance(a, dict)]
    ids = tuple(str(a.get("id")) for a in arguments)
    exact = [o for o in overloads if o.parameters == ids]
    zoned = any(_zoned(t) for t in (*arguments, node.get("return_type")))
    if exact and all(o.consistent for o in exact):
        return []
    if not exact and not zoned and all(o.zoned for o in overloads if not o.consistent):
        return []
    signature = f"{name}({', '.join(_type_name(a) for a in arguments)})"
    if exact and all(o.stability == "VOLATILE" or o.side_effects for o in exact):
        return [_Found("volatility", signature, where, f"{signature} is VOLATILE in DuckDB",
                       "use only functions DuckDB labels CONSISTENT")]
    if zoned:
        return [_Found("session", signature, where,
                       f"{signature} depends on the session's TimeZone (and Calendar) setting", _TZ_INSTEAD)]
    return [_Found("volatility", signature, where,
                   f"{signature} is not CONSISTENT in DuckDB (or the guard cannot tell which variant DuckDB "
                   "chose): it can change between queries", "use only functions DuckDB labels CONSISTENT")]


def _group_places(parsed: _Node) -> dict[str, int]:
    """Column name -> where a GROUP BY names it (the plan does not place plain column keys)."""
    places: dict[str, int] = {}
    for node, _ in _nodes(parsed):
        for key in node.get("group_expressions") or []:
            names = key.get("column_names") if isinstance(key, dict) else None
            location = _located(key, None) if isinstance(key, dict) else None
            if names and location is not None:
                places.setdefault(str(names[-1]).lower(), location)
    return places


def _new_places(found: list[_Found], known: list[_Found]) -> list[_Found]:
    """Plan findings at a place the parse tree's rules have not already refused."""
    taken = {f.location for f in known if f.location is not None}
    return [f for f in found if f.location is None or f.location not in taken]
