"""transform_sql: one SELECT reading only the snapshot, whose rows cannot change between runs.

The catalog checks run against one database loaded with the demo source (module scope: each
check is a temporary view in a rolled-back transaction, so checks cannot see each other).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backfill_assets.core.engines.postgres.guard.catalog import referenced
from backfill_assets.core.engines.postgres.guard.querytree import expr_type, parse_node_tree
from backfill_assets.core.engines.postgres.guard.reading import _is_exact
from backfill_assets.core.engines.postgres.guard.transform import validate_transform_in_catalog, validate_transform_text
from backfill_assets.core.errors import SpecError, TransformError, TransientDatabaseError
from backfill_assets.core.pg.db import DatabaseUrl, as_transient, connect
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets_tests.support.specs import make_spec

COLS = "order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note"
TEMPORARY_FUNCTIONS = "SELECT count(*) FROM pg_proc WHERE pronamespace = pg_my_temp_schema()"
SEARCH_PATH = "SELECT current_setting('search_path')"

# Functions outside pg_catalog, labelled IMMUTABLE whether or not they are (see "functions
# outside pg_catalog" below).
USER_FUNCTIONS = [
    # PL/pgSQL: the guard cannot read it.
    "CREATE FUNCTION public.lookup_status(x bigint) RETURNS text LANGUAGE plpgsql IMMUTABLE "
    "AS $$ BEGIN RETURN (SELECT max(r.status) FROM public.orders_raw AS r WHERE r.order_id = x); END $$",
    # SQL with a pure body: as text, as RETURN and as BEGIN ATOMIC (pre-parsed, PostgreSQL 14+).
    "CREATE FUNCTION public.doubled(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 * 2'",
    "CREATE FUNCTION public.doubled_return(x int) RETURNS int LANGUAGE sql IMMUTABLE RETURN doubled_return.x * 2",
    "CREATE FUNCTION public.doubled_atomic(x int) RETURNS int LANGUAGE sql IMMUTABLE "
    "BEGIN ATOMIC SELECT x * 2; END",
    "CREATE FUNCTION public.first_positive(a int[]) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS 'SELECT v FROM unnest(a) AS v WHERE v > 0 -- the array''s order'",
    "CREATE FUNCTION public.calls_pure(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT public.doubled(x) + 1'",
    # Text bodies of several statements, of VALUES, and with a backslash in a literal.
    "CREATE FUNCTION public.two_statements(x int) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS $$SELECT 1; VALUES (x * 2) -- the last gives the result$$",
    "CREATE FUNCTION public.backslash(x text) RETURNS int LANGUAGE sql IMMUTABLE AS $$SELECT length(x || 'a\\b')$$",
    # SQL whose body reads a table, the clock, a random generator or the role.
    "CREATE FUNCTION public.sql_reads_table(x bigint) RETURNS text LANGUAGE sql IMMUTABLE "
    "AS 'SELECT max(r.status) FROM public.orders_raw AS r WHERE r.order_id = x'",
    "CREATE FUNCTION public.atomic_reads_table(x bigint) RETURNS text LANGUAGE sql IMMUTABLE "
    "BEGIN ATOMIC SELECT max(r.status) FROM public.orders_raw AS r WHERE r.order_id = x; END",
    "CREATE FUNCTION public.sql_now(x int) RETURNS boolean LANGUAGE sql IMMUTABLE "
    "AS 'SELECT x > 0 AND now() > ''2000-01-01 00:00:00+00''::timestamptz'",
    "CREATE FUNCTION public.sql_random(x int) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS 'SELECT x + floor(random() * 10)::int'",
    "CREATE FUNCTION public.sql_role(x text) RETURNS text LANGUAGE sql IMMUTABLE AS 'SELECT x || current_user'",
    "CREATE FUNCTION public.sql_today() RETURNS date LANGUAGE sql IMMUTABLE AS $$SELECT 'today'::date$$",
    # A non-SETOF function returns the first row of its last query: here, of a join.
    "CREATE FUNCTION public.first_of_join(x int) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS 'SELECT a + b FROM unnest(ARRAY[x, 1]) AS a, unnest(ARRAY[2, 3]) AS b'",
    # Nested: a SQL function calling a refused one.
    "CREATE FUNCTION public.calls_plpgsql(x bigint) RETURNS text LANGUAGE sql IMMUTABLE "
    "AS 'SELECT upper(public.lookup_status(x))'",
    "CREATE FUNCTION public.calls_sql_now(x int) RETURNS boolean LANGUAGE sql IMMUTABLE "
    "AS 'SELECT public.sql_now(x) OR x = 0'",
    # Recursion: a function calling itself, and two calling each other (pure, and not).
    "CREATE FUNCTION public.fact(n int) RETURNS bigint LANGUAGE sql IMMUTABLE "
    "AS 'SELECT CASE WHEN n <= 1 THEN 1 ELSE n * public.fact(n - 1) END'",
    "CREATE FUNCTION public.is_odd(n int) RETURNS boolean LANGUAGE sql IMMUTABLE AS 'SELECT false'",
    "CREATE FUNCTION public.is_even(n int) RETURNS boolean LANGUAGE sql IMMUTABLE "
    "AS 'SELECT n = 0 OR public.is_odd(n - 1)'",
    "CREATE OR REPLACE FUNCTION public.is_odd(n int) RETURNS boolean LANGUAGE sql IMMUTABLE "
    "AS 'SELECT n <> 0 AND public.is_even(n - 1)'",
    "CREATE FUNCTION public.ping(n int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 0'",
    "CREATE FUNCTION public.pong(n int) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS 'SELECT CASE WHEN n <= 0 THEN floor(random() * 10)::int ELSE public.ping(n - 1) END'",
    "CREATE OR REPLACE FUNCTION public.ping(n int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT public.pong(n)'",
    # An operator and an aggregate implemented by a PL/pgSQL function, and an aggregate
    # implemented by a built-in one.
    "CREATE FUNCTION public.plus_jitter(a int, b int) RETURNS int LANGUAGE plpgsql IMMUTABLE "
    "AS $$ BEGIN RETURN a + b + floor(random() * 2)::int; END $$",
    "CREATE OPERATOR public.<+> (LEFTARG = int, RIGHTARG = int, FUNCTION = public.plus_jitter)",
    "CREATE AGGREGATE public.jitter_sum(int) (SFUNC = public.plus_jitter, STYPE = int)",
    "CREATE AGGREGATE public.plain_sum(int) (SFUNC = int4pl, STYPE = int)",
    # A body whose names resolve under the search_path the function sets for itself.
    "CREATE SCHEMA bfa_other",
    "CREATE FUNCTION bfa_other.tripled(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT x * 3'",
    "CREATE FUNCTION public.with_path(x int) RETURNS int LANGUAGE sql IMMUTABLE SET search_path = bfa_other "
    "AS 'SELECT tripled(x)'",
    # Polymorphic: the server analyses such a body only for the types of a call, so the guard
    # cannot read it.
    "CREATE FUNCTION public.same(x anyelement) RETURNS anyelement LANGUAGE sql IMMUTABLE AS 'SELECT x'",
    # A table a SQL function reads, for the lock tests.
    "CREATE TABLE public.bfa_side (x int)",
    "CREATE FUNCTION public.reads_side(x int) RETURNS int LANGUAGE sql IMMUTABLE "
    "AS 'SELECT x + (SELECT count(*)::int FROM public.bfa_side)'",
]

# Operator classes whose operators' functions are built in or pure SQL, but whose comparison
# and hash support functions (what sorting, hashing, GREATEST and LEAST call) are PL/pgSQL,
# which say when they are called.
SORT_SUPPORT = [
    'CREATE SCHEMA bfa_sort',
    # int, sorted by ORDER BY ... USING a built-in comparison of a non-default operator class
    # (the operators in public: pglast prints USING OPERATOR(schema.op) without OPERATOR()).
    'CREATE FUNCTION bfa_sort.noisy_cmp(a int, b int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ '
    "BEGIN RAISE NOTICE 'noisy_cmp'; RETURN btint4cmp(a, b); END $$",
    'CREATE OPERATOR public.#< (LEFTARG = int, RIGHTARG = int, FUNCTION = int4lt)',
    'CREATE OPERATOR public.#<= (LEFTARG = int, RIGHTARG = int, FUNCTION = int4le)',
    'CREATE OPERATOR public.#= (LEFTARG = int, RIGHTARG = int, FUNCTION = int4eq)',
    'CREATE OPERATOR public.#>= (LEFTARG = int, RIGHTARG = int, FUNCTION = int4ge)',
    'CREATE OPERATOR public.#> (LEFTARG = int, RIGHTARG = int, FUNCTION = int4gt)',
    'CREATE OPERATOR CLASS bfa_sort.noisy_int_ops FOR TYPE int USING btree AS OPERATOR 1 public.#<, '
    'OPERATOR 2 public.#<=, OPERATOR 3 public.#=, OPERATOR 4 public.#>=, OPERATOR 5 public.#>, '
    'FUNCTION 1 bfa_sort.noisy_cmp(int, int)',
    # An enum whose default btree and hash operator classes (DISTINCT, GROUP BY, GREATEST) are these.
    "CREATE TYPE bfa_sort.mood AS ENUM ('sad', 'ok', 'happy')",
    'CREATE FUNCTION bfa_sort.mood_lt(a bfa_sort.mood, b bfa_sort.mood) RETURNS boolean LANGUAGE sql '
    'IMMUTABLE RETURN pg_catalog.enum_lt(a, b)',
    'CREATE FUNCTION bfa_sort.mood_le(a bfa_sort.mood, b bfa_sort.mood) RETURNS boolean LANGUAGE sql '
    'IMMUTABLE RETURN pg_catalog.enum_le(a, b)',
    'CREATE FUNCTION bfa_sort.mood_eq(a bfa_sort.mood, b bfa_sort.mood) RETURNS boolean LANGUAGE sql '
    'IMMUTABLE RETURN pg_catalog.enum_eq(a, b)',
    'CREATE FUNCTION bfa_sort.mood_ge(a bfa_sort.mood, b bfa_sort.mood) RETURNS boolean LANGUAGE sql '
    'IMMUTABLE RETURN pg_catalog.enum_ge(a, b)',
    'CREATE FUNCTION bfa_sort.mood_gt(a bfa_sort.mood, b bfa_sort.mood) RETURNS boolean LANGUAGE sql '
    'IMMUTABLE RETURN pg_catalog.enum_gt(a, b)',
    'CREATE OPERATOR bfa_sort.< (LEFTARG = bfa_sort.mood, RIGHTARG = bfa_sort.mood, FUNCTION = '
    'bfa_sort.mood_lt)',
    'CREATE OPERATOR bfa_sort.<= (LEFTARG = bfa_sort.mood, RIGHTARG = bfa_sort.mood, FUNCTION = '
    'bfa_sort.mood_le)',
    'CREATE OPERATOR bfa_sort.= (LEFTARG = bfa_sort.mood, RIGHTARG = bfa_sort.mood, FUNCTION = '
    'bfa_sort.mood_eq, HASHES, MERGES)',
    'CREATE OPERATOR bfa_sort.>= (LEFTARG = bfa_sort.mood, RIGHTARG = bfa_sort.mood, FUNCTION = '
    'bfa_sort.mood_ge)',
    'CREATE OPERATOR bfa_sort.> (LEFTARG = bfa_sort.mood, RIGHTARG = bfa_sort.mood, FUNCTION = '
    'bfa_sort.mood_gt)',
    'CREATE FUNCTION bfa_sort.mood_cmp(a bfa_sort.mood, b bfa_sort.mood) RETURNS int LANGUAGE '
    "plpgsql IMMUTABLE AS $$ BEGIN RAISE NOTICE 'mood_cmp'; RETURN enum_cmp(a, b); END $$",
    'CREATE FUNCTION bfa_sort.mood_hash(a bfa_sort.mood) RETURNS int LANGUAGE plpgsql IMMUTABLE AS '
    "$$ BEGIN RAISE NOTICE 'mood_hash'; RETURN hashenum(a); END $$",
    'CREATE OPERATOR CLASS bfa_sort.mood_ops DEFAULT FOR TYPE bfa_sort.mood USING btree AS OPERATOR '
    '1 bfa_sort.<, OPERATOR 2 bfa_sort.<=, OPERATOR 3 bfa_sort.=, OPERATOR 4 bfa_sort.>=, OPERATOR 5 '
    'bfa_sort.>, FUNCTION 1 bfa_sort.mood_cmp(bfa_sort.mood, bfa_sort.mood)',
    'CREATE OPERATOR CLASS bfa_sort.mood_hash_ops DEFAULT FOR TYPE bfa_sort.mood USING hash AS '
    'OPERATOR 1 bfa_sort.=, FUNCTION 1 bfa_sort.mood_hash(bfa_sort.mood)',
]


@pytest.fixture(scope="module")
def source_url(admin_url: str) -> Iterator[DatabaseUrl]:
    """The URL of a database of this module's own, dropped afterwards."""
    name = f"bfa_transform_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = conninfo_to_dict(admin_url)
    info["dbname"] = name
    yield DatabaseUrl(make_conninfo(**info), source="the test database")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def source_db(source_url: DatabaseUrl) -> Iterator[psycopg.Connection]:
    """A database with the demo source, a sequence, a domain and user functions, for this module."""
    from backfill_assets.cli import demo

    with connect(source_url, DEFAULT_LIMITS) as conn:
        demo.load(conn)
        conn.execute("CREATE SEQUENCE public.s")
        conn.execute("CREATE FUNCTION public.my_volatile(x int) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT x'")
        conn.execute("CREATE FUNCTION public.my_immutable(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT x'")
        conn.execute("CREATE DOMAIN public.money2 AS numeric(14,2)")
        for statement in [*USER_FUNCTIONS, *SORT_SUPPORT]:
            conn.execute(statement)
        create_chain(conn, CHAIN)
        yield conn


