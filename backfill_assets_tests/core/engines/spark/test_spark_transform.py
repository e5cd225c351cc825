"""transform_sql in Spark SQL's dialect: one query reading only ``source``, whose rows cannot
change between runs (core.engines.spark.guard).

The guard itself runs no Spark (it reads the statement with sqlglot). The tests that take the
``spark`` fixture run accepted transforms, and the text the guard returns, in a local Spark
session whose temporary view ``source`` holds ROWS.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest

from backfill_assets.core.engines.spark.guard import check_spark_transform
from backfill_assets.core.errors import SpecError, TransformError, TransformProblem

COLUMNS = [
    ("order_id", "bigint"),
    ("customer_id", "bigint"),
    ("amount", "decimal(12,2)"),
    ("price", "double"),
    ("status", "string"),
    ("updated_at", "timestamp"),
    ("order_date", "date"),
    ("seen_at", "timestamp_ntz"),
    ("qty", "int"),
    ("flag", "boolean"),
    ("payload", "binary"),
]
_UTC = datetime.timezone.utc
ROWS = [
    (1, 10, Decimal("12.50"), 1.5, "new", datetime.datetime(2024, 1, 1, 10, tzinfo=_UTC), datetime.date(2024, 1, 1),
     datetime.datetime(2024, 1, 1, 10), 3, True, b"\x01"),
    (2, 10, Decimal("7.25"), -0.0, "paid", datetime.datetime(2024, 1, 2, 11, tzinfo=_UTC), datetime.date(2024, 1, 2),
     datetime.datetime(2024, 1, 2, 11), 1, False, b"\x02"),
    (3, 20, Decimal("100.00"), 0.0, "new,x", datetime.datetime(2024, 1, 2, 12, tzinfo=_UTC),
     datetime.date(2024, 1, 2), datetime.datetime(2024, 1, 2, 12), 7, None, None),
    (4, 30, Decimal("0.01"), 2.25, "été;--x", datetime.datetime(2024, 1, 3, 13, tzinfo=_UTC),
     datetime.date(2024, 1, 3), datetime.datetime(2024, 1, 3, 13), 2, True, b""),
    (5, 20, Decimal("-3.10"), 9.0, None, datetime.datetime(2024, 1, 4, 14, tzinfo=_UTC), datetime.date(2024, 1, 4),
     datetime.datetime(2024, 1, 4, 14), None, False, b"\xff"),
]


@pytest.fixture
def spark_source(spark: Any) -> Any:
    """The Spark session, with ROWS registered as the temporary view ``source``."""
    schema = ", ".join(f"`{name}` {kind}" for name, kind in COLUMNS)
    spark.createDataFrame(ROWS, schema).createOrReplaceTempView("source")
    return spark


def rows(spark: Any, statement: str) -> list[tuple]:
    """The statement's rows, as a sorted list (row order is not part of the result)."""
    return sorted((tuple(r) for r in spark.sql(statement).collect()), key=repr)


def refused(text: str) -> tuple[TransformProblem, ...]:
    with pytest.raises(TransformError) as caught:
        check_spark_transform(text, COLUMNS)
    assert isinstance(caught.value, SpecError)  # TransformError is a SpecError: nothing is written
    return caught.value.problems


def only(text: str) -> TransformProblem:
    problems = refused(text)
    assert len(problems) == 1, [p.describe() for p in problems]
    return problems[0]


def spec_error(text: str) -> str:
    with pytest.raises(SpecError) as caught:
        check_spark_transform(text, COLUMNS)
    assert not isinstance(caught.value, TransformError)
    return str(caught.value)


# --- accepted transforms ------------------------------------------------------------------------

ACCEPTED = """
WITH totals AS (  -- per customer
    SELECT customer_id, sum(amount) AS total, count(*) AS n,
           sort_array(collect_set(status)) AS statuses
    FROM source
    GROUP BY customer_id
)
SELECT s.order_id,
       CAST(s.amount AS DECIMAL(14,2)) AS amount,
       CASE WHEN t.total > 50 THEN 'big' ELSE 'small' END AS size,
       t.n, t.statuses,
       CAST(s.price AS STRING) AS price_text /* exact: -0.0 apart from 0.0 */
FROM source AS s
JOIN totals AS t ON t.customer_id = s.customer_id
WHERE s.order_date >= DATE '2024-01-01'
UNION ALL
SELECT order_id, amount, 'été; -- not a comment', 0, NULL, "x"
FROM source
WHERE status = 'été;--x';
"""


def test_an_accepted_transform_is_reprinted_in_spark_sql_and_passes_again():
    reprinted = check_spark_transform(ACCEPTED, COLUMNS)
    assert "--" not in reprinted.replace("'été; -- not a comment'", "").replace("'été;--x'", "")
    assert "/*" not in reprinted and not reprinted.rstrip().endswith(";")
    # Identifiers are quoted with backticks, never double quotes (Spark reads "x" as a string).
    assert "`order_id`" in reprinted and "`source`" in reprinted and '"' not in reprinted
    assert "'x'" in reprinted
    # The re-printed statement passes the guard again, unchanged.
    assert check_spark_transform(reprinted, COLUMNS) == reprinted


def test_an_accepted_transform_runs_in_spark_and_gives_the_rows_of_the_original(spark_source):
    reprinted = check_spark_transform(ACCEPTED, COLUMNS)
    got = rows(spark_source, reprinted)
    assert got == rows(spark_source, ACCEPTED.strip().rstrip(";"))
    assert len(got) == 6
    assert (4, Decimal("0.01"), "été; -- not a comment", 0, None, "x") in got
    assert (1, Decimal("12.50"), "small", 2, ["new", "paid"], "1.5") in got
    assert (2, Decimal("7.25"), "small", 2, ["new", "paid"], "-0.0") in got


