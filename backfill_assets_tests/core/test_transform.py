"""transform_sql: one SELECT reading only the snapshot, using only IMMUTABLE functions."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.transform import (
    referenced_oids, validate_transform_in_catalog, validate_transform_text,
)
from backfill_assets_tests.conftest import make_spec

COLS = "order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note"


def transform_with(expr: str) -> str:
    """A transform_sql text (the user's input, validated before use) with one extra column."""
    return " ".join(["SELECT", COLS + ",", expr, "AS extra FROM source"])


def _catalog_check(conn, transform: str) -> None:
    spec = make_spec()
    source_cols = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'public.orders_raw'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum").fetchall()]
    validate_transform_in_catalog(
        conn, spec.source_ref, source_cols, spec.partition_key, spec.input_columns,
        validate_transform_text(transform),
    )


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
        # An I/O coercion calls the result type's input function, which reads DateStyle.
        ("status::timestamptz", "timestamptz_in(cstring,oid,integer)"),
        ("sum(amount) OVER (ORDER BY clock_timestamp())", "clock_timestamp()"),
    ],
)
def test_non_immutable_functions_are_refused_by_the_catalog(demo_db, expr, function):
    demo_db.execute("CREATE SEQUENCE public.s")
    demo_db.execute("CREATE FUNCTION public.my_volatile(x int) RETURNS int LANGUAGE sql VOLATILE AS 'SELECT x'")
    with pytest.raises(SpecError, match="not IMMUTABLE") as err:
        _catalog_check(demo_db, transform_with(expr))
    assert function in str(err.value)
    # Nothing persists: the temporary view was rolled back.
    assert demo_db.execute("SELECT to_regclass('backfill_assets_transform_check')").fetchone()[0] is None


def test_immutable_transform_with_percent_and_aggregates_is_accepted(demo_db):
    _catalog_check(
        demo_db,
        "SELECT order_date, order_id, customer_id % 7 AS customer_id, updated_at, ingest_seq, "
        "round(amount * 1.1, 2) AS amount, upper(status) AS status, note || '%' AS note FROM source",
    )


def test_transform_missing_a_column_is_refused(demo_db):
    with pytest.raises(SpecError, match="does not produce every needed column"):
        _catalog_check(demo_db, "SELECT order_date, order_id FROM source")


def test_transform_rejected_by_the_server_is_a_spec_error(demo_db):
    with pytest.raises(SpecError, match="rejected by the server"):
        _catalog_check(demo_db, transform_with("no_such_function(1)"))


def test_node_tree_reader_finds_functions_operators_and_io_coercions():
    tree = (
        "({QUERY :targetList ({TARGETENTRY :expr {FUNCEXPR :funcid 1299 :args <>} "
        ":resname now\\{x} {TARGETENTRY :expr {OPEXPR :opno 96 :opfuncid 0} } "
        "{COERCEVIAIO :arg {RELABELTYPE :resulttype 25} :resulttype 1184} "
        "{ROWCOMPAREEXPR :opnos (o 97 521)} {AGGREF :aggfnoid 2108}})"
    )
    assert referenced_oids(tree) == ([1299, 2108], [96, 97, 521], [1184])