CHAIN = 10  # public.chain0 calls public.chain1, ..., which calls public.chain9


def create_chain(conn: psycopg.Connection, length: int) -> None:
    """SQL functions that call each other ``length`` deep, each with a pure body."""
    for i in reversed(range(length)):
        body = (sql.SQL("SELECT {}(x) + 1").format(sql.Identifier("public", f"chain{i + 1}"))
                if i < length - 1 else sql.SQL("SELECT x"))
        conn.execute(sql.SQL("CREATE FUNCTION {}(x int) RETURNS int LANGUAGE sql IMMUTABLE AS {}").format(
            sql.Identifier("public", f"chain{i}"), sql.Literal(body.as_string(conn))))


def transform_with(expr: str) -> str:
    """A transform_sql text (the user's input, validated before use) with one extra column."""
    return " ".join(["SELECT", COLS + ",", expr, "AS extra FROM source"])


def check(conn: psycopg.Connection, transform: str, trusted: tuple[str, ...] = ()) -> None:
    spec = make_spec(trusted_functions=[{"name": n, "reason": "depends on its arguments alone"} for n in trusted])
    source_cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'public.orders_raw'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum").fetchall()]
    validate_transform_in_catalog(
        conn, spec.source_ref, source_cols, spec.partition_key, spec.input_columns,
        validate_transform_text(transform), original=transform, trusted_functions=spec.trusted_functions,
    )