DETERMINISTIC = [
    "SELECT * FROM source",
    "SELECT order_id, amount, `status` FROM source WHERE order_date >= DATE '2024-01-02'",
    "select ORDER_ID, Status from SOURCE where QTY > 1",
    "SELECT `order_id`, `Status` AS `s t` FROM `source`",
    "WITH source AS (SELECT order_id, status FROM source WHERE qty > 1) SELECT order_id, upper(status) AS u FROM source",
    "WITH a AS (SELECT order_id, qty FROM source), b AS (SELECT order_id, qty * 2 AS q FROM a) SELECT * FROM b",
    "SELECT order_id, instr(status, 'e') AS i, position('e' IN status) AS p, substr(status, 2) AS s2, "
    "substring(status FROM 1 FOR 2) AS s3 FROM source",
    "SELECT order_id, ifnull(status, '?') AS a, nvl(qty, 0) AS b, coalesce(qty, 0) AS c, nvl2(qty, 1, 0) AS d, "
    "nullif(qty, 1) AS e FROM source",
    "SELECT order_id, CASE WHEN qty > 2 THEN 'big' WHEN qty IS NULL THEN 'none' ELSE 'small' END AS size, "
    "CASE status WHEN 'new' THEN 1 ELSE 0 END AS isnew, if(flag, 'y', 'n') AS f FROM source",
    "SELECT order_id, year(order_date) AS y, month(order_date) AS m, day(order_date) AS d, "
    "dayofweek(order_date) AS w, quarter(order_date) AS q, weekofyear(order_date) AS wy FROM source",
    "SELECT order_id, date_add(order_date, 2) AS a, date_sub(order_date, 2) AS b, "
    "datediff(order_date, DATE '2024-01-01') AS c, add_months(order_date, 1) AS d, last_day(order_date) AS e, "
    "trunc(order_date, 'MM') AS f, order_date + 1 AS h, order_date - INTERVAL 1 DAY AS i FROM source",
    "SELECT order_id, to_date('2024-01-05') AS a, make_date(2024, 2, 29) AS b, extract(YEAR FROM order_date) AS c, "
    "date_part('month', order_date) AS d, hour(seen_at) AS e, extract(HOUR FROM seen_at) AS f FROM source",
    "SELECT order_id, unix_micros(updated_at) AS us, timestamp_micros(unix_micros(updated_at) + 1) AS t, "
    "updated_at AS u FROM source WHERE updated_at >= TIMESTAMP '2024-01-02 00:00:00Z'",
    "SELECT order_id, from_utc_timestamp(updated_at, 'Europe/Paris') AS p FROM source",
    "SELECT order_id, CAST(price AS STRING) AS p, CAST(qty AS DECIMAL(10, 2)) AS q, bigint(qty) AS b, "
    "qty::string AS q2, CAST(updated_at AS BIGINT) AS e FROM source",
    "SELECT order_id, abs(amount) AS a, round(amount, 1) AS r, floor(price) AS f, amount / 3 AS d, qty div 2 AS i, "
    "qty % 2 AS md, greatest(qty, 2) AS g, sqrt(qty) AS sq, ln(qty) AS lg FROM source",
    "SELECT order_id, concat(status, '-', order_id) AS c, status || '!' AS p, lower(status) AS l, UCASE(status) AS u, "
    "trim(status) AS t, lpad(status, 8, '*') AS lp, regexp_replace(status, '[aeiou]', '') AS rr, "
    "split(status, ',') AS sp FROM source",
    "SELECT order_id, md5(status) AS m, sha2(status, 256) AS s2, xxhash64(updated_at) AS x, hex(payload) AS h "
    "FROM source",
    "SELECT order_id, status LIKE 'n%' AS a, status RLIKE '^p' AS b, status IN ('new', 'paid') AS d, "
    "qty BETWEEN 1 AND 3 AS e, flag <=> true AS f, status IS NULL AS i, isnull(qty) AS j FROM source",
    "SELECT customer_id, count(*) AS n, count(DISTINCT price) AS dp, sum(amount) AS s, avg(amount) AS a, "
    "min(amount) AS mi, max(status) AS mx, min(updated_at) AS mt, sum(qty) AS sq, count_if(flag) AS cf, "
    "bool_and(flag) AS ba, every(flag) AS ev, sum(amount) FILTER (WHERE qty > 1) AS sf FROM source GROUP BY customer_id",
    "SELECT customer_id, status, count(*) AS n FROM source GROUP BY ROLLUP (customer_id, status)",
    "SELECT customer_id, status, count(*) AS n FROM source GROUP BY GROUPING SETS ((customer_id), (status), ())",
    "SELECT customer_id, count(*) AS n FROM source GROUP BY ALL",
    "SELECT customer_id, count(*) AS n FROM source GROUP BY 1 HAVING count(*) > 1 ORDER BY 1",
    "SELECT order_id, rank() OVER (PARTITION BY customer_id ORDER BY updated_at DESC) AS r, "
    "dense_rank() OVER (ORDER BY customer_id) AS d, percent_rank() OVER (ORDER BY qty) AS p FROM source",
    "SELECT order_id, sum(amount) OVER (PARTITION BY customer_id ORDER BY order_date) AS running, "
    "count(*) OVER (PARTITION BY customer_id) AS n, sum(qty) OVER (PARTITION BY customer_id ORDER BY order_id "
    "ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS w FROM source",
    "SELECT order_id FROM (SELECT order_id, rank() OVER (PARTITION BY customer_id ORDER BY updated_at DESC) AS r "
    "FROM source) AS t WHERE r = 1",
    "SELECT customer_id, sort_array(collect_set(status)) AS s, sort_array(collect_list(order_id), false) AS l, "
    "array_sort(collect_list(status)) AS a, size(collect_set(price)) AS n FROM source GROUP BY customer_id",
    "SELECT customer_id, listagg(status, ',') WITHIN GROUP (ORDER BY status) AS s FROM source GROUP BY customer_id",
    "SELECT order_id, part FROM source LATERAL VIEW explode(split(status, ',')) t AS part",
    "SELECT order_id, pos, part FROM source LATERAL VIEW OUTER posexplode(split(status, ',')) t AS pos, part",
    "SELECT order_id, explode(array(qty, 1)) AS v FROM source",
    "SELECT order_id, transform(split(status, ','), x -> upper(x)) AS u, filter(array(qty, 2, 3), x -> x > 1) AS f, "
    "aggregate(array(qty, 1), 0, (acc, x) -> acc + x) AS s FROM source",
    "SELECT order_id, array(qty, 2)[0] AS b, element_at(array(qty, 2), 1) AS e, map('a', qty) AS m, "
    "named_struct('k', qty) AS ns, sequence(1, qty) AS sq FROM source",
    "SELECT order_id, st.k AS k FROM (SELECT order_id, named_struct('k', qty) AS st FROM source) AS t",
    "SELECT a.order_id FROM source AS a LEFT SEMI JOIN source AS b ON a.customer_id = b.customer_id AND b.qty > 2",
    "SELECT a.order_id, b.order_id AS other FROM source AS a LEFT JOIN source AS b USING (customer_id)",
    "SELECT order_id FROM source WHERE order_id IN (SELECT order_id FROM source WHERE amount > 0) AND EXISTS "
    "(SELECT 1 AS one FROM source AS s2 WHERE s2.customer_id = source.customer_id)",
    "SELECT order_id, (SELECT max(amount) FROM source) AS top FROM source",
    "SELECT k, v FROM VALUES (1, 'a'), (2, 'b') AS t(k, v)",
    "SELECT status FROM source UNION SELECT 'other' AS status",
    "SELECT customer_id FROM source INTERSECT SELECT customer_id FROM source WHERE qty > 2",
    "SELECT customer_id FROM source EXCEPT SELECT customer_id FROM source WHERE qty > 2",
    "SELECT DISTINCT customer_id, status FROM source",
    "SELECT order_id, seen_at + INTERVAL 1 HOUR AS later, CAST(seen_at AS STRING) AS s FROM source",
    "SELECT order_id, format_string('%05d', qty) AS f, format_number(amount, 1) AS fn, try_divide(amount, 0) AS td "
    "FROM source",
    "SELECT order_id, get_json_object('{\"a\": {\"b\": 1}}', '$.a.b') AS j FROM source",
    "SELECT order_id FROM source ORDER BY order_id",
    "SELECT order_id, 'rand() now() $x' AS t FROM source /* rand() */ -- current_user()",
]


