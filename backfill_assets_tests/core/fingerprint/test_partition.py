"""The canonical fingerprint: golden vectors, agreement of the streamed SQL path with the
plain-Python reference, injectivity on the hard cases, and independence from session state."""

from __future__ import annotations

import hashlib

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql

from backfill_assets.core.fingerprint.partition import (
    _hash_copy_stream,
    business_key_order,
    content_hash,
    encode_row,
    exact_in_binary,
    fingerprint_partition,
    preamble,
    reference_digest,
    snapshot_rows_hash,
    sorts_disabled,
)
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.pg.db import pin_session
from backfill_assets.core.pg.sqlbuild import in_partition
from backfill_assets.core.vocabulary import TableRef

GOLDEN = TableRef("public", "golden")

GOLDEN_DDL = sql.SQL(
    "CREATE TABLE public.golden (p int, k int, t text, n numeric, f float8, ts timestamptz, "
    "b bytea, flag boolean, d date, iv interval)"
)
GOLDEN_INSERT = sql.SQL(
    "INSERT INTO public.golden (p, k, t, n, f, ts, b, flag, d, iv) VALUES "
    "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
# (k, t, n, f, ts, b, flag, d, iv) as SQL literals' text; the ts values are in other zones.
GOLDEN_ROWS = [
    (1, "a", "1.5", "0.1", "2024-01-01 12:00:00+02", b"\x00\xff", True, "2024-02-29", "1 day 02:00"),
    (2, "", "1.50", "-0", "2024-01-01 10:00:00+00", b"", False, "0001-01-01", "-3 months"),
    (3, None, None, None, None, None, None, None, None),
    (4, "NULL", "-0.000", "Infinity", "2024-06-30 23:59:59.999999-07", b"\\", True, "infinity", "0"),
    (5, "tab\tnl\ncr\r back\\slash 'q' \"dq\"", "123456789012345678901234567890.123", "-Infinity",
     "1999-12-31 23:00:00-01", b"abc", False, "2024-01-01", "1 year 2 mons"),
    (6, "café ☕ 日本語 🧾", "NaN", "NaN", "infinity", b"\n", True, "2024-01-01", "00:00:00.000001"),
]
# The same values as PostgreSQL's text output under the pinned settings.
GOLDEN_TEXT = [
    ("1", "a", "1.5", "0.1", "2024-01-01 10:00:00+00", "\\x00ff", "true", "2024-02-29", "1 day 02:00:00"),
    ("2", "", "1.50", "-0", "2024-01-01 10:00:00+00", "\\x", "false", "0001-01-01", "-3 mons"),
    ("3", None, None, None, None, None, None, None, None),
    ("4", "NULL", "0.000", "Infinity", "2024-07-01 06:59:59.999999+00", "\\x5c", "true", "infinity", "00:00:00"),
    ("5", "tab\tnl\ncr\r back\\slash 'q' \"dq\"", "123456789012345678901234567890.123", "-Infinity",
     "2000-01-01 00:00:00+00", "\\x616263", "false", "2024-01-01", "1 year 2 mons"),
    ("6", "café ☕ 日本語 🧾", "NaN", "NaN", "infinity", "\\x0a", "true", "2024-01-01", "00:00:00.000001"),
]
GOLDEN_TYPES = [
    ("k", "integer"), ("t", "text"), ("n", "numeric"), ("f", "double precision"),
    ("ts", "timestamp with time zone"), ("b", "bytea"), ("flag", "boolean"), ("d", "date"),
    ("iv", "interval"),
]
# Pinned: any change of the canonical format must change these on purpose (docs/fingerprint.md).
GOLDEN_DIGEST = "afd3f11671e163d37aaeb7523171e441c2d6ac3339b6e31db5f64ce60e154581"
EMPTY_DIGEST = "f480e1b41093bccb0695f7e2df1500e9951d424cdbe8a7722b9590d0e0f0c238"


@pytest.fixture
def golden(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute(GOLDEN_DDL)
    with conn.cursor() as cur:
        # Inserted in reverse so that physical order differs from key order.
        cur.executemany(GOLDEN_INSERT, [(7, *row) for row in reversed(GOLDEN_ROWS)])
    return conn


def _golden_hash(conn: psycopg.Connection, partition: int = 7) -> str:
    cols = [c for c in table_columns(conn, GOLDEN) if c.name != "p"]
    return content_hash(conn, GOLDEN, cols, "p", business_key_order(cols, ["k"]), partition)


def test_reference_digest_of_golden_rows_is_pinned():
    assert reference_digest(GOLDEN_TYPES, GOLDEN_TEXT) == GOLDEN_DIGEST
    assert reference_digest(GOLDEN_TYPES, []) == EMPTY_DIGEST


def test_streamed_sql_digest_equals_the_plain_python_reference(golden):
    assert _golden_hash(golden) == GOLDEN_DIGEST


def test_the_indexed_read_gives_the_same_digest_and_restores_the_planner(golden):
    golden.execute(b"CREATE UNIQUE INDEX ON public.golden (p, k)")
    cols = [c for c in table_columns(golden, GOLDEN) if c.name != "p"]
    with golden.transaction():
        golden.execute(b"SET LOCAL enable_sort = on")
        with sorts_disabled(golden):
            assert golden.execute(b"SHOW enable_sort").fetchone() == ("off",)
        assert golden.execute(b"SHOW enable_sort").fetchone() == ("on",)
        indexed = content_hash(golden, GOLDEN, cols, "p", business_key_order(cols, ["k"]), 7, indexed=True)
        assert golden.execute(b"SHOW enable_sort").fetchone() == ("on",)
        # A failed read inside a savepoint: rolling it back restores the setting too.
        with pytest.raises(psycopg.errors.DivisionByZero), golden.transaction(), sorts_disabled(golden):
            golden.execute(b"SELECT 1 / 0")
        assert golden.execute(b"SHOW enable_sort").fetchone() == ("on",)
    assert indexed == GOLDEN_DIGEST
    # Outside a transaction there is nothing to restore, and nothing is set.
    with sorts_disabled(golden):
        assert golden.execute(b"SHOW enable_sort").fetchone() == ("on",)


def test_empty_partition_digest_is_the_preamble_alone(golden):
    assert _golden_hash(golden, partition=8) == EMPTY_DIGEST
    assert EMPTY_DIGEST == hashlib.sha256(preamble(GOLDEN_TYPES)).hexdigest()
    # fingerprint_partition skips the stream of an empty partition and gives the same digest,
    # and streams a partition with rows.
    cols = [c for c in table_columns(golden, GOLDEN) if c.name != "p"]
    empty = fingerprint_partition(golden, GOLDEN, cols, "p", ["k"], None, 8)
    assert (empty.row_count, empty.content_hash) == (0, EMPTY_DIGEST)
    assert fingerprint_partition(golden, GOLDEN, cols, "p", ["k"], None, 7).content_hash == GOLDEN_DIGEST


def test_digest_does_not_depend_on_the_session_settings_once_pinned(golden, db_url):
    options = "-c TimeZone=Asia/Tokyo -c DateStyle=SQL,DMY -c IntervalStyle=iso_8601 " \
              "-c extra_float_digits=3 -c bytea_output=escape"
    with psycopg.connect(db_url.reveal(), autocommit=True, options=options) as other:
        unpinned = _golden_hash(other)
        pin_session(other)
        assert _golden_hash(other) == GOLDEN_DIGEST
    # The settings matter: without pinning the same rows give another digest.
    assert unpinned != GOLDEN_DIGEST


def test_column_types_are_part_of_the_digest(conn):
    conn.execute("CREATE TABLE public.a (p int, k int, v text)")
    conn.execute("CREATE TABLE public.b (p int, k int, v varchar(10))")
    for name in ("a", "b"):
        conn.execute(sql.SQL("INSERT INTO {} (p, k, v) VALUES (1, 1, 'x')").format(sql.Identifier("public", name)))
    digests = set()
    for name in ("a", "b"):
        ref = TableRef("public", name)
        cols = table_columns(conn, ref)
        digests.add(content_hash(conn, ref, cols, "p", business_key_order(cols, ["k"]), 1))
    assert len(digests) == 2


def test_text_keys_sort_by_bytes_not_by_locale(conn):
    # In a linguistic collation 'a' < 'B'; by bytes 'B' (0x42) < 'a' (0x61).
    conn.execute("CREATE TABLE public.tk (p int, k text, v int)")
    conn.execute("INSERT INTO public.tk (p, k, v) VALUES (1, 'a', 1), (1, 'B', 2), (1, 'é', 3)")
    ref = TableRef("public", "tk")
    cols = table_columns(conn, ref)
    got = content_hash(conn, ref, cols, "p", business_key_order(cols, ["k"]), 1)
    types = [(c.name, c.type_name) for c in cols]
    assert got == reference_digest(types, [("1", "B", "2"), ("1", "a", "1"), ("1", "é", "3")])


def test_readings_count_nulls_duplicates_and_total(conn):
    conn.execute("CREATE TABLE public.r (p int, k int, amount numeric(8,2))")
    conn.execute(
        "INSERT INTO public.r (p, k, amount) VALUES (1, 1, 1.10), (1, 1, 2.00), (1, 1, 0.01), "
        "(1, NULL, 5.00), (1, 2, NULL), (2, 1, 100.00)"
    )
    ref = TableRef("public", "r")
    fp = fingerprint_partition(conn, ref, table_columns(conn, ref), "p", ["k"], "amount", 1)
    assert (fp.row_count, fp.null_key_count, fp.duplicate_key_count, fp.total) == (5, 1, 2, "8.11")


@pytest.mark.parametrize(
    "left, right",
    [
        (("a", "bc"), ("ab", "c")),
        ((None,), ("",)),
        ((None,), ("NULL",)),
        (("",), ("NULL",)),
        (("a\tb",), ("a", "b")),
        (("1.5",), ("1.50",)),
        (("-0",), ("0",)),
        (("Infinity",), ("-Infinity",)),
        (("x\\",), ("x\\\\",)),
    ],
)
def test_distinct_rows_have_distinct_encodings(left, right):
    assert encode_row(left) != encode_row(right)


values = st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=("Cs",))))