def refused(conn: psycopg.Connection, transform: str, trusted: tuple[str, ...] = ()) -> TransformError:
    with pytest.raises(TransformError) as err:
        check(conn, transform, trusted)
    # Nothing persists: the temporary view and the functions' temporary copies were rolled back.
    assert conn.execute("SELECT to_regclass('backfill_assets_transform_check')").fetchone()[0] is None
    assert conn.execute(TEMPORARY_FUNCTIONS).fetchone()[0] == 0
    return err.value


# --- shape --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("SELECT 1; SELECT 2", "exactly one SELECT statement; it has 2"),
        ("DELETE FROM source", "must be a SELECT; it is a DELETE"),
        ("WITH d AS (DELETE FROM orders_raw RETURNING *) SELECT * FROM d", "DELETE is not allowed"),
        ("SELECT * INTO x FROM source", "SELECT INTO is not allowed"),
        ("SELECT * FROM source FOR UPDATE", "FOR UPDATE/SHARE is not allowed"),
        ("SELECT * FROM source TABLESAMPLE bernoulli (10)", "TABLESAMPLE is not allowed"),
        ("SELECT * FROM public.orders_raw", "it reads public.orders_raw"),
        ("SELECT s.* FROM source s JOIN customers c ON true", "it reads customers"),
        ("SELEC 1", "does not parse"),
    ],
)
def test_transform_shape_is_refused_by_the_parser(text, message):
    with pytest.raises(SpecError, match=message):
        validate_transform_text(text)


def test_transform_is_reprinted_as_one_statement():
    assert validate_transform_text("select a from source -- comment\n;") == "SELECT a FROM source"


# --- volatility ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr, function",
    [
        ("now()", "now()"),
        ("random()", "random()"),
        ("clock_timestamp()", "clock_timestamp()"),
        ("nextval('s')", "nextval(regclass)"),
        ("my_volatile(1)", "my_volatile(integer)"),
        ("to_char(updated_at, 'YYYY')", "to_char(timestamp with time zone,text)"),
        # An operator is a function too: timestamptz + interval depends on TimeZone.
        ("updated_at + interval '1 day'", "timestamptz_pl_interval(timestamp with time zone,interval)"),
        # An I/O coercion calls the result type's input function, which reads DateStyle...
        ("status::timestamptz", "timestamptz_in(cstring,oid,integer)"),
        # ... and the argument type's output function, which reads TimeZone.
        ("updated_at::text", "timestamptz_out(timestamp with time zone)"),
        ("sum(amount) OVER (ORDER BY clock_timestamp())", "clock_timestamp()"),
        # A RANGE frame's offset on timestamptz calls a STABLE in_range support function.
        ("count(*) OVER (ORDER BY updated_at RANGE BETWEEN interval '1 day' PRECEDING AND CURRENT ROW)",
         "in_range(timestamp with time zone,timestamp with time zone,interval,boolean,boolean)"),
        ("(SELECT max(my_volatile(s2.order_id::int)) FROM source AS s2)", "my_volatile(integer)"),
    ],
)
def test_non_immutable_functions_are_refused_by_the_catalog(source_db, expr, function):
    err = refused(source_db, transform_with(expr))
    assert "not IMMUTABLE" in str(err) and function in str(err)
    assert any(p.kind in {"volatility", "session"} and function in p.construct for p in err.problems)


def test_immutable_transform_with_percent_and_aggregates_is_accepted(source_db):
    check(
        source_db,
        "SELECT order_date, order_id, customer_id % 7 AS customer_id, updated_at, ingest_seq, "
        "round(amount * 1.1, 2) AS amount, upper(status) AS status, note || '%' AS note FROM source",
    )


def test_transform_missing_a_column_is_refused(source_db):
    with pytest.raises(SpecError, match="does not produce every needed column"):
        check(source_db, "SELECT order_date, order_id FROM source")


