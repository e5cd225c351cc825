"""transform_sql in DuckDB's dialect: one SELECT reading only ``source``, whose rows cannot
change between runs (core.engines.duckdb.guard).

Everything runs against a real DuckDB: the guard's own private database, and, to compare
rows, a database holding a ``source`` table with data.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal

import duckdb
import pytest
from psycopg import sql

from backfill_assets.core.engines.duckdb.guard import check_duck_transform
from backfill_assets.core.engines.duckdb.guard.catalog import _Catalog
from backfill_assets.core.engines.duckdb.guard.findings import _Locator
from backfill_assets.core.engines.duckdb.guard.rules import _Rules
from backfill_assets.core.errors import SpecError, TransformError, TransformProblem

COLUMNS = [
    ("order_id", "BIGINT"),
    ("customer_id", "BIGINT"),
    ("amount", "DECIMAL(12,2)"),
    ("price", "DOUBLE"),
    ("status", "VARCHAR"),
    ("updated_at", "TIMESTAMP WITH TIME ZONE"),
    ("order_date", "DATE"),
    ("seen_at", "TIMESTAMP"),
    ("wait", "INTERVAL"),
]
ROWS = [
    (1, 10, Decimal("12.50"), 1.5, "new", "2024-01-01 10:00:00+00", "2024-01-01", "2024-01-01 10:00:00", "1 day"),
    (2, 10, Decimal("7.25"), -0.0, "paid", "2024-01-02 11:00:00+00", "2024-01-02", "2024-01-02 11:00:00", "2 hours"),
    (3, 20, Decimal("100.00"), 0.0, "new", "2024-01-02 12:00:00+00", "2024-01-02", "2024-01-02 12:00:00", "1 month"),
    (4, 30, Decimal("0.01"), 2.25, "été;--x", "2024-01-03 13:00:00+00", "2024-01-03", "2024-01-03 13:00:00", "30 days"),
    (5, 20, Decimal("-3.10"), 9.0, None, "2024-01-04 14:00:00+00", "2024-01-04", "2024-01-04 14:00:00", "0 days"),
]


@pytest.fixture
def source_db() -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB database whose table ``source`` holds ROWS."""
    conn = duckdb.connect()
    columns = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind)) for name, kind in COLUMNS)
    conn.execute(sql.SQL("CREATE TABLE source ({})").format(columns).as_string(None))
    conn.executemany(f"INSERT INTO source VALUES ({', '.join('?' for _ in COLUMNS)})", ROWS)
    yield conn
    conn.close()


def rows(conn: duckdb.DuckDBPyConnection, statement: str) -> list[tuple]:
    """The statement's rows, as a sorted list (row order is not part of the result)."""
    return sorted(conn.execute(statement).fetchall(), key=repr)


def refused(text: str) -> tuple[TransformProblem, ...]:
    with pytest.raises(TransformError) as caught:
        check_duck_transform(text, COLUMNS)
    assert isinstance(caught.value, SpecError)  # TransformError is a SpecError: nothing is written
    return caught.value.problems


def only(text: str) -> TransformProblem:
    problems = refused(text)
    assert len(problems) == 1, [p.describe() for p in problems]
    return problems[0]