@pytest.mark.parametrize("text", DETERMINISTIC)
def test_deterministic_transforms_are_accepted_and_reprinted_stably(text):
    reprinted = check_spark_transform(text, COLUMNS)
    assert check_spark_transform(reprinted, COLUMNS) == reprinted


# A selection run in Spark: each re-printed text is valid Spark SQL with the rows of the original.
IN_SPARK = [DETERMINISTIC[k] for k in (1, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 21, 23, 27, 28, 30, 31, 32, 33, 36, 37, 39, 40, 45)]


@pytest.mark.parametrize("text", IN_SPARK)
def test_the_reprinted_text_runs_in_spark_with_the_rows_of_the_original(spark_source, text):
    assert rows(spark_source, check_spark_transform(text, COLUMNS)) == rows(spark_source, text)


def test_a_decimal_sum_and_a_sorted_list_give_the_expected_rows_in_spark(spark_source):
    text = """SELECT customer_id, sum(amount) AS total, sort_array(collect_list(status)) AS statuses
              FROM source GROUP BY customer_id"""
    assert rows(spark_source, check_spark_transform(text, COLUMNS)) == [
        (10, Decimal("19.75"), ["new", "paid"]), (20, Decimal("96.90"), ["new,x"]), (30, Decimal("0.01"), ["été;--x"])]


def test_time_stamps_kept_as_instants_give_the_expected_rows_in_spark(spark_source):
    text = ("SELECT order_id, unix_micros(updated_at) AS us, hour(seen_at) AS h FROM source "
            "WHERE updated_at >= TIMESTAMP '2024-01-03 00:00:00Z'")
    reprinted = check_spark_transform(text, COLUMNS)
    assert "CAST('2024-01-03 00:00:00Z' AS TIMESTAMP)" in reprinted
    assert rows(spark_source, reprinted) == [(4, 1704286800000000, 13), (5, 1704376800000000, 14)]


def test_double_quotes_are_string_literals_and_backticks_are_names_in_spark(spark_source):
    reprinted = check_spark_transform('SELECT order_id, "status" AS `the status` FROM source WHERE order_id = 1',
                                      COLUMNS)
    assert reprinted == "SELECT `order_id`, 'status' AS `the status` FROM `source` WHERE `order_id` = 1"
    assert rows(spark_source, reprinted) == [(1, "status")]
    assert spark_source.sql(reprinted).columns == ["order_id", "the status"]


def test_a_cte_named_source_shadows_the_snapshot_in_spark_as_in_the_guard(spark_source):
    text = "WITH source AS (SELECT order_id, qty * 10 AS qty FROM source) SELECT sum(qty) AS s FROM source"
    assert rows(spark_source, check_spark_transform(text, COLUMNS)) == [(130,)]


def test_a_cte_read_before_it_is_defined_is_not_the_cte_in_spark_as_in_the_guard(spark_source):
    """Inside ``a``, ``source`` is the snapshot (the CTE ``source`` is defined after ``a``): its
    ``qty`` is an integer, and the sum exact."""
    text = "WITH a AS (SELECT qty FROM source), source AS (SELECT 1.5D AS qty) SELECT sum(qty) AS s FROM a"
    assert rows(spark_source, check_spark_transform(text, COLUMNS)) == [(13,)]
    problem = only("WITH source AS (SELECT 1.5D AS qty), a AS (SELECT qty FROM source) SELECT sum(qty) AS s FROM a")
    assert (problem.kind, problem.construct) == ("equal-but-different", "sum()")