def test_transform_rejected_by_the_server_is_a_spec_error(source_db):
    with pytest.raises(SpecError, match="rejected by the server"):
        check(source_db, transform_with("no_such_function(1)"))


def test_system_columns_cannot_be_read_through_the_snapshot(source_db):
    # The snapshot is a CTE, which has no system columns: the server refuses ctid and xmin.
    for column in ("ctid", "xmin", "tableoid"):
        with pytest.raises(SpecError, match=f'column "{column}" does not exist'):
            check(source_db, transform_with(column))


# --- functions outside pg_catalog ----------------------------------------------------------
# PostgreSQL does not check an IMMUTABLE label: a function outside pg_catalog is refused unless
# the spec trusts it, or it is written in SQL and its body passes the same rules.

UNTRUSTED = [
    # (expression, the function named, why)
    ("lookup_status(order_id)", "public.lookup_status(bigint)", "is written in plpgsql, which the guard cannot read"),
    ("sql_reads_table(order_id)", "public.sql_reads_table(bigint)", "its body reads public.orders_raw"),
    ("atomic_reads_table(order_id)", "public.atomic_reads_table(bigint)", "its body reads public.orders_raw"),
    ("sql_now(1)", "public.sql_now(integer)", "its body is refused: now() reads the transaction's start time"),
    ("sql_random(1)", "public.sql_random(integer)", "its body is refused: random() reads a random generator"),
    ("sql_role(note)", "public.sql_role(text)", "its body is refused: current_user"),
    ("sql_today()", "public.sql_today()", "its body is refused: the date/time literal 'today' reads the clock"),
    ("first_of_join(1)", "public.first_of_join(integer)", "it returns the first row of its last query"),
    ("calls_plpgsql(order_id)", "public.calls_plpgsql(bigint)",
     "its body is refused: public.lookup_status(bigint) is written in plpgsql"),
    ("calls_sql_now(1)", "public.calls_sql_now(integer)",
     "its body is refused: public.sql_now(integer) is labelled IMMUTABLE, but its body is refused: now()"),
    ("ping(3)", "public.ping(integer)", "public.pong(integer) is labelled IMMUTABLE, but its body is refused: random()"),
    ("order_id::int <+> 1", "public.plus_jitter(integer, integer)", "(an operator's function) is written in plpgsql"),
    ("(SELECT public.jitter_sum(s2.order_id::int ORDER BY s2.order_id::int) FROM source AS s2)",
     "public.jitter_sum(integer)", "its transition function public.plus_jitter(integer, integer) is written in plpgsql"),
    ("same(note)", "public.same(anyelement)", "cannot have polymorphic arguments"),
]


@pytest.mark.parametrize("expr, function, why", UNTRUSTED, ids=[e[:40] for e, _, _ in UNTRUSTED])
def test_functions_outside_pg_catalog_are_refused_unless_seen_to_be_deterministic(source_db, expr, function, why):
    err = refused(source_db, transform_with(expr))
    (problem,) = [p for p in err.problems if p.kind == "untrusted"]
    assert problem.construct == function and why in problem.problem, problem
    assert "trusted_functions: [{name: " + function.split("(")[0] + ", reason: " in problem.instead
    start = transform_with(expr).index(expr) + 1
    assert problem.line == 1 and start <= problem.column < start + len(expr)


SEEN_OR_TRUSTED = [
    # (expression, the functions trusted)
    ("doubled(order_id::int)", ()),
    ("doubled_return(order_id::int)", ()),
    ("doubled_atomic(order_id::int)", ()),
    ("first_positive(ARRAY[order_id::int, 1])", ()),
    ("calls_pure(order_id::int)", ()),
    ("two_statements(order_id::int)", ()),
    ("backslash(note)", ()),
    ("fact(5)", ()),
    ("is_even(order_id::int % 10)", ()),
    ("(SELECT public.plain_sum(s2.order_id::int ORDER BY s2.order_id::int) FROM source AS s2)", ()),
    ("lookup_status(order_id)", ("public.lookup_status",)),
    ("sql_reads_table(order_id)", ("public.sql_reads_table",)),
    ("calls_plpgsql(order_id)", ("public.lookup_status",)),  # the function it calls is trusted
    ("calls_plpgsql(order_id)", ("public.calls_plpgsql",)),  # or the function itself
    ("ping(3)", ("public.pong",)),
    ("order_id::int <+> 1", ("public.plus_jitter",)),
    ("(SELECT public.jitter_sum(s2.order_id::int ORDER BY s2.order_id::int) FROM source AS s2)",
     ("public.plus_jitter",)),
    ("same(note)", ("public.same",)),
]


@pytest.mark.parametrize("expr, trusted", SEEN_OR_TRUSTED, ids=[f"{e[:40]}{list(t)}" for e, t in SEEN_OR_TRUSTED])
def test_functions_seen_to_be_deterministic_or_trusted_are_accepted(source_db, expr, trusted):
    check(source_db, transform_with(expr), trusted)
    assert source_db.execute(TEMPORARY_FUNCTIONS).fetchone()[0] == 0


def test_a_refused_function_is_named_with_why_and_the_yaml_that_trusts_it(source_db):
    transform = transform_with("lookup_status(order_id)")
    err = refused(source_db, transform)
    message = str(err)
    assert "\n" not in message
    assert "public.lookup_status(bigint) at line 1, column 89" in message
    assert "is written in plpgsql, which the guard cannot read" in message
    (problem,) = err.problems
    snippet = problem.instead.split("list it in the spec: ", 1)[1].split("; otherwise", 1)[0]
    trusted = yaml.safe_load(snippet)["trusted_functions"]
    assert trusted == [{"name": "public.lookup_status", "reason": "why its result depends on its arguments alone"}]
    check(source_db, transform, tuple(t["name"] for t in trusted))


def test_a_body_is_read_under_the_search_path_its_function_sets(source_db):
    before = source_db.execute(SEARCH_PATH).fetchone()[0]
    check(source_db, transform_with("with_path(order_id::int)"))
    assert source_db.execute(SEARCH_PATH).fetchone()[0] == before