def spec_error(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        check_duck_transform(text, COLUMNS)
    assert not isinstance(caught.value, TransformError)
    return str(caught.value)


# --- accepted transforms ------------------------------------------------------------------------

ACCEPTED = """
WITH totals AS (  -- per customer
    SELECT customer_id, sum(amount) AS total, count(*) AS n,
           string_agg(status, ',' ORDER BY status) AS statuses
    FROM source
    GROUP BY customer_id
)
SELECT s.order_id,
       CAST(s.amount AS DECIMAL(14,2)) AS amount,
       CASE WHEN t.total > 50 THEN 'big' ELSE 'small' END AS size,
       t.n, t.statuses,
       CAST(s.price AS VARCHAR) AS price_text
FROM source AS s
JOIN totals AS t ON t.customer_id = s.customer_id
WHERE s.order_date >= DATE '2024-01-01'
UNION ALL
SELECT order_id, amount, 'été; -- not a comment', 0, NULL, 'x'
FROM source
WHERE status = 'été;--x';
"""


def test_an_accepted_transform_is_reprinted_and_gives_the_same_rows(source_db):
    reprinted = check_duck_transform(ACCEPTED, COLUMNS)
    assert "--" not in reprinted.replace("'été; -- not a comment'", "").replace("'été;--x'", "")
    assert not reprinted.rstrip().endswith(";")
    parsed = json.loads(source_db.execute("SELECT json_serialize_sql(?)", [reprinted]).fetchone()[0])
    assert parsed["error"] is False and len(parsed["statements"]) == 1
    # The re-printed statement passes the guard again, unchanged, and gives the same rows.
    assert check_duck_transform(reprinted, COLUMNS) == reprinted
    original = rows(source_db, ACCEPTED)
    assert original == rows(source_db, reprinted)
    assert len(original) == 6
    assert (4, Decimal("0.01"), "été; -- not a comment", 0, None, "x") in original
    assert (1, Decimal("12.50"), "small", 2, "new,paid", "1.5") in original


@pytest.mark.parametrize("text", [
    "SELECT string_agg(status, ',' ORDER BY status) AS s FROM source",
    "SELECT customer_id, sum(amount) AS s, avg(amount) AS a, count(DISTINCT order_id) AS n FROM source GROUP BY 1",
    "SELECT customer_id, list(order_id ORDER BY order_id) AS ids, min(amount) AS m FROM source GROUP BY ALL",
    "SELECT sum(CAST(price AS DECIMAL(18,6))) AS s FROM source",
    "SELECT order_id, rank() OVER (PARTITION BY customer_id ORDER BY updated_at DESC) AS r FROM source",
    "SELECT order_id, sum(amount) OVER (PARTITION BY customer_id ORDER BY order_date) AS running FROM source",
    "SELECT order_id FROM source QUALIFY dense_rank() OVER (PARTITION BY customer_id ORDER BY order_id) = 1",
    "SELECT year(seen_at) AS y, date_trunc('day', seen_at) AS d, strftime(order_date, '%Y') AS s FROM source",
    "SELECT make_timestamp(epoch_us(updated_at)) AS utc FROM source",
    "SELECT order_id FROM source WHERE updated_at < TIMESTAMPTZ '2024-01-02 00:00:00+00'",
    "SELECT order_id, source.user FROM (SELECT order_id, status AS user FROM source) AS source",
    "SELECT hash(order_id) AS h, md5(status) AS m, upper(status) AS u, coalesce(status, '?') AS s FROM source",
    "SELECT u FROM (SELECT unnest([order_id, customer_id]) AS u FROM source) AS t",
    "SELECT order_id, list_transform([amount], lambda v: v * 2) AS l FROM source",
    "SELECT order_id FROM source WHERE order_id IN (SELECT order_id FROM source WHERE amount > 0)",
    "SELECT a.order_id FROM source AS a LEFT JOIN source AS b USING (order_id) CROSS JOIN (VALUES (1)) AS v(k)",
    "FROM source SELECT order_id, status COLLATE nocase = 'NEW' AS is_new",
    "SELECT * FROM source",
])
def test_deterministic_transforms_are_accepted(source_db, text):
    reprinted = check_duck_transform(text, COLUMNS)
    assert rows(source_db, reprinted) == rows(source_db, text)


def test_unicode_and_a_literal_with_a_semicolon_and_dashes_are_one_statement(source_db):
    text = "SELECT order_id, 'ä;ö -- ü' || status AS t FROM source WHERE status <> 'x;y' -- done"
    reprinted = check_duck_transform(text, COLUMNS)
    assert "'ä;ö -- ü'" in reprinted and "done" not in reprinted
    assert rows(source_db, reprinted) == rows(source_db, text)
    # Columns count characters, not bytes: random() follows 23 characters (35 bytes).
    problem = only("SELECT 'éééééééééééé', random() FROM source")
    assert (problem.line, problem.column) == (1, 24)


# --- the shape: SpecError --------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("SELECT order_id FROM source; SELECT status FROM source", "exactly one SELECT statement; it has 2"),
    ("SELECT 1; INSERT INTO source (order_id) VALUES (1)", "exactly one SELECT statement; it has 2"),
    ("INSERT INTO source (order_id) VALUES (1)", "must be a SELECT; it is an INSERT"),
    ("UPDATE source SET amount = 0", "must be a SELECT; it is an UPDATE"),
    ("COPY source TO 'out.csv'", "must be a SELECT; it is a COPY"),
    ("PRAGMA version", "must be a SELECT; it is a PRAGMA"),
    ("SET threads = 1", "must be a SELECT; it is a SET"),
    ("ATTACH 'other.db'", "must be a SELECT; it is an ATTACH"),
    ("CREATE TABLE t AS SELECT order_id FROM source", "must be a SELECT; it is a CREATE"),
    ("PIVOT source ON status USING sum(amount)", "it is a PIVOT"),
    ("", "exactly one SELECT statement; it has 0"),
    ("WITH a AS (INSERT INTO source (order_id) VALUES (1) RETURNING order_id) SELECT order_id FROM a",
     "a data-modifying CTE (INSERT)"),
    ("SELECT order_id FROM orders", "it reads orders at line 1, column 22"),
    ("WITH a AS (SELECT order_id FROM source) SELECT order_id FROM b", "it reads b"),
    ("SELECT order_id FROM 'orders.parquet'", "it reads orders.parquet"),
    ("SELECT order_id FROM main.source", "it reads main.source at line 1, column 22"),
    ("SELECT order_id FROM memory.main.source", "schema- or catalog-qualified"),
    ("SELECT order_id FROM read_parquet('x')", "the table function read_parquet at line 1, column 22"),
    ("SELECT * FROM range(3)", "the table function range"),
    ("SELECT * FROM generate_series(1, 3)", "the table function generate_series"),
    ("SELECT * FROM glob('*')", "the table function glob"),
    ("SELECT * FROM duckdb_settings()", "the table function duckdb_settings"),
    ("SELECT table_name FROM duckdb_tables", "it reads duckdb_tables"),
    ("SELECT order_id FROM source USING SAMPLE 10%", "USING SAMPLE / TABLESAMPLE at line 1, column 29"),
    ("SELECT order_id FROM source TABLESAMPLE 10%", "USING SAMPLE / TABLESAMPLE"),
    ("SELECT order_id FROM source AT (VERSION => 1)", "time travel"),
    ("DESCRIBE source", "DESCRIBE, SHOW and SUMMARIZE"),
    ("SUMMARIZE source", "DESCRIBE, SHOW and SUMMARIZE"),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r", "RECURSIVE"),
    ("SELECT $1 FROM source", "a parameter at line 1, column 8"),
])
def test_the_shape_is_refused_as_a_spec_error(text, message):
    assert message in spec_error(text)