def test_spark_substitutes_a_variable_inside_a_string_literal(spark_source):
    """Why ${...} is refused: Spark replaces it from its configuration before parsing."""
    assert rows(spark_source, "SELECT '${spark.sql.session.timeZone}' AS v") == [("UTC",)]
    problem = only("SELECT order_id, '${spark.sql.session.timeZone}' AS v FROM source")
    assert (problem.kind, problem.construct, problem.line, problem.column) == ("session", "${...}", 1, 19)


def test_unicode_and_a_literal_with_a_semicolon_and_dashes_are_one_statement():
    text = "SELECT order_id, 'ä;ö -- ü' || status AS t FROM source WHERE status <> 'x;y' -- done"
    reprinted = check_spark_transform(text, COLUMNS)
    assert "'ä;ö -- ü'" in reprinted and "done" not in reprinted
    # Columns count characters, not bytes: rand() follows 23 characters (35 bytes).
    problem = only("SELECT 'éééééééééééé' AS e, rand() AS r FROM source")
    assert (problem.line, problem.column) == (1, 29)


# --- the shape: SpecError --------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("SELECT order_id FROM source; SELECT status FROM source", "exactly one SELECT statement; it has 2"),
    ("", "exactly one SELECT statement; it has 0"),
    ("-- nothing but a comment", "exactly one SELECT statement; it has 0"),
    ("INSERT INTO t SELECT order_id FROM source", "must be a SELECT; it is an INSERT"),
    ("INSERT OVERWRITE TABLE t SELECT order_id FROM source", "must be a SELECT; it is an INSERT"),
    ("CREATE TABLE t AS SELECT order_id FROM source", "must be a SELECT; it is a CREATE"),
    ("SET spark.sql.session.timeZone = UTC", "must be a SELECT; it is a SET"),
    ("CACHE TABLE source", "must be a SELECT; it is a CACHE"),
    ("EXPLAIN SELECT order_id FROM source", "must be a SELECT; it is an EXPLAIN"),
    ("(SELECT order_id FROM source)", "must be a SELECT; it is a parenthesised query"),
    ("SELECT order_id INTO t FROM source", "SELECT ... INTO at line 1, column"),
    ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 AS n FROM r WHERE n < 3) SELECT n FROM r",
     "WITH RECURSIVE"),
    ("SELECT order_id FROM orders", "it reads orders at line 1, column 22"),
    ("SELECT order_id FROM source JOIN other USING (order_id)", "it reads other"),
    ("WITH a AS (SELECT order_id FROM source) SELECT order_id FROM b", "it reads b"),
    # A CTE is visible after it is defined only: here ``b`` would be a table of the catalog.
    ("WITH a AS (SELECT * FROM b), b AS (SELECT * FROM source) SELECT * FROM a", "it reads b at line 1, column 26"),
    ("SELECT order_id FROM default.source", "it reads default.source at line 1, column 22"),
    ("SELECT order_id FROM spark_catalog.default.source", "a qualified table"),
    ("SELECT order_id FROM global_temp.source", "it reads global_temp.source"),
    ("SELECT * FROM parquet.`/data/orders`", "it reads parquet.`/data/orders`"),
    ("SELECT * FROM json.`s3://bucket/x.json`", "a qualified table is a table of the catalog (or a file)"),
    ("SELECT * FROM range(3)", "the table function RANGE(3) at line 1, column 15"),
    ("SELECT * FROM explode(array(1, 2))", "the table function EXPLODE"),
    ("SELECT * FROM IDENTIFIER('source')", "the table function IDENTIFIER"),
    ("SELECT order_id FROM source TABLESAMPLE (10 PERCENT)", "TABLESAMPLE at line 1, column 29"),
    ("SELECT order_id FROM source TABLESAMPLE (5 ROWS)", "TABLESAMPLE"),
    ("SELECT order_id FROM source TABLESAMPLE (BUCKET 1 OUT OF 4)", "TABLESAMPLE"),
    ("SELECT order_id FROM source VERSION AS OF 3", "time travel (VERSION / TIMESTAMP AS OF)"),
    ("SELECT order_id FROM source TIMESTAMP AS OF '2024-01-01'", "time travel"),
    ("SELECT /*+ BROADCAST(source) */ order_id FROM source", "a hint (/*+ ... */) at line 1, column 8"),
    ("SELECT /*+ REPARTITION(4) */ order_id FROM source", "a hint"),
    ("SELECT ? AS p FROM source", "a parameter"),
    ("SELECT :limit AS p FROM source", "a parameter"),
    ("SELECT ${var} AS p FROM source", "a parameter"),
    ("SELECT order_id, upper(status) FROM source", "the computed column at line 1, column 18"),
    ("SELECT order_id, 1 FROM source", "has no name: write it with AS"),
    ("WITH t AS (SELECT order_id + 1 FROM source) SELECT * FROM t", "the computed column at line 1, column 19"),
    ("SELECT * FROM (SELECT instr(status, 'a') FROM source) AS t", "has no name"),
])
def test_the_shape_is_refused_as_a_spec_error(text, message):
    assert message in spec_error(text)


def test_a_scalar_subquery_and_later_branches_of_a_union_need_no_names():
    check_spark_transform("SELECT order_id, (SELECT max(qty) FROM source) AS m FROM source", COLUMNS)
    check_spark_transform("SELECT order_id AS o FROM source UNION ALL SELECT order_id + 100 FROM source", COLUMNS)


def test_a_parse_error_names_sqlglots_message_and_the_position():
    message = spec_error("SELECT order_id\nFROM source\nWHERE (order_id > 1")
    assert message.startswith("transform_sql does not parse: sqlglot says")
    assert "at line 3" in message