@given(st.lists(st.lists(values, min_size=1, max_size=4), min_size=0, max_size=5),
       st.lists(st.lists(values, min_size=1, max_size=4), min_size=0, max_size=5))
def test_encoding_is_injective_on_row_sequences(a, b):
    enc = lambda rows: b"".join(encode_row(r) for r in rows)  # noqa: E731
    assert (enc(a) == enc(b)) == (a == b)


def test_copy_stream_parser_handles_arbitrary_chunking():
    body = encode_row(["x", None]) + encode_row(["", "é"])
    stream = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00" + body + b"\xff\xff"
    expected = hashlib.sha256(body).hexdigest()
    for size in (1, 2, 3, 7, 19, 20, 64, len(stream)):
        h = hashlib.sha256()
        _hash_copy_stream([stream[i:i + size] for i in range(0, len(stream), size)], h)
        assert h.hexdigest() == expected


text_values = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
)


@given(st.lists(st.tuples(text_values, st.integers(-2**31, 2**31 - 1) | st.none()), max_size=12))
def test_streamed_digest_equals_reference_for_generated_text(conn, rows):
    conn.execute("DROP TABLE IF EXISTS public.gen")
    conn.execute("CREATE TABLE public.gen (p int, k int, t text, i int)")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.gen (p, k, t, i) VALUES (0, %s, %s, %s)",
            [(n, t, i) for n, (t, i) in enumerate(rows)],
        )
    ref = TableRef("public", "gen")
    cols = table_columns(conn, ref)
    got = content_hash(conn, ref, cols, "p", business_key_order(cols, ["k"]), 0)
    expected_rows = [("0", str(n), t, None if i is None else str(i)) for n, (t, i) in enumerate(rows)]
    assert got == reference_digest([(c.name, c.type_name) for c in cols], expected_rows)