def test_select_into_is_a_parse_error():
    assert 'syntax error at or near "INTO"' in spec_error("SELECT order_id INTO t FROM source")


def test_a_parse_error_names_duckdbs_message_and_the_position():
    message = spec_error("SELECT order_id\nFROM source\nWHERE (order_id > 1")
    assert message.startswith("transform_sql does not parse: DuckDB says syntax error at or near")
    assert "at line 3, column 19" in message


def test_a_statement_that_does_not_bind_is_a_spec_error():
    message = spec_error("SELECT no_such_column FROM source")
    assert "rejected by DuckDB against source (order_id, customer_id" in message
    assert "no_such_column" in message


# --- refusals: TransformError, each construct with its place ------------------------------------

MULTI_LINE = """SELECT order_id,
       amount,
           random() AS r
FROM source"""


def test_a_refusal_names_the_construct_its_line_and_column_and_what_to_do():
    problem = only(MULTI_LINE)
    assert (problem.kind, problem.construct, problem.line, problem.column) == ("volatility", "random()", 3, 12)
    assert problem.snippet == "random() AS r"
    assert "VOLATILE" in problem.problem and "hash()" in problem.instead
    assert "random() at line 3, column 12 (`random() AS r`)" in problem.describe()


@pytest.mark.parametrize("expr, kind, construct, column", [(*case, 3)[:4] for case in [
    # VOLATILE, and the clock (CONSISTENT_WITHIN_QUERY), as functions and as keywords.
    ("random()", "volatility", "random()"),
    ("uuid()", "volatility", "uuid()"),
    ("gen_random_uuid()", "volatility", "gen_random_uuid()"),
    ("setseed(0.5)", "volatility", "setseed()"),
    ("now()", "volatility", "now"),
    ("get_current_timestamp()", "volatility", "get_current_timestamp"),
    ("transaction_timestamp()", "volatility", "transaction_timestamp"),
    ("today()", "volatility", "today"),
    ("current_date", "volatility", "current_date"),
    ("CURRENT_DATE", "volatility", "current_date"),
    ("CURRENT_TIMESTAMP", "volatility", "current_timestamp"),
    ("current_time", "volatility", "current_time"),
    ("localtimestamp", "volatility", "localtimestamp"),
    ("age(seen_at)", "volatility", "age()"),
    # The session, settings, environment and catalog.
    ("getenv('HOME')", "session", "getenv"),
    ("current_setting('threads')", "session", "current_setting"),
    ("getvariable('x')", "session", "getvariable"),
    ("current_user", "session", "current_user"),
    ("USER", "session", "user"),
    ("current_schema()", "session", "current_schema"),
    ("current_database()", "session", "current_database"),
    ("version()", "session", "version"),
    ("txid_current()", "session", "txid_current"),
    # The TimeZone setting: variants over TIMESTAMP WITH TIME ZONE, and casts.
    ("year(updated_at)", "session", "year(TIMESTAMP WITH TIME ZONE)"),
    ("date_trunc('day', updated_at)", "session", "date_trunc(VARCHAR, TIMESTAMP WITH TIME ZONE)"),
    ("updated_at + INTERVAL 1 DAY", "session", "+(TIMESTAMP WITH TIME ZONE, INTERVAL)", 14),  # at the +
    ("CAST(updated_at AS VARCHAR)", "session", "CAST(TIMESTAMP WITH TIME ZONE AS VARCHAR)"),
    ("CAST(seen_at AS TIMESTAMPTZ)", "session", "CAST(TIMESTAMP AS TIMESTAMP WITH TIME ZONE)"),
    ("updated_at > '2024-01-01'", "session", "CAST(VARCHAR AS TIMESTAMP WITH TIME ZONE)", 16),  # the literal
    # A function the catalog does not list.
    ("my_macro(order_id)", "untrusted", "my_macro()"),
    ("rowid", "order", "rowid"),
]])
def test_functions_of_the_clock_the_session_or_unknown_are_refused(expr, kind, construct, column):
    problem = only(f"SELECT order_id,\n  {expr} AS v\nFROM source")
    assert (problem.kind, problem.construct) == (kind, construct)
    assert (problem.line, problem.column) == (2, column)