def test_a_statement_that_does_not_resolve_is_a_spec_error():
    message = spec_error("SELECT no_such_column FROM source")
    assert "does not resolve against source (order_id bigint, customer_id bigint" in message
    assert "no_such_column" in message


def test_a_refusal_visible_in_the_parse_tree_is_reported_even_if_the_columns_do_not_resolve():
    problem = only("SELECT no_such_column, rand() AS r FROM source")
    assert (problem.kind, problem.construct) == ("volatility", "rand()")


# --- refusals: TransformError, each construct with its place ------------------------------------

MULTI_LINE = """SELECT order_id,
       amount,
           rand() AS r
FROM source"""


def test_a_refusal_names_the_construct_its_line_and_column_and_what_to_do():
    problem = only(MULTI_LINE)
    assert (problem.kind, problem.construct, problem.line, problem.column) == ("volatility", "rand()", 3, 12)
    assert problem.snippet == "rand() AS r"
    assert "not deterministic" in problem.problem and "xxhash64()" in problem.instead
    assert "rand() at line 3, column 12 (`rand() AS r`)" in problem.describe()


@pytest.mark.parametrize("expr, kind, construct", [
    # Not deterministic, whatever the spelling.
    ("rand()", "volatility", "rand()"),
    ("RAND(42)", "volatility", "rand()"),
    ("Random()", "volatility", "random()"),
    ("`rand`()", "volatility", "rand()"),
    ("randn()", "volatility", "randn()"),
    ("uuid()", "volatility", "uuid()"),
    ("shuffle(array(1, 2))", "volatility", "shuffle()"),
    ("monotonically_increasing_id()", "volatility", "monotonically_increasing_id()"),
    ("spark_partition_id()", "volatility", "spark_partition_id()"),
    ("input_file_name()", "volatility", "input_file_name()"),
    ("input_file_block_start()", "volatility", "input_file_block_start()"),
    ("reflect('java.util.UUID', 'randomUUID')", "volatility", "reflect()"),
    ("java_method('java.lang.Math', 'random')", "volatility", "java_method()"),
    ("try_reflect('java.lang.Math', 'random')", "volatility", "try_reflect()"),
    # The clock, as a function and as a keyword.
    ("now()", "volatility", "now()"),
    ("current_timestamp()", "volatility", "current_timestamp()"),
    ("CURRENT_TIMESTAMP", "volatility", "current_timestamp"),
    ("current_date()", "volatility", "current_date()"),
    ("current_date", "volatility", "current_date"),
    ("curdate()", "volatility", "curdate()"),
    ("localtimestamp", "volatility", "localtimestamp"),
    ("unix_timestamp()", "volatility", "unix_timestamp()"),
    # The session.
    ("current_user()", "session", "current_user()"),
    ("user()", "session", "user()"),
    ("user", "session", "user"),
    ("session_user()", "session", "session_user()"),
    ("current_database()", "session", "current_database()"),
    ("current_schema()", "session", "current_schema()"),
    ("current_catalog()", "session", "current_catalog()"),
    ("version()", "session", "version()"),
    ("current_timezone()", "session", "current_timezone()"),
])
def test_functions_of_chance_the_clock_or_the_session_are_refused(expr, kind, construct):
    problem = only(f"SELECT order_id,\n  {expr} AS v\nFROM source")
    assert (problem.kind, problem.construct) == (kind, construct)
    assert (problem.line, problem.column) == (2, 3)


def test_a_column_named_like_a_keyword_must_be_qualified():
    columns = [*COLUMNS, ("user", "string")]
    problem = refused("SELECT user AS u FROM source")[0]
    assert problem.construct == "user" and "source.user" in problem.instead
    assert check_spark_transform("SELECT s.user AS u FROM source AS s", columns) == (
        "SELECT `s`.`user` AS `u` FROM `source` AS `s`")


@pytest.mark.parametrize("expr, construct", [
    # Conversions of a TIMESTAMP (LTZ) to or from text and dates, written or implicit.
    ("CAST(updated_at AS STRING)", "CAST(... AS STRING)"),
    ("CAST(updated_at AS DATE)", "CAST(... AS DATE)"),
    ("updated_at::date", "CAST(... AS DATE)"),
    ("date(updated_at)", "date()"),
    ("CAST(updated_at AS TIMESTAMP_NTZ)", "CAST(... AS TIMESTAMP_NTZ)"),
    ("CAST(seen_at AS TIMESTAMP)", "CAST(... AS TIMESTAMP)"),
    ("CAST(order_date AS TIMESTAMP)", "CAST(... AS TIMESTAMP)"),
    ("CAST(status AS TIMESTAMP)", "CAST(... AS TIMESTAMP)"),
    ("TIMESTAMP '2024-01-01 00:00:00'", "CAST(... AS TIMESTAMP)"),
    ("to_date(updated_at)", "to_date()"),
    ("to_date(status, 'yyyy-MM-dd')", "to_date()"),
    ("year(updated_at)", "year()"),
    ("dayofweek(updated_at)", "dayofweek()"),
    ("datediff(updated_at, order_date)", "datediff()"),
    ("extract(YEAR FROM updated_at)", "extract()"),
    ("extract(HOUR FROM order_date)", "extract()"),
    ("date_part('day', updated_at)", "date_part()"),
    ("hour(updated_at)", "hour()"),
    ("minute(order_date)", "minute()"),
    ("concat(updated_at, '')", "concat()"),
    ("upper(updated_at)", "upper()"),
    ("coalesce(updated_at, order_date)", "coalesce()"),
    ("updated_at > '2024-01-01'", ">"),
    ("updated_at = order_date", "="),
    ("updated_at IN ('2024-01-01')", "IN"),
    ("updated_at + INTERVAL 1 DAY", "+"),
    ("order_date + INTERVAL 1 HOUR", "+"),
    ("CASE WHEN flag THEN updated_at ELSE 'never' END", "CASE"),
    ("unix_micros(seen_at)", "unix_micros()"),
    ("sequence(order_date, order_date)", "sequence()"),
    # Functions that read the time zone whatever their arguments.
    ("date_format(order_date, 'yyyy')", "date_format()"),
    ("from_unixtime(order_id)", "from_unixtime()"),
    ("to_timestamp(status, 'yyyy-MM-dd')", "to_timestamp()"),
    ("unix_timestamp(status)", "unix_timestamp()"),
    ("to_unix_timestamp(status)", "to_unix_timestamp()"),
    ("date_trunc('DAY', updated_at)", "date_trunc()"),
    ("make_timestamp(2024, 1, 1, 0, 0, 0)", "make_timestamp()"),
    ("to_timestamp_ltz(status)", "to_timestamp_ltz()"),
    ("months_between(order_date, order_date)", "months_between()"),
    ("to_json(named_struct('t', updated_at))", "to_json()"),
    ("from_utc_timestamp(updated_at, status)", "from_utc_timestamp()"),
])
def test_what_reads_the_session_time_zone_is_refused(expr, construct):
    problem = only(f"SELECT order_id,\n  {expr} AS v\nFROM source")
    assert (problem.kind, problem.construct) == ("session", construct)
    assert problem.line == 2