# Values that compare equal yet print differently, ties on the typed columns, NULLs, unicode,
# control characters and long text: the snapshot hash must depend on the rows only.
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


def _snapshot_hash(conn: psycopg.Connection, name: str, rows) -> str:
    ref = TableRef("public", name)
    conn.execute(_SNAP_DDL.format(sql.Identifier("public", name)))
    with conn.cursor() as cur:
        cur.executemany(_SNAP_INSERT.format(sql.Identifier("public", name)), rows)
    cols = table_columns(conn, ref)
    return snapshot_rows_hash(conn, ref, cols, in_partition("p"), {"partition": 1})[1]


def test_the_snapshot_hash_depends_on_the_rows_not_their_order(conn):
    forward = _snapshot_hash(conn, "snap_fwd", _SNAP_ROWS)
    assert _snapshot_hash(conn, "snap_rev", list(reversed(_SNAP_ROWS))) == forward
    shuffled = [_SNAP_ROWS[i] for i in (4, 0, 3, 5, 2, 1)]
    assert _snapshot_hash(conn, "snap_shuf", shuffled) == forward
    # Every equal-but-different value, and a dropped copy, is a different snapshot.
    for n, (row, changed) in enumerate([
        (0, (1, 1, -0.0, "1.5", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # -0 vs 0
        (0, (1, 1, 0.0, "1.50", "1.50", "1 day", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # n: 1.5 vs 1.50
        (0, (1, 1, 0.0, "1.5", "1.50", "24 hours", "a", "2024-01-01 00:00+00", '{"a": 1}')),  # 1 day vs 24 h
        (4, (1, 2, float("nan"), "NaN", "-0.01", "-1 mons", "é\tline\nnext ☕" + "x" * 2999, None, "[]")),
    ]):
        other = list(_SNAP_ROWS)
        other[row] = changed
        assert _snapshot_hash(conn, f"snap_chg{n}", other) != forward
    assert _snapshot_hash(conn, "snap_fewer", _SNAP_ROWS[1:]) != forward


def test_exact_columns_are_streamed_typed_and_the_others_as_text(conn):
    conn.execute(_SNAP_DDL.format(sql.Identifier("public", "snap_types")))
    forms = {c.name: exact_in_binary(c) for c in table_columns(conn, TableRef("public", "snap_types"))}
    assert forms == {"p": True, "k": True, "f": False, "n": False, "s": True, "i": False, "t": True,
                     "ts": True, "j": False}
    # A domain over plain numeric whose name looks like a declared scale is read as text.
    conn.execute(b'CREATE DOMAIN public."amt(2)" AS numeric')
    conn.execute(b'CREATE TABLE public.snap_domain (p int, a public."amt(2)", c char(3), v bpchar)')
    forms = {c.name: exact_in_binary(c) for c in table_columns(conn, TableRef("public", "snap_domain"))}
    assert forms == {"p": True, "a": False, "c": True, "v": False}