@pytest.mark.parametrize("text, kind, construct, line, column", [
    ("SELECT order_id\nFROM source\nORDER BY order_id\nLIMIT 5", "order", "LIMIT", 4, 1),
    ("SELECT order_id FROM source\nOFFSET 2", "order", "OFFSET", 2, 1),
    ("SELECT order_id FROM source LIMIT 10%", "order", "LIMIT", 1, 29),
    ("SELECT order_id FROM (SELECT order_id FROM source ORDER BY order_id LIMIT 1) AS t", "order", "LIMIT", 1, 69),
    ("SELECT DISTINCT ON (customer_id) customer_id, amount\nFROM source ORDER BY customer_id, updated_at DESC",
     "order", "DISTINCT ON", 1, 8),
    ("SELECT customer_id,\n  first(status) AS s FROM source GROUP BY 1", "order", "first()", 2, 3),
    ("SELECT any_value(status) AS s FROM source", "order", "any_value()", 1, 8),
    ("SELECT arg_max(status, updated_at) AS s FROM source", "order", "arg_max()", 1, 8),
    ("SELECT max_by(status, order_id) AS s FROM source", "order", "max_by()", 1, 8),
    ("SELECT mode(status) AS s FROM source", "order", "mode()", 1, 8),
    ("SELECT approx_quantile(amount, 0.5) AS s FROM source", "order", "approx_quantile()", 1, 8),
    ("SELECT json_group_array(status) AS s FROM source", "order", "json_group_array()", 1, 8),
    ("SELECT string_agg(status, ',') AS s FROM source", "order", "string_agg()", 1, 8),
    ("SELECT string_agg(status, ',' ORDER BY order_id) AS s FROM source", "order", "string_agg()", 1, 8),
    ("SELECT list(order_id) AS s FROM source", "order", "list()", 1, 8),
    ("SELECT array_agg(order_id) AS s FROM source", "order", "array_agg()", 1, 8),
    ("SELECT group_concat(status) AS s FROM source", "order", "group_concat()", 1, 8),
    ("SELECT ARRAY(SELECT order_id FROM source) AS s", "order", "array_agg()", 1, 8),
    ("SELECT order_id,\n  row_number() OVER (PARTITION BY customer_id ORDER BY updated_at) AS r FROM source",
     "order", "row_number()", 2, 3),
    ("SELECT lag(amount) OVER (ORDER BY order_id) AS r FROM source", "order", "lag()", 1, 8),
    ("SELECT first_value(amount) OVER (ORDER BY order_id) AS r FROM source", "order", "first_value()", 1, 8),
    ("SELECT ntile(2) OVER (ORDER BY order_id) AS r FROM source", "order", "ntile()", 1, 8),
    ("SELECT sum(amount) OVER (ORDER BY order_date ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS r FROM source",
     "order", "sum() OVER (ROWS ...)", 1, 8),
    ("SELECT a.order_id FROM source AS a ASOF JOIN source AS b ON a.seen_at >= b.seen_at", "order", "ASOF JOIN",
     1, 36),
    ("SELECT a.order_id FROM source AS a POSITIONAL JOIN source AS b", "order", "POSITIONAL JOIN", 1, 36),
])
def test_constructs_that_depend_on_the_order_rows_arrive_in_are_refused(text, kind, construct, line, column):
    problem = only(text)
    assert (problem.kind, problem.construct, problem.line, problem.column) == (kind, construct, line, column)


