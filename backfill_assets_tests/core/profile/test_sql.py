"""The key-candidate SQL builders of profile as text (golden strings) and against the real
database, on a table small enough to count by hand."""

from __future__ import annotations

import datetime as dt

from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.vocabulary import TableRef

SRC = TableRef("public", "src")
DAY = dt.date(2024, 1, 1)


def test_key_evidence_hashes_each_column_once_and_counts_per_group(conn):
    query, params = sqlbuild.key_evidence(SRC, "d", ["k"], ["v", "ts"], [DAY])
    assert query.as_string(conn) == (
        'SELECT count(*), coalesce(sum(g."__backfill_kn"), 0), count(*) FILTER (WHERE g."__backfill_kn" > 1), '
        'count(*) FILTER (WHERE g."__backfill_kv0" OR g."__backfill_kv1"), count(*) FILTER (WHERE '
        'g."__backfill_kv0"), count(*) FILTER (WHERE g."__backfill_kv1") FROM (SELECT "r"."__backfill_partition", "r"."k", '
        'count(*) AS "__backfill_kn", min(r."__backfill_kv0") <> max(r."__backfill_kv0") AS "__backfill_kv0", '
        'min(r."__backfill_kv1") <> max(r."__backfill_kv1") AS "__backfill_kv1" FROM (SELECT "s"."d" AS "__backfill_partition", "s"."k", '
        'coalesce(hashtextextended("s"."v"::text, 0), 0) AS "__backfill_kv0", '
        'coalesce(hashtextextended("s"."ts"::text, 0), 0) AS "__backfill_kv1" FROM "public"."src" AS s '
        'WHERE "s"."d" = ANY(%(partitions)s) AND "s"."k" IS NOT NULL) AS r GROUP BY "r"."__backfill_partition", "r"."k") AS g'
    )
    assert params == {"partitions": [DAY]}


def test_key_splits_hashes_once_in_a_materialized_cte(conn):
    query, params = sqlbuild.key_splits(SRC, "d", ["k"], ["v"], ["v", "ts"], [DAY])
    assert query.as_string(conn) == (
        'WITH r AS MATERIALIZED (SELECT "s"."d" AS "__backfill_partition", "s"."k", hashtextextended((ROW("s"."v", "s"."ts"))::text, 0) '
        'AS "__backfill_kh", coalesce(hashtextextended("s"."v"::text, 0), 0) AS "__backfill_ks0" FROM '
        '"public"."src" AS s WHERE "s"."d" = ANY(%(partitions)s) AND "s"."k" IS NOT NULL) SELECT '
        'p."__backfill_ki", count(*) FROM (SELECT "q"."__backfill_partition", "q"."k", q."__backfill_ki" FROM (SELECT "r"."__backfill_partition", '
        '"r"."k", x."__backfill_ki", min(r."__backfill_kh") <> max(r."__backfill_kh") AS "__backfill_kv" FROM r '
        'CROSS JOIN LATERAL (VALUES (0, r."__backfill_ks0")) AS x("__backfill_ki", "__backfill_kc") GROUP BY '
        '"r"."__backfill_partition", "r"."k", x."__backfill_ki", x."__backfill_kc") AS q GROUP BY "q"."__backfill_partition", "q"."k", '
        'q."__backfill_ki" HAVING count(*) FILTER (WHERE q."__backfill_kv") >= 2) AS p GROUP BY '
        'p."__backfill_ki" ORDER BY p."__backfill_ki"'
    )
    assert params == {"partitions": [DAY]}


def _load(conn) -> None:
    t1, t2 = dt.datetime(2024, 1, 1, 8), dt.datetime(2024, 1, 1, 9)
    rows = [
        (1, "a", t1), (1, "b", t1),  # v varies
        (2, "a", t1), (2, "a", t1),  # a copy: no version group
        (3, None, t1), (3, "x", t1),  # NULL beside a value varies too
        (4, "p", t1), (4, "p", t2), (4, "q", t1), (4, "q", t2),  # split by v: two parts that differ
        (5, "z", t2),
        (None, "n", t2),  # no key: left out
    ]
    conn.execute("CREATE TABLE public.src (d date, k int, v text, ts timestamp)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.src (d, k, v, ts) VALUES (%s, %s, %s, %s)",
                        [(DAY, *r) for r in rows])


def test_key_evidence_counts_groups_versions_and_varying_columns(conn):
    _load(conn)
    query, params = sqlbuild.key_evidence(SRC, "d", ["k"], ["v", "ts"], [DAY])
    groups, rows, multi, versions, v_varies, ts_varies = conn.execute(query, params).fetchone()
    assert (groups, rows, multi, versions) == (5, 11, 4, 3)
    assert (v_varies, ts_varies) == (3, 1)


def test_key_splits_counts_groups_with_two_parts_that_differ(conn):
    _load(conn)
    query, params = sqlbuild.key_splits(SRC, "d", ["k"], ["v", "ts"], ["v", "ts"], [DAY])
    # Split by v, only k=4 falls into two parts that each differ (in ts); split by ts, k=4
    # falls into two parts that each differ in v.
    assert conn.execute(query, params).fetchall() == [(0, 1), (1, 1)]
