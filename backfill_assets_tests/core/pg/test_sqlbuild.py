"""SQL builders as text (golden strings) and against the real database."""

from __future__ import annotations

import datetime as dt

from backfill_assets.core.fingerprint import rows
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.sqlbuild import OrderKey
from backfill_assets.core.pg.sqlbuild.parts import order_by
from backfill_assets.core.vocabulary import TableRef

SRC = TableRef("public", "orders_raw")
STAGE = TableRef("backfill_control", "orders_daily__stage_a")


def test_the_digest_renders_each_kind_hashes_once_per_row_and_binds_the_partitions(conn):
    fields = [("k", "integer", "int8"), ("x", "double", "float8"), ("note", "text", "text"),
              ("at", "timestamp", "timestamptz")]
    query, params = sqlbuild.partition_readings(STAGE, fields, "order_date", ["k"], None, [dt.date(2024, 1, 1)], utf8=True)
    text = query.as_string(conn)
    assert text.startswith('SELECT "h"."__backfill_partition", count(*), count(*) FILTER (WHERE "h"."k" IS NULL), NULL::text, '
                           'sum(("h"."__backfill_bits" << 0)::bit(60)::bigint), ')
    assert "coalesce(\"t\".\"k\"::text, '~')" in text
    assert "encode(float8send(\"t\".\"x\"), 'hex')" in text
    assert "octet_length(\"t\".\"note\") || ':' || \"t\".\"note\"" in text
    assert "timestamptz_send(\"t\".\"at\")" in text
    assert text.count("sha256(") == 1 and "clock_timestamp() AS \"__backfill_pin\"" in text
    assert '(SELECT "t"."order_date" AS "__backfill_partition", "t"."k", ' in text
    assert text.endswith('WHERE "t"."order_date" = ANY(%(partitions)s)) AS h GROUP BY "h"."__backfill_partition"')
    assert params == {"partitions": [dt.date(2024, 1, 1)]}
    assert sqlbuild.readings.SLICES == rows.SLICES  # the SQL's slices are the specification's
    # A server in another encoding measures a text by its UTF-8 bytes, converted.
    other = sqlbuild.partition_readings(STAGE, fields, "order_date", ["k"], None, [1], utf8=False)[0].as_string(conn)
    assert "octet_length(convert_to(\"t\".\"note\", 'UTF8'))" in other


def test_order_keys_render_collation_direction_and_nulls(conn):
    keys = [
        OrderKey("a", "desc", "last", collate_c=True),
        OrderKey("b", as_text=True, nulls="first"),
    ]
    assert order_by("t", keys).as_string(conn) == (
        '"t"."a" COLLATE "C" DESC NULLS LAST, "t"."b"::text COLLATE "C" ASC NULLS FIRST'
    )


def test_build_a_uses_distinct_on_and_build_b_a_window(conn):
    input_rel = sqlbuild.input_relation(SRC, [], "d", ["d", "k", "v", "ts"], None, filtered=True)
    common = dict(stage=STAGE, input_rel=input_rel, columns=["d", "k", "v"], by="d",
                  business_key=["k"], ordering=[OrderKey("ts", "desc")], params={"partitions": [1]},
                  partition=1)
    a, pa = sqlbuild.build_stage("a", **common)
    b, pb = sqlbuild.build_stage("b", **common)
    inner = 'SELECT "s"."d", "s"."k", "s"."v", "s"."ts" FROM "public"."orders_raw" AS s WHERE "s"."d" = ANY(%(partitions)s)'
    assert a.as_string(conn) == (
        'INSERT INTO "backfill_control"."orders_daily__stage_a" ("d", "k", "v") SELECT DISTINCT ON '
        f'("i"."k") "i"."d", "i"."k", "i"."v" FROM ({inner}) AS i WHERE "i"."d" = %(partition)s '
        'AND "i"."k" IS NOT NULL ORDER BY "i"."k", "i"."ts" DESC'
    )
    assert b.as_string(conn) == (
        'INSERT INTO "backfill_control"."orders_daily__stage_a" ("d", "k", "v") SELECT "r"."d", "r"."k", '
        '"r"."v" FROM (SELECT "i"."d", "i"."k", "i"."v", row_number() OVER (PARTITION BY "i"."k" ORDER BY '
        f'"i"."ts" DESC) AS "__backfill_rank" FROM ({inner}) AS i WHERE "i"."d" = %(partition)s AND "i"."k" IS '
        'NOT NULL) AS r WHERE "r"."__backfill_rank" = 1'
    )
    assert pa == pb == {"partitions": [1], "partition": 1}


