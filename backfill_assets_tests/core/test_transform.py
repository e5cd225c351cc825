"""transform_sql: one SELECT reading only the snapshot, whose rows cannot change between runs.

The catalog checks run against one database loaded with the demo source (module scope: each
check is a temporary view in a rolled-back transaction, so checks cannot see each other).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backfill_assets.core.db import DatabaseUrl, connect
from backfill_assets.core.guardcatalog import referenced
from backfill_assets.core.errors import SpecError, TransformError
from backfill_assets.core.querytree import expr_type, parse_node_tree
from backfill_assets.core.transform import _is_exact, validate_transform_in_catalog, validate_transform_text
from backfill_assets_tests.conftest import make_spec

COLS = "order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note"


@pytest.fixture(scope="module")
def source_db(admin_url: str) -> Iterator[psycopg.Connection]:
    """A database with the demo source, a sequence and a volatile function, for this module."""
    from backfill_assets import demo

    name = f"bfa_transform_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = conninfo_to_dict(admin_url)
    info["dbname"] = name
    with connect(DatabaseUrl(make_conninfo(**info), source="the test database")) as conn:
        demo.load(conn)
        conn.execute("CREATE SEQUENCE public.s")
        conn.execute("CREATE FUNCTION public.my_volatile(x int) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT x'")
        conn.execute("CREATE FUNCTION public.my_immutable(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT x'")
        conn.execute("CREATE DOMAIN public.money2 AS numeric(14,2)")
        yield conn
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def transform_with(expr: str) -> str:
    """A transform_sql text (the user's input, validated before use) with one extra column."""
    return " ".join(["SELECT", COLS + ",", expr, "AS extra FROM source"])


def check(conn: psycopg.Connection, transform: str) -> None:
    spec = make_spec()
    source_cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'public.orders_raw'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum").fetchall()]
    validate_transform_in_catalog(
        conn, spec.source_ref, source_cols, spec.partition_key, spec.input_columns,
        validate_transform_text(transform), original=transform,
    )


def refused(conn: psycopg.Connection, transform: str) -> TransformError:
    with pytest.raises(TransformError) as err:
        check(conn, transform)
    # Nothing persists: the temporary view was rolled back.
    assert conn.execute("SELECT to_regclass('backfill_assets_transform_check')").fetchone()[0] is None
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
    "my_immutable(order_id::int)",
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