def test_sql_functions_are_read_to_a_bounded_depth(source_db):
    from backfill_assets.core.engines.postgres.guard.transform import MAX_FUNCTION_DEPTH

    assert (CHAIN, MAX_FUNCTION_DEPTH) == (10, 8)
    err = refused(source_db, transform_with("chain0(1)"))  # 10 deep
    (problem,) = err.problems
    assert problem.construct == "public.chain0(integer)"
    assert "public.chain8(integer) is labelled IMMUTABLE, but the guard reads SQL functions only" in problem.problem
    check(source_db, transform_with("chain2(1)"))  # 8 deep, as deep as the guard reads


# A SQL function's text body is anyone's text: pasted into the copy's BEGIN ATOMIC ... END
# and sent as a simple query, "END;" would end the copy and what follows would run as the tool.
BREAKOUTS = [
    # (body, why it is refused)
    ("SELECT 1; END; DROP TABLE public.bfa_victim; "
     "CREATE FUNCTION pg_temp.bfa_smuggled() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1",
     "the guard cannot read its body, which does not parse"),
    ("SELECT 1; END; DROP TABLE public.bfa_victim; "
     "CREATE FUNCTION public.bfa_smuggled() RETURNS int LANGUAGE sql RETURN 1; SELECT 1",
     "and this one has a TRANSACTION statement, a DROP statement, a CREATE FUNCTION statement"),
    ("SELECT 1; COMMIT; DROP TABLE public.bfa_victim; SELECT 1",
     "and this one has a TRANSACTION statement, a DROP statement"),
    ("WITH d AS (DELETE FROM public.bfa_victim RETURNING x) SELECT count(*)::int FROM d", "this one has DELETE"),
    ("SELECT x INTO public.bfa_copied FROM public.bfa_victim", "this one has SELECT INTO"),
]
_SMUGGLED = "SELECT count(*) FROM pg_proc WHERE proname IN ('bfa_smuggled', 'bfa_breakout_copy')"


@pytest.mark.parametrize("body, why", BREAKOUTS, ids=[b[:50] for b, _ in BREAKOUTS])
def test_a_text_body_cannot_break_out_of_its_analysis(source_db, body, why):
    source_db.execute("CREATE TABLE public.bfa_victim (x int)")
    try:
        # PostgreSQL stores any text as a body when it does not check bodies.
        with source_db.transaction():
            source_db.execute("SET LOCAL check_function_bodies = off")
            source_db.execute(sql.SQL(
                "CREATE FUNCTION public.bfa_breakout(x int) RETURNS int LANGUAGE sql IMMUTABLE AS {}"
            ).format(sql.Literal(body)))
        err = refused(source_db, transform_with("bfa_breakout(1)"))
        (problem,) = err.problems
        assert problem.construct == "public.bfa_breakout(integer)"
        assert "labelled IMMUTABLE, but the guard cannot read its body" in problem.problem and why in problem.problem
        assert "trusted_functions: [{name: public.bfa_breakout, reason: " in problem.instead
        assert "\n" not in str(err)
        # Nothing ran and nothing was committed: the table is there, no function was smuggled
        # in, no copy or view outlived the check, and the session is idle.
        assert source_db.execute("SELECT to_regclass('public.bfa_victim')").fetchone()[0] is not None
        assert source_db.execute("SELECT to_regclass('public.bfa_copied')").fetchone()[0] is None
        assert source_db.execute(_SMUGGLED).fetchone()[0] == 0
        assert source_db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        source_db.execute("DROP FUNCTION IF EXISTS public.bfa_breakout(int)")
        source_db.execute("DROP TABLE IF EXISTS public.bfa_victim")


@pytest.mark.parametrize("table, expr, refusal", [
    ("orders_raw", "1", None),
    ("bfa_side", "reads_side(1)", "public.reads_side(integer) is labelled IMMUTABLE, but its body reads public.bfa_side"),
], ids=["the transform's view", "a SQL function's body"])
def test_a_lock_timeout_is_left_to_the_caller_not_made_a_refusal(source_url, source_db, table, expr, refusal):
    """A lock wait that times out says nothing about the transform: the driver's error goes up
    untouched, and callers map it onto TransientDatabaseError (retryable, exit 8)."""
    transform = transform_with(expr)
    spec = make_spec(lock_timeout_ms=300, transform_sql=transform, records_can_move=False)
    with connect(source_url, DEFAULT_LIMITS) as holder, connect(source_url, spec.limits) as conn:
        with holder.transaction():
            holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier("public", table)))
            with pytest.raises(psycopg.errors.LockNotAvailable) as err:
                check(conn, transform)
        transient = as_transient(err.value, "validating transform_sql")
        assert isinstance(transient, TransientDatabaseError) and transient.lock_wait
        assert conn.execute(TEMPORARY_FUNCTIONS).fetchone()[0] == 0
        # The lock released, the same check finishes: with its verdict, not a timeout.
        if refusal is None:
            check(conn, transform)
        else:
            with pytest.raises(TransformError, match=re.escape(refusal)):
                check(conn, transform)


def test_only_a_failure_to_finish_is_left_to_the_caller():
    from backfill_assets.core.engines.postgres.guard.userfunctions import not_the_statement

    for cls in (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled, psycopg.errors.SerializationFailure,
                psycopg.errors.DeadlockDetected, psycopg.errors.AdminShutdown, psycopg.errors.OutOfMemory,
                psycopg.OperationalError):
        assert not_the_statement(cls("x")), cls
    for cls in (psycopg.errors.SyntaxError, psycopg.errors.UndefinedFunction, psycopg.errors.StatementTooComplex,
                psycopg.errors.InvalidFunctionDefinition):
        assert not not_the_statement(cls("x")), cls