@pytest.mark.parametrize("text", [
    "SELECT order_id FROM source WHERE updated_at > TIMESTAMP '2024-01-01 00:00:00Z'",
    "SELECT order_id FROM source WHERE updated_at < TIMESTAMP '2024-01-01T00:00:00+01:00'",
    "SELECT a.order_id FROM source AS a JOIN source AS b ON a.updated_at < b.updated_at",
    "SELECT order_id, coalesce(updated_at, timestamp_seconds(0)) AS t, hash(updated_at) AS h FROM source",
    "SELECT order_id, CAST(updated_at AS BIGINT) AS e, CAST(order_id AS TIMESTAMP) AS t FROM source",
    "SELECT customer_id, min(updated_at) AS first_seen, count(updated_at) AS n FROM source GROUP BY customer_id",
    "SELECT order_id, to_utc_timestamp(updated_at, 'America/New_York') AS t FROM source",
    "SELECT order_id, year(seen_at) AS y, hour(seen_at) AS h, CAST(seen_at AS DATE) AS d FROM source",
    "SELECT order_id, year(status) AS y, to_date(status) AS d, CAST(status AS DATE) AS d2 FROM source",
    "SELECT order_id, seen_at + INTERVAL 90 MINUTES AS s, order_date + INTERVAL 2 MONTHS AS d FROM source",
])
def test_time_stamps_that_need_no_time_zone_are_accepted(text):
    check_spark_transform(text, COLUMNS)


@pytest.mark.parametrize("text, construct, line, column", [
    ("SELECT order_id\nFROM source\nORDER BY order_id\nLIMIT 5", "LIMIT", 4, 1),
    ("SELECT order_id FROM source ORDER BY order_id\nOFFSET 1", "OFFSET", 2, 1),
    ("SELECT order_id FROM (SELECT order_id FROM source ORDER BY order_id LIMIT 1) AS t", "LIMIT", 1, 69),
    ("SELECT customer_id,\n  first(status) AS s FROM source GROUP BY 1", "first()", 2, 3),
    ("SELECT first(status, true) AS s FROM source", "first()", 1, 8),
    ("SELECT last(status) IGNORE NULLS AS s FROM source", "last()", 1, 8),
    ("SELECT any_value(status) AS s FROM source", "any_value()", 1, 8),
    ("SELECT max_by(status, order_id) AS s FROM source", "max_by()", 1, 8),
    ("SELECT min_by(status, updated_at) AS s FROM source", "min_by()", 1, 8),
    ("SELECT mode(status) AS s FROM source", "mode()", 1, 8),
    ("SELECT approx_count_distinct(status) AS s FROM source", "approx_count_distinct()", 1, 8),
    ("SELECT percentile_approx(qty, 0.5) AS s FROM source", "percentile_approx()", 1, 8),
    ("SELECT approx_percentile(qty, 0.5) AS s FROM source", "approx_percentile()", 1, 8),
    ("SELECT collect_list(status) AS s FROM source", "collect_list()", 1, 8),
    ("SELECT COLLECT_SET(status) AS s FROM source", "collect_set()", 1, 8),
    ("SELECT array_agg(status) AS s FROM source", "array_agg()", 1, 8),
    ("SELECT reverse(sort_array(collect_list(status))) AS s FROM source", None, None, None),
    ("SELECT array_sort(collect_list(status), (l, r) -> 0) AS s FROM source", "collect_list()", 1, 19),
    ("SELECT concat_ws(',', collect_list(status)) AS s FROM source", "collect_list()", 1, 23),
    ("SELECT string_agg(status, ',') AS s FROM source", "string_agg()", 1, 8),
    ("SELECT listagg(status, ',') WITHIN GROUP (ORDER BY order_id) AS s FROM source", "listagg()", 1, 8),
    ("SELECT order_id,\n  row_number() OVER (PARTITION BY customer_id ORDER BY updated_at) AS r FROM source",
     "row_number()", 2, 3),
    ("SELECT lag(amount) OVER (ORDER BY order_id) AS r FROM source", "lag()", 1, 8),
    ("SELECT lead(amount, 2) OVER (ORDER BY order_id) AS r FROM source", "lead()", 1, 8),
    ("SELECT first_value(amount) OVER (ORDER BY order_id) AS r FROM source", "first_value()", 1, 8),
    ("SELECT last_value(amount) OVER (ORDER BY order_id) AS r FROM source", "last_value()", 1, 8),
    ("SELECT nth_value(amount, 2) OVER (ORDER BY order_id) AS r FROM source", "nth_value()", 1, 8),
    ("SELECT ntile(2) OVER (ORDER BY order_id) AS r FROM source", "ntile()", 1, 8),
    ("SELECT sum(amount) OVER (ORDER BY order_date ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS r FROM source",
     "sum() OVER (ROWS ...)", 1, 8),
    ("SELECT count(*) OVER (PARTITION BY customer_id ORDER BY order_date ROWS UNBOUNDED PRECEDING) AS r FROM source",
     "count() OVER (ROWS ...)", 1, 8),
])
def test_constructs_that_depend_on_the_order_rows_arrive_in_are_refused(text, construct, line, column):
    if construct is None:  # reverse() of a sorted list is as deterministic as the sorted list
        check_spark_transform(text, COLUMNS)
        return
    problem = only(text)
    assert (problem.kind, problem.construct, problem.line, problem.column) == ("order", construct, line, column)