@pytest.mark.parametrize("text, construct, line, column", [
    ("SELECT customer_id,\n  sum(price) AS s FROM source GROUP BY 1", "sum()", 2, 3),
    ("SELECT avg(price) AS s FROM source", "avg()", 1, 8),
    ("SELECT fsum(price) AS s FROM source", "fsum()", 1, 8),
    ("SELECT sum(amount * price) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(CAST(amount AS DOUBLE)) AS s FROM source", "sum()", 1, 8),
    ("WITH t AS (SELECT price AS p FROM source) SELECT sum(p) AS s FROM t", "sum()", 1, 50),
    ("SELECT stddev_samp(amount) AS s FROM source", "stddev_samp()", 1, 8),
    ("SELECT corr(amount, order_id) AS s FROM source", "corr()", 1, 8),
    ("SELECT sum(price) OVER (PARTITION BY customer_id) AS s FROM source", "sum()", 1, 8),
    ("SELECT geomean(amount) AS s FROM source", "geomean()", 1, 8),
    ("SELECT max(price) AS s FROM source", "max()", 1, 8),
    ("SELECT min(wait) AS s FROM source", "min()", 1, 8),
    ("SELECT list(price ORDER BY price) AS s FROM source", "list()", 1, 8),
    ("SELECT customer_id, count(*) AS n\nFROM source GROUP BY customer_id, price", "GROUP BY price (DOUBLE)", 2, 35),
    ("SELECT wait, count(*) AS n FROM source GROUP BY wait", "GROUP BY wait (INTERVAL)", 1, 49),
    ("SELECT DISTINCT price FROM source", "DISTINCT (DOUBLE)", None, None),
    ("SELECT price FROM source UNION SELECT price FROM source", "UNION (DOUBLE)", None, None),
    ("SELECT status COLLATE nocase AS s, count(*) AS n FROM source GROUP BY 1",
     "GROUP BY s (VARCHAR COLLATE nocase)", None, None),
])
def test_values_equal_but_printed_differently_are_refused(text, construct, line, column):
    problem = only(text)
    assert (problem.kind, problem.construct, problem.line, problem.column) == (
        "equal-but-different", construct, line, column)