# Sorting, hashing, GREATEST and LEAST call an operator family's comparison and hash support
# functions, not (only) the operators' own: a user's operator class can pair built-in or pure
# operators with a PL/pgSQL comparison or hash function.
SUPPORT = [
    # (expression, the support functions named)
    ("ARRAY(SELECT s2.order_id::int FROM source AS s2 ORDER BY 1 USING #<)",
     {"bfa_sort.noisy_cmp(integer, integer)"}),
    ("(SELECT count(*) FROM (SELECT DISTINCT v.m FROM (VALUES ('sad'::bfa_sort.mood), ('ok')) AS v(m)) AS d)",
     {"bfa_sort.mood_cmp(bfa_sort.mood, bfa_sort.mood)", "bfa_sort.mood_hash(bfa_sort.mood)"}),
    ("(SELECT count(*) FROM (SELECT v.m FROM (VALUES ('sad'::bfa_sort.mood)) AS v(m) GROUP BY v.m) AS g)",
     {"bfa_sort.mood_cmp(bfa_sort.mood, bfa_sort.mood)", "bfa_sort.mood_hash(bfa_sort.mood)"}),
    ("GREATEST('sad'::bfa_sort.mood, 'ok') IS NULL", {"bfa_sort.mood_cmp(bfa_sort.mood, bfa_sort.mood)"}),
]
# The same constructs, run: each calls a PL/pgSQL support function, which says so.
SUPPORT_RUN = [
    ("SELECT ARRAY(SELECT v.x FROM (VALUES (2), (1), (3)) AS v(x) ORDER BY 1 USING #<)",
     "noisy_cmp"),
    ("SELECT count(*) FROM (SELECT DISTINCT v.m FROM (VALUES ('sad'::bfa_sort.mood), ('ok'), ('sad')) AS v(m)) AS d",
     "mood_"),
    ("SELECT GREATEST('sad'::bfa_sort.mood, 'ok')", "mood_cmp"),
]


@pytest.mark.parametrize("statement, notice", SUPPORT_RUN, ids=[n for _, n in SUPPORT_RUN])
def test_sorting_and_hashing_call_the_support_functions(source_db, statement, notice):
    heard: list[str] = []

    def hear(diagnostic: psycopg.errors.Diagnostic) -> None:
        heard.append(diagnostic.message_primary or "")

    source_db.add_notice_handler(hear)
    try:
        source_db.execute(statement).fetchall()
    finally:
        source_db.remove_notice_handler(hear)
    assert any(h.startswith(notice) for h in heard), heard


@pytest.mark.parametrize("expr, functions", SUPPORT, ids=[e[:50] for e, _ in SUPPORT])
def test_sort_and_hash_support_functions_outside_pg_catalog_need_trust(source_db, expr, functions):
    err = refused(source_db, transform_with(expr))
    assert {p.construct for p in err.problems} == functions, err.problems
    assert all(p.kind == "untrusted" and "is written in plpgsql, which the guard cannot read" in p.problem
               and "support function" in p.problem for p in err.problems), [p.problem for p in err.problems]
    check(source_db, transform_with(expr), tuple(sorted({f.split("(")[0] for f in functions})))


def test_trust_does_not_excuse_a_function_labelled_volatile(source_db):
    err = refused(source_db, transform_with("my_volatile(1)"), ("public.my_volatile",))
    assert [p.kind for p in err.problems] == ["volatility"]


EXTENSIONS = [
    # (extension, expression, the functions named): called directly, and by DISTINCT (its
    # type's equality and sort operators, and the comparison and hash support functions of
    # their operator families, which sorting and hashing call).
    ("fuzzystrmatch", "levenshtein(note, 'x')", {"public.levenshtein(text, text)"}),
    ("citext", "(SELECT count(DISTINCT s2.note::public.citext) FROM source AS s2)",
     {"public.citext_eq(citext, citext)", "public.citext_lt(citext, citext)", "public.citext_cmp(citext, citext)",
      "public.citext_hash(citext)", "public.citext_hash_extended(citext, bigint)"}),
    ("vector", "vector_dims('[1,2]'::public.vector)", {"public.vector_dims(vector)"}),
    ("vector", "(SELECT count(DISTINCT v.x) FROM (VALUES ('[1,2]'::public.vector)) AS v(x))",
     {"public.vector_eq(vector, vector)", "public.vector_lt(vector, vector)", "public.vector_cmp(vector, vector)"}),
]


@pytest.mark.parametrize("extension, expr, functions", EXTENSIONS, ids=[e[1][:40] for e in EXTENSIONS])
def test_extension_functions_outside_pg_catalog_need_trust(source_db, extension, expr, functions):
    """Each server has its own extensions: the embedded one vector, Debian's the contrib ones."""
    try:
        with source_db.transaction():
            source_db.execute(sql.SQL("CREATE EXTENSION IF NOT EXISTS {} SCHEMA public").format(
                sql.Identifier(extension)))
    except (psycopg.errors.FeatureNotSupported, psycopg.errors.UndefinedFile):
        pytest.skip(f"this PostgreSQL has no {extension} extension")
    err = refused(source_db, transform_with(expr))
    assert {p.construct for p in err.problems if p.kind == "untrusted"} == functions
    assert all(p.kind == "untrusted" for p in err.problems)
    assert "is written in c, which the guard cannot read" in str(err)
    check(source_db, transform_with(expr), tuple(f.split("(")[0] for f in functions))


# --- session, role, transaction, clock ------------------------------------------------------

SESSION = [
    ("current_user", "current_user"),
    ("session_user", "session_user"),
    ("current_role", "current_role"),
    ("current_schema", "current_schema"),
    ("current_catalog", "current_catalog"),
    ("current_timestamp", "current_timestamp"),
    ("CURRENT_DATE", "current_date"),
    ("localtimestamp(3)", "localtimestamp"),
    ("current_setting('TimeZone')", "current_setting(text)"),
    ("pg_backend_pid()", "pg_backend_pid()"),
    ("'now'::timestamptz", "'now'"),
    ("timestamptz 'today'", "'today'"),
    ("CAST('tomorrow 10:00' AS timestamp)", "'tomorrow 10:00'"),
    ("updated_at > 'yesterday'", "'yesterday'"),
    ("'public.orders_raw'::regclass", "a reg* literal"),
    # Clock words inside array, range and multirange literals reach the date input function too.
    ("('{today}'::date[])[1]", "'{today}'"),
    ("lower('[today,tomorrow)'::daterange)", "'[today,tomorrow)'"),
    ("'{[yesterday,today)}'::datemultirange", "'{[yesterday,today)}'"),
    # Nested: in a CTE, in a subquery in FROM, in a scalar subquery.
    ("(WITH w AS (SELECT current_user AS u) SELECT u FROM w)", "current_user"),
    ("(SELECT t.x FROM (SELECT current_timestamp AS x) AS t)", "current_timestamp"),
]


@pytest.mark.parametrize("expr, construct", SESSION, ids=[e for e, _ in SESSION])
def test_values_of_the_session_role_or_clock_are_refused_by_name(source_db, expr, construct):
    err = refused(source_db, transform_with(expr))
    (problem,) = [p for p in err.problems if p.kind == "session"]
    assert construct in problem.construct
    start = transform_with(expr).index(expr) + 1
    assert problem.line == 1 and start <= problem.column < start + len(expr)
    assert "Instead:" in str(err)


