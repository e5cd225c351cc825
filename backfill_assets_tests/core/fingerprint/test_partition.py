"""Fingerprint format 3 in PostgreSQL: the golden vectors on the embedded server and on the
machine's own PostgreSQL with default settings, readings and digest in one parallel aggregate,
the digest of rows as they are written, and the order-independent source digest."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from backfill_assets.core.fingerprint import rows
from backfill_assets.core.fingerprint.partition import (
    fields,
    fingerprint_partition,
    fingerprint_partitions,
    partitions_digest,
    rows_digest,
    written,
)
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.pg.db import pin_session
from backfill_assets.core.vocabulary import TableRef
from backfill_assets_tests.core.fingerprint import golden
from backfill_assets_tests.support.servers import default_settings_server, server_folder

FILE = golden.load()
PORTABLE = TableRef("public", "golden_portable")
PG_ONLY = TableRef("public", "golden_pg_only")


def _create(conn: psycopg.Connection, ref: TableRef, section: str) -> None:
    spec = golden.PORTABLE_COLUMNS if section == "portable" else golden.POSTGRES_ONLY_COLUMNS
    conn.execute(sql.SQL("CREATE TABLE {} ({})").format(
        sqlbuild.table(ref), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t, *_ in spec)))


def load_golden(conn: psycopg.Connection) -> None:
    """Both golden tables, rows inserted in reverse (physical order is not key order)."""
    _create(conn, PORTABLE, "portable")
    names = [n for n, *_ in golden.PORTABLE_COLUMNS]
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sqlbuild.table(PORTABLE), sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.Placeholder() * len(names)))
    with conn.cursor() as cur:
        cur.executemany(insert, [[golden.decode(v) for v in r["values"]] for r in reversed(FILE["portable"]["rows"])])
    _create(conn, PG_ONLY, "postgres_only")
    names = [n for n, *_ in golden.POSTGRES_ONLY_COLUMNS]
    # Literals cast by the server to each column's type.
    insert = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
        sqlbuild.table(PG_ONLY), sql.SQL(", ").join(map(sql.Identifier, names)),
        sql.SQL(", ").join(sql.SQL("{}::{}").format(sql.Placeholder(), sql.SQL(t)) for _, t, *_ in golden.POSTGRES_ONLY_COLUMNS))
    with conn.cursor() as cur:
        cur.executemany(insert, list(reversed(FILE["postgres_only"]["literals"])))


def check_golden(conn: psycopg.Connection) -> None:
    """Row texts, row hashes and readings of both golden tables equal the file's."""
    for ref, section, total in ((PORTABLE, "portable", "amount"), (PG_ONLY, "postgres_only", None)):
        cols = table_columns(conn, ref)
        assert [rows.kind_of(c) for c in cols] == [c["kind"] for c in FILE[section]["columns"]]
        query = sql.SQL("SELECT {text}, encode(sha256(convert_to({text}, 'UTF8')), 'hex') FROM {rel} AS t").format(
            text=sqlbuild.row_text("t", fields(cols), True), rel=sqlbuild.table(ref))
        got = conn.execute(query).fetchall()
        assert sorted(map(list, got)) == sorted([r["text"], r["hash"]] for r in FILE[section]["rows"])
        fp = fingerprint_partition(conn, ref, cols, "p", ["k"], total, 1, utf8=True)
        assert fp.as_dict() == FILE[section]["readings"]


@pytest.fixture
def golden_db(conn: psycopg.Connection) -> psycopg.Connection:
    load_golden(conn)
    return conn


def test_the_golden_vectors_in_the_embedded_postgresql(golden_db):
    check_golden(golden_db)


@pytest.fixture(scope="module")
def default_server() -> Iterator[str]:
    with server_folder("pgdefault") as folder, default_settings_server(folder / "server") as url:
        yield url


@pytest.mark.postgres
def test_the_golden_vectors_in_the_machines_postgresql_with_default_settings(default_server):
    with psycopg.connect(default_server, autocommit=True) as conn:
        version = conn.execute(b"SHOW server_version").fetchone()[0]
        pin_session(conn)
        conn.execute(b"DROP TABLE IF EXISTS public.golden_portable, public.golden_pg_only")
        load_golden(conn)
        check_golden(conn)
    assert not version.startswith("16.2")  # another server than the embedded one


def test_the_digest_does_not_depend_on_the_session_settings_once_pinned(golden_db, db_url):
    options = ("-c TimeZone=Asia/Tokyo -c DateStyle=SQL,DMY -c IntervalStyle=iso_8601 "
               "-c extra_float_digits=-3 -c bytea_output=escape")
    cols = table_columns(golden_db, PG_ONLY)
    with psycopg.connect(db_url.reveal(), autocommit=True, options=options) as other:
        unpinned = fingerprint_partition(other, PG_ONLY, cols, "p", ["k"], None, 1, utf8=True)
        pin_session(other)
        check_golden(other)
    # The settings matter (intervals and reals print by them): unpinned, another digest.
    assert unpinned.content_hash != FILE["postgres_only"]["readings"]["content_hash"]