def test_a_float_sum_says_to_cast_to_decimal_and_a_decimal_sum_is_accepted(source_db):
    problem = only("SELECT sum(price) AS s FROM source")
    assert "over DOUBLE" in problem.problem
    assert problem.instead.startswith("cast to DECIMAL(p,s) before summing")
    text = "SELECT customer_id, sum(amount) AS s FROM source GROUP BY customer_id"
    assert rows(source_db, check_duck_transform(text, COLUMNS)) == [
        (10, Decimal("19.75")), (20, Decimal("96.90")), (30, Decimal("0.01"))]


def test_a_string_agg_is_refused_without_an_order_by_and_accepted_with_one():
    assert only("SELECT string_agg(status, ',') AS s FROM source").construct == "string_agg()"
    assert check_duck_transform("SELECT string_agg(status, ',' ORDER BY status) AS s FROM source", COLUMNS)


def test_several_problems_are_reported_together_in_the_order_of_the_text():
    text = """SELECT customer_id,
       first(status) AS s,
       sum(price) AS p,
       now() AS t,
       getenv('HOME') AS h,
       my_macro(1) AS m
FROM source
GROUP BY customer_id
LIMIT 3"""
    with pytest.raises(TransformError) as caught:
        check_duck_transform(text, COLUMNS)
    got = [(p.kind, p.construct, p.line) for p in caught.value.problems]
    assert got == [
        ("order", "first()", 2), ("volatility", "now", 4), ("session", "getenv", 5),
        ("untrusted", "my_macro()", 6), ("order", "LIMIT", 9),
    ]
    message = str(caught.value)
    assert message.startswith("transform_sql is refused: 5 construct(s)")
    assert "1. first() at line 2, column 8" in message and "5. LIMIT at line 9, column 1" in message


def test_problems_found_by_binding_are_reported_with_those_of_the_parse_tree():
    text = "SELECT sum(price) AS p, year(updated_at) AS y, random() AS r FROM source GROUP BY ALL"
    got = [(p.kind, p.construct) for p in refused(text)]
    assert got == [("equal-but-different", "sum()"), ("session", "year(TIMESTAMP WITH TIME ZONE)"),
                   ("volatility", "random()")]


def test_an_unknown_construct_of_the_parse_tree_is_refused():
    """The walker refuses what it does not recognise: here a real parse tree whose CAST node
    is renamed to a class the guard does not know."""
    conn = duckdb.connect()
    try:
        parsed = json.loads(conn.execute(
            "SELECT json_serialize_sql(?)", ["SELECT CAST(order_id AS VARCHAR) FROM source"]).fetchone()[0])
        parsed["statements"][0]["node"]["select_list"][0]["class"] = "FUTURE_EXPRESSION"
        found = _Rules(_Catalog.read(conn), _Locator("")).check(parsed)
    finally:
        conn.close()
    assert [(f.kind, f.construct) for f in found] == [("untrusted", "a FUTURE_EXPRESSION expression")]


def test_source_columns_are_checked_before_they_go_into_a_statement():
    with pytest.raises(SpecError, match="unexpected DuckDB type text"):
        check_duck_transform("SELECT order_id FROM source", [("order_id", "BIGINT); DROP TABLE x; --")])
    with pytest.raises(SpecError, match="no columns"):
        check_duck_transform("SELECT 1", [])