@pytest.mark.parametrize("expr", ["'2024-01-01'::date", "timestamptz '2024-01-01 00:00:00+00'", "'epoch'::timestamp",
                                  "'infinity'::date", "note = 'today'", "'{2024-01-01}'::date[]",
                                  "'{today}'::text[]", "'[2024-01-01,2024-02-01)'::daterange"])
def test_date_time_literals_that_do_not_read_the_clock_are_accepted(source_db, expr):
    check(source_db, transform_with(expr))


# --- order ------------------------------------------------------------------------------------

ORDER = [
    # Windows that number or pick rows by position.
    ("row_number() OVER ()", "row_number() OVER"),
    ("row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC)", "row_number() OVER"),
    ("ntile(4) OVER (ORDER BY amount)", "ntile() OVER"),
    ("lag(amount) OVER (PARTITION BY order_id ORDER BY updated_at)", "lag() OVER"),
    ("nth_value(note, 2) OVER (PARTITION BY order_id ORDER BY updated_at)", "nth_value() OVER"),
    # Frames that count rows, and order-sensitive aggregates over a window.
    ("sum(amount) OVER (ORDER BY updated_at ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)", "sum() OVER (ROWS"),
    ("string_agg(note, ',') OVER (PARTITION BY order_id)", "string_agg(...)"),
    ("sum(amount::float8) OVER (PARTITION BY order_id)", "sum(...)"),
    # Row limits, and subqueries that pick one row.
    ("(SELECT s2.note FROM source AS s2 WHERE s2.order_id = source.order_id LIMIT 1)", "LIMIT"),
    ("(SELECT s2.note FROM source AS s2 ORDER BY s2.updated_at DESC LIMIT 1)", "LIMIT"),
    ("(SELECT s2.order_id FROM source AS s2 ORDER BY s2.updated_at OFFSET 3 LIMIT 1)", "LIMIT/OFFSET"),
    ("ARRAY(SELECT s2.note FROM source AS s2 WHERE s2.order_id = source.order_id)", "ARRAY(subquery)"),
    # Order-sensitive aggregates whose ORDER BY is missing or not total.
    ("(SELECT string_agg(s2.note, ',') FROM source AS s2 WHERE s2.order_id = source.order_id)", "string_agg(...)"),
    ("(SELECT array_agg(s2.status ORDER BY s2.updated_at) FROM source AS s2)", "array_agg(...)"),
    ("(SELECT string_agg(s2.note, ',' ORDER BY s2.updated_at, s2.order_id) FROM source AS s2)", "string_agg(...)"),
    ("(SELECT sum(s2.amount::float8) FROM source AS s2)", "sum(...)"),
    # Nested in CTEs and subqueries in FROM.
    ("(WITH r AS (SELECT s2.note, row_number() OVER () AS n FROM source AS s2) SELECT max(r.n) FROM r)",
     "row_number() OVER"),
    ("(SELECT max(t.n) FROM (SELECT DISTINCT ON (s2.order_id) s2.note AS n FROM source AS s2 "
     "ORDER BY s2.order_id, s2.updated_at) AS t)", "DISTINCT ON"),
]


@pytest.mark.parametrize("expr, construct", ORDER, ids=[c + ":" + e[:40] for e, c in ORDER])
def test_constructs_that_depend_on_row_order_are_refused(source_db, expr, construct):
    err = refused(source_db, transform_with(expr))
    assert any(p.kind == "order" and p.construct.startswith(construct) for p in err.problems), err.problems
    start = transform_with(expr).index(expr) + 1
    assert all(p.line == 1 and start <= p.column < start + len(expr) for p in err.problems)


def test_distinct_on_in_a_cte_is_refused_where_it_is(source_db):
    transform = (
        "WITH latest AS (\n"
        "  SELECT DISTINCT ON (order_id) " + COLS + "\n"
        "  FROM source ORDER BY order_id, updated_at DESC\n"
        ")\n"
        "SELECT " + COLS + " FROM latest"
    )
    err = refused(source_db, transform)
    (problem,) = err.problems
    assert (problem.kind, problem.construct, problem.line) == ("order", "DISTINCT ON", 2)
    assert "declare business_key and ordering" in problem.instead


def test_a_refusal_names_every_construct_with_its_line_and_column(source_db):
    transform = (
        "select order_date, order_id,\n"
        "       customer_id, updated_at, ingest_seq, amount,\n"
        "       current_user as status,\n"
        "       (select string_agg(s.note, ',') from source s) as note\n"
        "from source"
    )
    err = refused(source_db, transform)
    assert [(p.construct, p.line, p.column) for p in err.problems] == [
        ("current_user", 3, 8), ("string_agg(...)", 4, 16),
    ]
    message = str(err)
    assert "current_user at line 3, column 8" in message and "string_agg(...) at line 4, column 16" in message


EQUAL_BUT_DIFFERENT = [
    ("(SELECT max(s2.amount / 2) FROM source AS s2)", "max(...)"),
    ("(SELECT min(s2.amount::float8) FROM source AS s2)", "min(...)"),
    ("(SELECT sum(DISTINCT s2.amount / 2) FROM source AS s2)", "sum(...)"),
    ("(SELECT count(*) FROM (SELECT DISTINCT s2.amount * 1.0 AS a FROM source AS s2) AS d)", "DISTINCT on a"),
    ("(SELECT max(g.n) FROM (SELECT s2.amount / 2 AS a, count(*) AS n FROM source AS s2 GROUP BY 1) AS g)",
     "GROUP BY on a"),
    ("(SELECT count(*) FROM (SELECT s2.amount / 2 AS a FROM source AS s2 UNION SELECT 1.50) AS u)",
     "UNION/INTERSECT/EXCEPT on a"),
    ("(SELECT mode() WITHIN GROUP (ORDER BY s2.amount / 2) FROM source AS s2)", "mode(...)"),
    # A group key shown only through an expression prints whichever equal value was kept.
    ("(SELECT max(g.t) FROM (SELECT q.v::text AS t FROM (SELECT s2.amount / 2 AS v FROM source AS s2) AS q "
     "GROUP BY q.v) AS g)", "GROUP BY on"),
]


@pytest.mark.parametrize("expr, construct", EQUAL_BUT_DIFFERENT, ids=[c + ":" + e[:30] for e, c in EQUAL_BUT_DIFFERENT])
def test_collapsing_values_that_compare_equal_but_print_differently_is_refused(source_db, expr, construct):
    err = refused(source_db, transform_with(expr))
    assert any(p.kind == "equal-but-different" and p.construct.startswith(construct) for p in err.problems), err.problems