def test_an_empty_partition_is_the_preamble_count_and_zero_sums(golden_db):
    cols = table_columns(golden_db, PORTABLE)
    empty = fingerprint_partition(golden_db, PORTABLE, cols, "p", ["k"], "amount", 2, utf8=True)
    assert empty == rows.Fingerprint(0, 0, 0, "0", rows.content_hash(cols, 0, [0] * rows.SLICES))
    # Several partitions in one aggregate, in the order asked for, the missing ones empty.
    assert fingerprint_partitions(golden_db, PORTABLE, cols, "p", ["k"], "amount", [2, 1], utf8=True) == [
        empty, rows.Fingerprint(**FILE["portable"]["readings"])]


def test_the_digest_is_one_parallel_aggregate_that_hashes_each_row_once(golden_db):
    # Enough rows for a parallel plan when parallel work is made free.
    golden_db.execute(b"INSERT INTO public.golden_portable (p, k, note) SELECT 3, g, md5(g::text) "
                      b"FROM generate_series(1, 20000) AS g")
    golden_db.execute(b"ANALYZE public.golden_portable")
    cols = table_columns(golden_db, PORTABLE)
    query, params = sqlbuild.partition_readings(PORTABLE, fields(cols), "p", ["k"], "amount", [1, 3], utf8=True)
    serial = fingerprint_partitions(golden_db, PORTABLE, cols, "p", ["k"], "amount", [1, 3], utf8=True)
    with golden_db.transaction():
        for setting in ("parallel_setup_cost", "parallel_tuple_cost", "min_parallel_table_scan_size"):
            golden_db.execute(sql.SQL("SELECT set_config({}, '0', true)").format(sql.Literal(setting)))
        golden_db.execute(b"SELECT set_config('max_parallel_workers_per_gather', '2', true)")
        plan = "\n".join(r[0] for r in golden_db.execute(sql.SQL("EXPLAIN (VERBOSE) ") + query, params).fetchall())
        parallel = fingerprint_partitions(golden_db, PORTABLE, cols, "p", ["k"], "amount", [1, 3], utf8=True)
    assert "Gather" in plan and "Partial" in plan
    # The scan computes the hash once per row; the slices refer to it (the inlining trap:
    # without the volatile column the planner copies the hash into each slice's sum).
    scan_outputs = [line for line in plan.splitlines() if "Output:" in line and "PARTIAL" not in line
                    and "sha256" in line and "sum(" not in line]
    assert len(scan_outputs) == 1 and scan_outputs[0].count("sha256(") == 1
    assert parallel == serial
    assert serial[0].as_dict() == FILE["portable"]["readings"]


def test_readings_count_nulls_duplicates_and_total(conn):
    conn.execute("CREATE TABLE public.r (p int, k int, amount numeric(8,2))")
    conn.execute(
        "INSERT INTO public.r (p, k, amount) VALUES (1, 1, 1.10), (1, 1, 2.00), (1, 1, 0.01), "
        "(1, NULL, 5.00), (1, 2, NULL), (2, 1, 100.00), (3, 1, NULL)"
    )
    ref = TableRef("public", "r")
    cols = table_columns(conn, ref)
    one, two, three = fingerprint_partitions(conn, ref, cols, "p", ["k"], "amount", [1, 2, 3], utf8=True)
    assert (one.row_count, one.null_key_count, one.duplicate_key_count, one.total) == (5, 1, 2, "8.11")
    assert (two.row_count, two.duplicate_key_count, two.total) == (1, 0, "100.00")
    assert three.total == "0"  # only NULLs to add up, as for no rows


def test_column_types_are_part_of_the_digest(conn):
    for name, t in (("a", "text"), ("b", "varchar(10)"), ("c", "numeric(12,2)"), ("d", "numeric(14,2)"),
                    ("e", "integer"), ("f", "bigint")):
        conn.execute(sql.SQL("CREATE TABLE {} (p int, k int, v {})").format(sql.Identifier("public", name), sql.SQL(t)))
        conn.execute(sql.SQL("INSERT INTO {} (p, k, v) VALUES (1, 1, '1')").format(sql.Identifier("public", name)))
    digest = {}
    for name in "abcdef":
        ref = TableRef("public", name)
        digest[name] = fingerprint_partition(conn, ref, table_columns(conn, ref), "p", ["k"], None, 1, utf8=True).content_hash
    # A varchar's length limit is a constraint, not part of a value: text and varchar(n) agree.
    assert digest["a"] == digest["b"]
    assert len({digest["a"], digest["c"], digest["d"], digest["e"], digest["f"]}) == 5