def test_transform_reads_the_snapshot_as_the_source_cte_and_escapes_percent(conn):
    rel = sqlbuild.input_relation(
        SRC, ["d", "k"], "d", ["d", "k"], "SELECT d, k % 2 AS k FROM source", filtered=False
    )
    assert rel.as_string(conn) == (
        'WITH "source" AS (SELECT "s"."d", "s"."k" FROM "public"."orders_raw" AS s) '
        'SELECT "i"."d", "i"."k" FROM (SELECT d, k %% 2 AS k FROM source) AS i'
    )


def test_hostile_identifiers_are_quoted_not_interpreted(conn):
    evil = TableRef("public", 'x"; DROP TABLE t; --')
    query, _ = sqlbuild.delete_partition(evil, "p", 1)
    assert query.as_string(conn) == 'DELETE FROM "public"."x""; DROP TABLE t; --" WHERE "p" = %(partition)s'


def test_readings_and_ties_run_on_the_database(conn):
    conn.execute("CREATE TABLE public.orders_raw (d int, k int, v text, ts int)")
    conn.execute(
        "INSERT INTO public.orders_raw (d, k, v, ts) VALUES "
        "(1, 1, 'a', 1), (1, 1, 'b', 1), (1, 2, 'x', 5), (1, 2, 'x', 5), (1, NULL, 'n', 1)"
    )
    input_rel = sqlbuild.input_relation(SRC, [], "d", ["d", "k", "v", "ts"], None, filtered=True)
    query, params = sqlbuild.ordering_ties(input_rel, "d", ["k"], ["ts"], ["v"], {"partitions": [1]})
    # Key 1 ties on ts with different v; key 2's two rows are identical, so not a tie.
    assert conn.execute(query, params).fetchall() == [("1", "1", 2, 1)]
    query, params = sqlbuild.input_report(input_rel, "d", ["k"], {"partitions": [1]})
    assert conn.execute(query, params).fetchall() == [(1, 5, 1)]
    query, params = sqlbuild.partition_readings(SRC, [("v", "text", "text")], "d", ["k"], "ts", [1], utf8=True)
    assert conn.execute(query, params).fetchone()[:4] == (1, 5, 1, "13")
    query, params = sqlbuild.duplicate_keys(SRC, "d", ["k"], [1])
    assert conn.execute(query, params).fetchall() == [(1, 2)]


def test_a_window_is_a_range_of_its_column_and_a_bucket_names_each_row(conn):
    """A window's rows are ``>= start AND < end`` of the column itself (an index serves it); the
    row's window is its bucket, ``width_bucket`` over the bound windows (grouped by as a number,
    named by the labels), a gap between them naming none."""
    from backfill_assets.core.windows import Windowing, zone

    windowing = Windowing("day", zone("America/New_York"), "timestamptz")
    by = sqlbuild.WindowsBy("at", windowing)
    query, params = sqlbuild.partition_counts(SRC, by, ["2024-03-10", "2024-03-12"])
    assert query.as_string(conn) == (
        'SELECT (%(partitions__labels)s::text[])[width_bucket("s"."at", %(partitions__bounds)s::timestamptz[])], '
        'count(*) FROM "public"."orders_raw" AS s WHERE (("s"."at" >= %(partitions__lo)s::timestamptz AND "s"."at" < '
        '%(partitions__hi)s::timestamptz) AND (%(partitions__gapless)s::boolean OR (%(partitions__labels)s::text[])'
        '[width_bucket("s"."at", %(partitions__bounds)s::timestamptz[])] IS NOT NULL)) GROUP BY width_bucket("s"."at", '
        '%(partitions__bounds)s::timestamptz[])'
    )
    utc = dt.timezone.utc
    assert params["partitions__bounds"] == [dt.datetime(2024, 3, 10, 5, tzinfo=utc), dt.datetime(2024, 3, 11, 4, tzinfo=utc),
                                            dt.datetime(2024, 3, 12, 4, tzinfo=utc), dt.datetime(2024, 3, 13, 4, tzinfo=utc)]
    assert params["partitions__labels"] == ["2024-03-10", None, "2024-03-12", None]
    assert params["partitions__gapless"] is False  # the bucket is looked up: 11 March is not asked for
    conn.execute("CREATE TABLE public.orders_raw (at timestamptz)")
    conn.execute("INSERT INTO public.orders_raw VALUES ('2024-03-10 04:59:59.999999+00'), ('2024-03-10 05:00+00'), "
                 "('2024-03-11 04:00+00'), ('2024-03-12 04:00+00'), ('2024-03-13 03:59:59+00'), ('2024-03-13 04:00+00')")
    assert sorted(conn.execute(query, params).fetchall()) == [("2024-03-10", 1), ("2024-03-12", 2)]
    query, params = sqlbuild.partition_counts(SRC, by, [])
    assert conn.execute(query, params).fetchall() == []