ACCEPTED = [
    "rank() OVER (PARTITION BY order_id ORDER BY updated_at DESC)",
    "dense_rank() OVER (ORDER BY amount)",
    "sum(amount) OVER (PARTITION BY order_id)",
    "count(*) OVER (PARTITION BY order_id ORDER BY updated_at)",
    "sum(amount) OVER (ORDER BY updated_at ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)",
    "max(amount) OVER (ORDER BY ingest_seq GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW)",
    "(SELECT string_agg(s2.note, ',' ORDER BY s2.note) FROM source AS s2 WHERE s2.order_id = source.order_id)",
    "(SELECT array_agg(DISTINCT s2.status) FROM source AS s2)",
    "(SELECT string_agg('x', ',') FROM source AS s2)",
    "(SELECT sum(s2.amount) + max(s2.amount) + min(s2.order_id) FROM source AS s2)",
    "(SELECT max(s2.amount::numeric(14,2)) FROM source AS s2)",
    "(SELECT max(s2.amount::public.money2) FROM source AS s2)",
    "(SELECT count(DISTINCT s2.amount / 2) FROM source AS s2)",
    # A group key that is not shown (only counted or aggregated) does not pick a value.
    "(SELECT max(g.n) FROM (SELECT count(*) AS n, sum(s2.amount / 2) AS t FROM source AS s2 GROUP BY s2.amount / 2) AS g)",
    "(SELECT max(s2.amount::numeric) FROM source AS s2)",  # numeric(12,2) relabelled: still exact
    "(SELECT count(*) FROM (SELECT DISTINCT s2.order_id, s2.status FROM source AS s2) AS d)",
    "(SELECT s2.order_id FROM source AS s2 ORDER BY s2.order_id LIMIT 1)",
    "(SELECT max(t.i) FROM (SELECT s2.ingest_seq AS i FROM source AS s2 ORDER BY s2.updated_at "
    "FETCH FIRST 1 ROWS WITH TIES) AS t)",
    "ARRAY(SELECT s2.note FROM source AS s2 WHERE s2.order_id = source.order_id ORDER BY s2.note)",
    "(SELECT count(*) FROM (SELECT s2.amount::numeric FROM source AS s2 UNION ALL SELECT 1.50) AS u)",
    "(SELECT count(*) FROM generate_series(1, 3) AS g)",
    "(SELECT max(u.x) FROM unnest(ARRAY[3, 1, 2]) WITH ORDINALITY AS u(x, n))",
    "my_immutable(order_id::int)",  # an IMMUTABLE SQL function whose body the guard reads
]


@pytest.mark.parametrize("expr", ACCEPTED, ids=[e[:50] for e in ACCEPTED])
def test_deterministic_constructs_are_accepted(source_db, expr):
    check(source_db, transform_with(expr))


# --- the query-tree reader --------------------------------------------------------------------


def test_node_tree_reader_finds_functions_operators_and_io_coercions():
    tree = parse_node_tree(
        "({QUERY :targetList ({TARGETENTRY :expr {FUNCEXPR :funcid 1299 :funcresulttype 1184 :args <>} "
        ":resname now\\{x} {TARGETENTRY :expr {OPEXPR :opno 96 :opfuncid 0 :opresulttype 16} :resname :x} "
        "{COERCEVIAIO :arg {RELABELTYPE :resulttype 25 :resulttypmod -1 :resultcollid 100} :resulttype 1184} "
        "{ROWCOMPAREEXPR :opnos (o 97 521)} {AGGREF :aggfnoid 2108 :aggtype 1700 :aggcollid 0})})"
    )
    funcs, ops, types, _ = referenced(tree)
    assert (sorted(funcs), sorted(ops), sorted(types)) == ([1299, 2108], [96, 97, 521], [25, 1184])
    assert tree[0]["targetList"][0]["resname"] == "now{x"
    assert tree[0]["targetList"][1]["resname"] == ":x"


def test_node_tree_reader_types_length_coercions_by_their_typmod():
    tree = parse_node_tree(
        "{FUNCEXPR :funcid 1703 :funcresulttype 1700 :funcformat 1 :funccollid 0 :args "
        "({VAR :vartype 1700 :vartypmod -1 :varcollid 0} {CONST :consttype 23 :consttypmod -1 "
        ":constcollid 0 :constlen 4 :constbyval true :constisnull false :location 9 "
        ":constvalue 4 [ 6 0 14 0 0 0 0 0 ]})}"
    )
    assert expr_type(tree) == (1700, (14 << 16) + 6, 0)


def test_distinct_under_a_nondeterministic_collation_is_refused(source_db):
    """Needs a server built with ICU (the embedded one is not; Debian's PostgreSQL is:
    run with BACKFILL_TEST_DATABASE_URL)."""
    try:
        with source_db.transaction():
            source_db.execute("CREATE COLLATION IF NOT EXISTS public.ci "
                              "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
    except psycopg.errors.FeatureNotSupported:
        pytest.skip("this PostgreSQL is built without ICU")
    err = refused(source_db, transform_with(
        "(SELECT count(*) FROM (SELECT DISTINCT s2.note COLLATE public.ci AS a FROM source AS s2) AS d)"))
    assert [p.construct for p in err.problems] == ["DISTINCT on a"]
    check(source_db, transform_with("(SELECT count(*) FROM (SELECT DISTINCT s2.note AS a FROM source AS s2) AS d)"))


def test_text_is_exact_only_under_a_deterministic_collation():
    # (oid, input, output, typtype, typbasetype, typtypmod) rows as read from pg_type; this
    # server build has no ICU, so the nondeterministic collation (OID 99999) is made up.
    types = {25: (25, 0, 0, "b", 0, -1), 1700: (1700, 0, 0, "b", 0, -1), 90001: (90001, 0, 0, "d", 1700, 917510)}
    deterministic = {100: True, 99999: False}
    assert _is_exact((25, -1, 100), types, deterministic)
    assert not _is_exact((25, -1, 99999), types, deterministic)
    assert not _is_exact((1700, -1, 0), types, deterministic)
    assert _is_exact((1700, 917510, 0), types, deterministic)
    assert _is_exact((90001, -1, 0), types, deterministic)  # a domain over numeric(14,2)