@pytest.mark.parametrize("text, construct, line, column", [
    ("SELECT customer_id,\n  sum(price) AS s FROM source GROUP BY 1", "sum()", 2, 3),
    ("SELECT avg(price) AS s FROM source", "avg()", 1, 8),
    ("SELECT avg(qty) AS s FROM source", "avg()", 1, 8),  # Spark averages integers in DOUBLE
    ("SELECT mean(order_id) AS s FROM source", "mean()", 1, 8),
    ("SELECT try_sum(price) AS s FROM source", "try_sum()", 1, 8),
    ("SELECT sum(amount * price) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(qty / 2) AS s FROM source", "sum()", 1, 8),  # an integer division gives a DOUBLE
    ("SELECT sum(CAST(amount AS DOUBLE)) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(1.5D) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(1e3) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(sqrt(qty)) AS s FROM source", "sum()", 1, 8),
    ("SELECT sum(coalesce(qty, price)) AS s FROM source", "sum()", 1, 8),
    ("WITH t AS (SELECT price AS p FROM source) SELECT sum(p) AS s FROM t", "sum()", 1, 50),
    ("WITH source AS (SELECT order_id, price AS qty FROM source) SELECT sum(qty) AS s FROM source", "sum()", 1, 67),
    ("SELECT sum(p) AS s FROM (SELECT price AS p FROM source UNION ALL SELECT qty AS p FROM source) AS t",
     "sum()", 1, 8),
    ("SELECT sum(v) AS s FROM source LATERAL VIEW explode(array(price)) t AS v", "sum()", 1, 8),
    ("SELECT sum(price) OVER (PARTITION BY customer_id) AS s FROM source", "sum()", 1, 8),
    ("SELECT stddev(amount) AS s FROM source", "stddev()", 1, 8),
    ("SELECT stddev_samp(qty) AS s FROM source", "stddev_samp()", 1, 8),
    ("SELECT variance(amount) AS s FROM source", "variance()", 1, 8),
    ("SELECT var_pop(amount) AS s FROM source", "var_pop()", 1, 8),
    ("SELECT corr(qty, amount) AS s FROM source", "corr()", 1, 8),
    ("SELECT covar_samp(qty, amount) AS s FROM source", "covar_samp()", 1, 8),
    ("SELECT skewness(qty) AS s FROM source", "skewness()", 1, 8),
    ("SELECT regr_slope(qty, amount) AS s FROM source", "regr_slope()", 1, 8),
    ("SELECT max(price) AS s FROM source", "max()", 1, 8),
    ("SELECT min(array(price)) AS s FROM source", "min()", 1, 8),
    ("SELECT sort_array(collect_set(price)) AS s FROM source", "collect_set()", 1, 19),
    ("SELECT listagg(CAST(price AS STRING), ',') WITHIN GROUP (ORDER BY CAST(price AS STRING)) AS s FROM source",
     None, None, None),
    ("SELECT customer_id, count(*) AS n\nFROM source GROUP BY customer_id, price", "GROUP BY price (FLOAT/DOUBLE)",
     2, 35),
    ("SELECT price, count(*) AS n FROM source GROUP BY 1", "GROUP BY price (FLOAT/DOUBLE)", 1, 8),
    ("SELECT price, count(*) AS n FROM source GROUP BY ALL", "GROUP BY price (FLOAT/DOUBLE)", 1, 8),
    ("SELECT price, count(*) AS n FROM source GROUP BY ROLLUP (price)", "GROUP BY price (FLOAT/DOUBLE)", 1, 58),
    ("SELECT DISTINCT price FROM source", "DISTINCT (FLOAT/DOUBLE)", 1, 8),
    ("SELECT DISTINCT * FROM source", "DISTINCT (FLOAT/DOUBLE)", 1, 8),
    ("SELECT price FROM source UNION SELECT price FROM source", "UNION (FLOAT/DOUBLE)", 1, 26),
    ("SELECT price FROM source INTERSECT ALL SELECT price FROM source", "INTERSECT ALL (FLOAT/DOUBLE)", 1, 26),
    ("SELECT price FROM source EXCEPT SELECT qty FROM source", "EXCEPT (FLOAT/DOUBLE)", 1, 26),
])
def test_values_equal_but_printed_differently_are_refused(text, construct, line, column):
    if construct is None:  # as text, -0.0 and 0.0 differ: the list is exact
        check_spark_transform(text, COLUMNS)
        return
    problem = only(text)
    assert (problem.kind, problem.construct, problem.line, problem.column) == (
        "equal-but-different", construct, line, column)


def test_a_float_sum_says_to_cast_to_decimal_and_an_exact_sum_is_accepted():
    problem = only("SELECT sum(price) AS s FROM source")
    assert "over FLOAT/DOUBLE" in problem.problem
    assert problem.instead.startswith("cast to DECIMAL(p,s) before summing")
    check_spark_transform("SELECT sum(CAST(price AS DECIMAL(18,6))) AS s, sum(qty) AS q, "
                          "avg(CAST(qty AS DECIMAL(20,0))) AS a FROM source", COLUMNS)