def test_a_build_is_fingerprinted_as_it_is_written(conn):
    conn.execute("CREATE TABLE public.w (p int, k int, t text, x float8, amount numeric(8,2))")
    conn.execute("CREATE UNIQUE INDEX ON public.w (p, k)")
    ref = TableRef("public", "w")
    cols = table_columns(conn, ref)
    insert = (sql.SQL("INSERT INTO public.w (p, k, t, x, amount) SELECT 1, g, repeat('é', mod(g, 7)), g / 3.0, g "
                      "FROM generate_series(1, 500) AS g"), {})
    with conn.transaction():
        got = written(conn, insert, cols, ["k"], "amount", utf8=True)
        read_back = fingerprint_partition(conn, ref, cols, "p", ["k"], "amount", 1, utf8=True, key_unique=True)
    assert got == read_back and got.row_count == 500


# Values that compare equal yet print differently, NULLs, unicode, control characters and long
# text: a source's digest must depend on the rows only, not their order.
_SNAP_DDL = sql.SQL(
    "CREATE TABLE {} (p int, k bigint, f float8, n numeric, s numeric(8,2), i interval, "
    "t text, ts timestamptz, j jsonb)"
)
_SNAP_INSERT = sql.SQL("INSERT INTO {} (p, k, f, n, s, i, t, ts, j) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)")
_SNAP_ROWS = [
    (1, 1, 0.0, "1.5", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}'),
    (1, 1, -0.0, "1.50", "1.5", "24 hours", "a", "2024-01-01 01:00+01", '{"a": 1}'),
    (1, 1, 0.0, "1.5", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}'),  # an exact copy
    (1, None, None, None, None, None, None, None, None),
    (1, 2, float("nan"), "NaN", "-0.01", "-1 mons", "é\tline\nnext ☕" + "x" * 3000, None, "[]"),
    (1, 2, float("inf"), "1e-20", "0", "0", "", "infinity", "null"),
]


def _source_digest(conn: psycopg.Connection, name: str, rows_) -> tuple[int, str]:
    ref = TableRef("public", name)
    conn.execute(_SNAP_DDL.format(sql.Identifier("public", name)))
    with conn.cursor() as cur:
        cur.executemany(_SNAP_INSERT.format(sql.Identifier("public", name)), rows_)
    cols = table_columns(conn, ref)
    whole = rows_digest(conn, ref, cols, sqlbuild.in_partition("p"), {"partition": 1}, utf8=True)
    assert partitions_digest(conn, ref, cols, "p", [1], utf8=True) == [whole]
    return whole


def test_the_source_digest_depends_on_the_rows_not_their_order(conn):
    forward = _source_digest(conn, "snap_fwd", _SNAP_ROWS)
    assert _source_digest(conn, "snap_rev", list(reversed(_SNAP_ROWS))) == forward
    shuffled = [_SNAP_ROWS[i] for i in (4, 0, 3, 5, 2, 1)]
    assert _source_digest(conn, "snap_shuf", shuffled) == forward
    # Every equal-but-different value, and a dropped copy, is a different snapshot.
    for n, (row, changed) in enumerate([
        (0, (1, 1, -0.0, "1.5", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # -0 vs 0
        (0, (1, 1, 0.0, "1.50", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # n: 1.5 vs 1.50
        (0, (1, 1, 0.0, "1.5", "1.50", "24 hours", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # 1 day vs 24 h
        (4, (1, 2, float("nan"), "NaN", "-0.01", "-1 mons", "é\tline\nnext ☕" + "x" * 2999, None, "[]")),
    ]):
        other = list(_SNAP_ROWS)
        other[row] = changed
        assert _source_digest(conn, f"snap_chg{n}", other) != forward
    assert _source_digest(conn, "snap_fewer", _SNAP_ROWS[1:]) != forward
    assert _source_digest(conn, "snap_more", _SNAP_ROWS + [_SNAP_ROWS[2]]) != forward


text_values = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)


@settings(max_examples=30)
@given(st.lists(st.tuples(text_values, st.integers(-2**31, 2**31 - 1) | st.none(), st.floats() | st.none()),
                max_size=12))
def test_the_server_agrees_with_the_reference_on_generated_rows(conn, generated):
    conn.execute("DROP TABLE IF EXISTS public.gen")
    conn.execute("CREATE TABLE public.gen (p int, k int, t text, i int, x float8)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.gen (p, k, t, i, x) VALUES (0, %s, %s, %s, %s)",
                        [(n, t, i, x) for n, (t, i, x) in enumerate(generated)])
    ref = TableRef("public", "gen")
    cols = table_columns(conn, ref)
    expected = rows.reference_readings(cols, [(0, n, t, i, x) for n, (t, i, x) in enumerate(generated)], ["k"], "i")
    assert fingerprint_partition(conn, ref, cols, "p", ["k"], "i", 0, utf8=True) == expected