@pytest.mark.parametrize("text, construct", [
    ("SELECT my_udf(order_id) AS v FROM source", "my_udf()"),
    ("SELECT MY_UDF(order_id) AS v FROM source", "my_udf()"),
    ("SELECT default.normalise(status) AS v FROM source", "normalise()"),
    ("SELECT system.builtin.upper(status) AS v FROM source", "upper()"),
    ("SELECT percentile(qty, 0.5) AS v FROM source", "percentile()"),
    ("SELECT median(qty) AS v FROM source", "median()"),
    ("SELECT typeof(qty) AS v FROM source", "typeof()"),
    ("SELECT log10(qty) AS v FROM source", "log10()"),
    ("SELECT log2(qty) AS v FROM source", "log2()"),
    ("SELECT array_size(array(1)) AS v FROM source", "array_size()"),
    ("SELECT to_char(qty, '999') AS v FROM source", "to_char()"),
    ("SELECT parse_json(status) AS v FROM source", "parse_json()"),
    ("SELECT listagg(status) WITHIN GROUP (ORDER BY status) AS v FROM source", "listagg()"),
    ("SELECT rank() AS v FROM source", "rank()"),
    ("SELECT order_id, explode(array(1)) + 1 AS v FROM source", "explode()"),
    ("SELECT * FROM source PIVOT (sum(amount) FOR status IN ('new', 'paid'))", "PIVOT"),
    ("SELECT TRANSFORM(order_id) USING 'cat' AS (x) FROM source", "a QueryTransform construct"),
    ("SELECT order_id FROM source DISTRIBUTE BY order_id", "DISTRIBUTE BY"),
    ("SELECT order_id FROM source SORT BY order_id", "SORT BY"),
    ("SELECT order_id FROM source CLUSTER BY order_id", "CLUSTER BY"),
    ("SELECT order_id FROM source s, LATERAL (SELECT s.order_id AS x) t", "LATERAL"),
    ("SELECT x FROM source LATERAL VIEW json_tuple(status, 'a') t AS x", "LATERAL"),
])
def test_what_the_guard_does_not_know_is_refused_as_untrusted(text, construct):
    problem = refused(text)[0]
    assert (problem.kind, problem.construct) == ("untrusted", construct)


def test_a_named_window_is_refused():
    got = {(p.kind, p.construct) for p in refused(
        "SELECT sum(qty) OVER w AS s FROM source WINDOW w AS (PARTITION BY customer_id)")}
    assert got == {("untrusted", "OVER"), ("untrusted", "WINDOW")}


@pytest.mark.parametrize("text, construct", [
    # Refusals inside CTEs, subqueries, set operations, lambdas, comments apart.
    ("WITH t AS (SELECT order_id, uuid() AS u FROM source) SELECT order_id FROM t", "uuid()"),
    ("SELECT order_id FROM source WHERE qty > (SELECT avg(price) FROM source)", "avg()"),
    ("SELECT order_id FROM source WHERE EXISTS (SELECT 1 AS one FROM source AS s WHERE rand() > 0.5)", "rand()"),
    ("SELECT order_id FROM source UNION ALL SELECT order_id FROM source WHERE now() > updated_at", "now()"),
    ("SELECT transform(array(qty), x -> x + rand()) AS v FROM source", "rand()"),
    ("SELECT order_id -- a comment\n, /* block */ rand() AS r FROM source", "rand()"),
])
def test_refusals_are_found_anywhere_in_the_statement(text, construct):
    assert construct in [p.construct for p in refused(text)]


def test_several_problems_are_reported_together_in_the_order_of_the_text():
    text = """SELECT customer_id,
       first(status) AS s,
       sum(price) AS p,
       now() AS t,
       current_user() AS u,
       my_udf(1) AS m,
       date_format(order_date, 'yyyy') AS f
FROM source
GROUP BY customer_id
LIMIT 3"""
    with pytest.raises(TransformError) as caught:
        check_spark_transform(text, COLUMNS)
    got = [(p.kind, p.construct, p.line) for p in caught.value.problems]
    assert got == [
        ("order", "first()", 2), ("equal-but-different", "sum()", 3), ("volatility", "now()", 4),
        ("session", "current_user()", 5), ("untrusted", "my_udf()", 6), ("session", "date_format()", 7),
        ("order", "LIMIT", 10),
    ]
    message = str(caught.value)
    assert message.startswith("transform_sql is refused: 7 construct(s)")
    assert "1. first() at line 2, column 8" in message and "7. LIMIT at line 10, column 1" in message


def test_source_columns_are_checked_and_a_type_the_guard_cannot_read_is_of_an_unknown_kind():
    with pytest.raises(SpecError, match="no columns"):
        check_spark_transform("SELECT 1 AS one", [])
    with pytest.raises(SpecError, match="not a column the guard can check"):
        check_spark_transform("SELECT order_id FROM source", [("order_id", "bigint"), ("ORDER_ID", "int")])
    # Nothing is built from a type text: one the guard cannot read makes the column's kind unknown.
    columns = [("order_id", "bigint"), ("odd", "bigint); DROP TABLE x; --"), ("nothing", "void"),
               ("tags", "struct<my tag:string>")]
    assert check_spark_transform("SELECT order_id, odd, nothing, tags FROM source", columns) == (
        "SELECT `order_id`, `odd`, `nothing`, `tags` FROM `source`")
    with pytest.raises(TransformError) as caught:
        check_spark_transform("SELECT max(odd) AS m, CAST(tags AS STRING) AS t FROM source", columns)
    got = [(p.kind, p.construct) for p in caught.value.problems]
    assert got == [("equal-but-different", "max()"), ("session", "CAST(... AS STRING)")]
    assert "a kind the guard cannot learn" in caught.value.problems[0].problem
