"""One fingerprint across engines: the readings of a partition held in Arrow (read from a stage,
or back from a real Delta or Iceberg table) and computed by DuckDB equal PostgreSQL's
``fingerprint_partition`` bit for bit. The text forms core.diff compares a lake partition by are
checked against the server too: PostgreSQL itself is the oracle, never Python's repr."""

from __future__ import annotations

import datetime as dt
import math
import random
import struct
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.errors import LakeValueError, SessionNotPinnedError, SpecError
from backfill_assets.core.fingerprint.arrow import arrow_readings
from backfill_assets.core.fingerprint.kinds import lake_schema, lake_type
from backfill_assets.core.fingerprint.partition import fingerprint_partition as _fingerprint_partition
from backfill_assets.core.fingerprint.stage_arrow import read_stage_partition
from backfill_assets.core.fingerprint.texts import _pg_notation, _render_decimal, _render_float8
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order, table_columns
from backfill_assets.core.pg.db import repeatable_read
from backfill_assets.core.vocabulary import TableRef

HARD = TableRef("public", "hard")
HARD_DDL = sql.SQL(
    "CREATE TABLE public.hard (p int, k bigint, t text, n numeric(12,2), tiny numeric(20,10), "
    "f float8, ts timestamptz, d date, b bytea, flag boolean, v varchar(12), i integer)"
)
HARD_INSERT = sql.SQL(
    "INSERT INTO public.hard (p, k, t, n, tiny, f, ts, d, b, flag, v, i) "
    "VALUES (%s, %s, %s, %s, %s, %s::float8, %s, %s, %s, %s, %s, %s)"
)
LONG = ("long ✓ text \t" * 8000)[:100_000]
# (k, t, n, tiny, f, ts, d, b, flag, v, i) as SQL input text; f as float8 input text.
HARD_ROWS = [
    (-9223372036854775808, None, None, None, None, None, None, None, None, None, None),
    (1, "", "1.50", "0.0000000001", "0.1", "2024-01-01 12:00:00+02", "2024-02-29", b"\x00\xff", True, "", 0),
    (2, "NULL", "1.5", "-0.0000000005", "-0", "2024-06-30 23:59:59.999999-07", "0001-01-01", b"", False, "NULL", -2147483648),
    (3, "tab\tnl\ncr\r crlf\r\n back\\slash 'q' \"dq\" ,;", "-1.50", "0", "Infinity",
     "1999-12-31 23:00:00-01", "9999-12-31", b"\\", True, 'a,b"c\nd', 2147483647),
    (4, "café ☕ 日本語 🧾 \u200b\u0301", "0.05", "-0.0000000000", "-Infinity", "2024-03-10 02:30:00.5+05:30",
     "1970-01-01", b"\n\r,\"", False, " x ", None),
    (5, LONG, "-0.00", "1234567890.0123456789", "NaN", "0001-01-01 00:00:00+00", "1969-12-31", bytes(range(256)), None, "\\N", -1),
    (6, " \\N ", "9999999999.99", "-9999999999.9999999999", "4.1293705688494416e+16",
     "9999-12-31 23:59:59.999999+00", "2000-01-01", b"\x00", True, "é", 1),
    (7, "\x01\x7f\u0085", "-0.01", "0.5", "9007199254740993", "1969-12-31 23:59:59.999999+00", None, None, None, None, None),
    (8, "z", "-9999999999.99", "1e-10", "1e15", "1900-01-01 00:00:00.000001+00", "2024-01-01", b"z", False, "z", 5),
    (9, "Z", "0.1", "0.00001", "1e16", "2262-04-11 23:47:16.854775+00", "2024-01-01", b"Z", True, "Z", 6),
    (10, "a", "10", "0.000001", "123456789012345.6", "1677-09-21 00:12:43.145224+00", "2024-01-01", None, True, "a", 7),
    (11, "b", "0", "0.0000001", "5e-324", "2024-01-01 00:00:00+14", "2024-01-01", None, True, "b", 8),
    (12, "c", "0", "0", "2.2250738585072014e-308", "2024-01-01 00:00:00-12", "2024-01-01", None, True, "c", 9),
    (121, "cc", "0", "0", "-2.225073858507201e-308", None, None, None, None, None, None),
    (13, "d", "0", "0", "1.7976931348623157e308", None, None, None, None, None, None),
    (14, "e", "0", "0", "-1e-05", None, None, None, None, None, None),
    (15, "f", "0", "0", "0.0001", None, None, None, None, None, None),
    (16, "g", "0", "0", "1.5e16", None, None, None, None, None, None),
    (17, "h", "0", "0", "562949953421312.25", None, None, None, None, None, None),
    (18, "i", "0", "0", "140737488355328.125", None, None, None, None, None, None),
    (19, "j", "0", "0", "-1e100", None, None, None, None, None, None),
    (20, "k", "0", "0", "99999999999999.98", None, None, None, None, None, None),
    (21, "l", "0", "0", "9007199254740992", None, None, None, None, None, None),
    (9223372036854775807, "m", "0", "0", "1e-07", None, None, None, None, None, None),
]
# Pinned: the digest of the hard rows, the same whichever engine holds them.
HARD_DIGEST = "1de687da12edc640798049da6899f78b8b79ba717072df9a1e191c004aa1ab35"


def fingerprint_partition(*args, **kwargs):
    """The server's readings (the test servers are UTF8)."""
    return _fingerprint_partition(*args, utf8=True, **kwargs)


def _hard_columns(conn: psycopg.Connection) -> list[ColumnInfo]:
    return table_columns(conn, HARD)


@pytest.fixture
def hard(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute(HARD_DDL)
    with conn.cursor() as cur:
        # Inserted in reverse so that physical order differs from key order.
        cur.executemany(HARD_INSERT, [(7, *row) for row in reversed(HARD_ROWS)])
        cur.execute(HARD_INSERT, (8, 1, "other partition", None, None, None, None, None, None, None, None, None))
    return conn


def _read(conn: psycopg.Connection, rel: TableRef, columns, key, value) -> pa.Table:
    with repeatable_read(conn, read_only=True):
        return read_stage_partition(conn, rel, columns, "p", value, key)


def _delta_round_trip(table: pa.Table, path: Path, value: object) -> pa.Table:
    from deltalake import DeltaTable, write_deltalake

    write_deltalake(str(path), table, partition_by=["p"], mode="append")
    return DeltaTable(str(path)).to_pyarrow_table(filters=[("p", "=", value)])


def _iceberg_round_trip(table: pa.Table, warehouse: Path, value: object) -> pa.Table:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.expressions import EqualTo

    warehouse.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("test", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    catalog.create_namespace("lake")
    lake = catalog.create_table("lake.hard", schema=table.schema)
    lake.append(table)
    return lake.scan(row_filter=EqualTo("p", value)).to_arrow()


def test_hard_rows_give_the_same_readings_in_postgres_arrow_delta_and_iceberg(hard, tmp_path):
    cols = _hard_columns(hard)
    expected = fingerprint_partition(hard, HARD, cols, "p", ["k"], "n", 7)
    assert (expected.row_count, expected.null_key_count, expected.duplicate_key_count) == (len(HARD_ROWS), 0, 0)
    assert expected.total == "11.64"
    assert expected.content_hash == HARD_DIGEST

    table = _read(hard, HARD, cols, ["k"], 7)
    assert table.schema == lake_schema(cols)
    assert table.column("k").to_pylist() == sorted(r[0] for r in HARD_ROWS)
    assert table.column("t").to_pylist()[:3] == [None, "", "NULL"]
    assert arrow_readings(table, cols, ["k"], "n") == expected

    other = _read(hard, HARD, cols, ["k"], 8)
    delta = _delta_round_trip(pa.concat_tables([table, other]), tmp_path / "delta", 7)
    assert arrow_readings(delta, cols, ["k"], "n") == expected
    iceberg = _iceberg_round_trip(pa.concat_tables([other, table]), tmp_path / "iceberg", 7)
    assert arrow_readings(iceberg, cols, ["k"], "n") == expected


def test_readings_do_not_depend_on_physical_types_chunking_or_row_order(hard):
    cols = _hard_columns(hard)
    expected = fingerprint_partition(hard, HARD, cols, "p", ["k"], "n", 7)
    table = _read(hard, HARD, cols, ["k"], 7)
    shuffled = list(range(table.num_rows))
    random.Random(7).shuffle(shuffled)
    variants = {
        "shuffled, one row a chunk": pa.concat_tables([table.take([i]) for i in shuffled]),
        "large types, another name for UTC": table.cast(pa.schema([
            pa.field(f.name, {
                pa.string(): pa.large_string(), pa.binary(): pa.large_binary(),
                pa.timestamp("us", tz="UTC"): pa.timestamp("us", tz="+00:00"), pa.int32(): pa.int64(),
            }.get(f.type, f.type)) for f in table.schema
        ])),
        "views and dictionaries": table.set_column(
            table.schema.get_field_index("t"), "t", pc.cast(table.column("t"), pa.string_view()),
        ).set_column(table.schema.get_field_index("v"), "v", pc.dictionary_encode(table.column("v"))),
        "more columns, other order": table.select(list(reversed(table.column_names))).append_column(
            "extra", pa.array([1] * table.num_rows)),
    }
    for name, variant in variants.items():
        assert arrow_readings(variant, cols, ["k"], "n") == expected, name


def test_empty_partition_is_the_preamble_alone_and_total_zero(hard, tmp_path):
    cols = _hard_columns(hard)
    expected = fingerprint_partition(hard, HARD, cols, "p", ["k"], "n", 99)
    table = _read(hard, HARD, cols, ["k"], 99)
    assert table.num_rows == 0 and table.schema == lake_schema(cols)
    got = arrow_readings(table, cols, ["k"], "n")
    assert got == expected
    assert (got.row_count, got.total) == (0, "0")


def test_decimal_and_integer_totals_are_exact_text(conn):
    conn.execute("CREATE TABLE public.tot (p int, k int, big bigint, n numeric(38,4), s numeric(12,2))")
    conn.execute(
        "INSERT INTO public.tot (p, k, big, n, s) VALUES "
        "(1, 1, 9223372036854775807, 0.0001, 12.30), (1, 2, 9223372036854775807, 0.0001, NULL), "
        "(2, 1, -5, -0.0001, -1.00), (2, 2, 5, 0.0001, 1.00), (3, 1, NULL, NULL, NULL)"
    )
    ref = TableRef("public", "tot")
    cols = table_columns(conn, ref)
    for value in (1, 2, 3, 4):
        table = _read(conn, ref, cols, ["k"], value)
        for total in ("big", "n", "s", None):
            got = arrow_readings(table, cols, ["k"], total)
            assert got == fingerprint_partition(conn, ref, cols, "p", ["k"], total, value), (value, total)
    assert arrow_readings(_read(conn, ref, cols, ["k"], 1), cols, ["k"], "big").total == "18446744073709551614"
    assert arrow_readings(_read(conn, ref, cols, ["k"], 2), cols, ["k"], "s").total == "0.00"
    assert arrow_readings(_read(conn, ref, cols, ["k"], 3), cols, ["k"], "s").total == "0"


def test_duplicate_and_null_keys_are_counted_like_postgres_and_hash_deterministically(conn, tmp_path):
    conn.execute("CREATE TABLE public.dups (p int, a text, b int, f float8, amount numeric(8,2))")
    conn.execute(
        "INSERT INTO public.dups (p, a, b, f, amount) VALUES "
        "(1, 'x', 1, 0, 1.10), (1, 'x', 1, '-0', 2.00), (1, 'x', 1, 'NaN', 0.01), (1, 'x', 2, 1, NULL), "
        "(1, 'B', 1, 'NaN', 1), (1, 'a', 1, 'NaN', 1), (1, 'é', 1, '-0', 1), "
        "(1, NULL, 1, 0, 5.00), (1, NULL, 1, 0, 5.00), (1, 'x', NULL, NULL, 1), (1, NULL, NULL, NULL, 1), "
        "(2, 'x', 1, 0, 100.00)"
    )
    ref = TableRef("public", "dups")
    cols = table_columns(conn, ref)
    table = _read(conn, ref, cols, ["a", "b"], 1)
    for key in (["a", "b"], ["a"], ["b"], ["f"], ["f", "b"], ["b", "f"], ["a", "f"]):
        expected = fingerprint_partition(conn, ref, cols, "p", key, "amount", 1, key_unique=False)
        got = arrow_readings(table, cols, key, "amount")
        # PostgreSQL's order of tied rows is not defined, so neither is its digest there.
        assert (got.row_count, got.null_key_count, got.duplicate_key_count, got.total) == (
            expected.row_count, expected.null_key_count, expected.duplicate_key_count, expected.total
        ), key
        # Ours is a function of the rows: any order, chunking or engine gives the same.
        shuffled = table.take(list(reversed(range(table.num_rows))))
        assert arrow_readings(shuffled, cols, key, "amount") == got, key
    readings = arrow_readings(table, cols, ["a", "b"], "amount")
    assert (readings.null_key_count, readings.duplicate_key_count) == (4, 2)
    delta = _delta_round_trip(table, tmp_path / "delta", 1)
    assert arrow_readings(delta, cols, ["a", "b"], "amount") == readings
    # One duplicate fewer: other readings.
    a, b = table.column("a").to_pylist(), table.column("b").to_pylist()
    first_tied = next(i for i in range(table.num_rows) if (a[i], b[i]) == ("x", 1))
    fewer = arrow_readings(table.take([i for i in range(table.num_rows) if i != first_tied]), cols, ["a", "b"], "amount")
    assert fewer.duplicate_key_count == 1 and fewer.content_hash != readings.content_hash


def test_text_keys_sort_by_bytes_and_null_keys_last(conn):
    conn.execute("CREATE TABLE public.tk (p int, k text, j int, v text)")
    conn.execute(
        "INSERT INTO public.tk (p, k, j, v) VALUES (1, 'a', 1, 'x'), (1, 'B', 1, 'y'), (1, 'é', 1, 'z'), "
        "(1, 'a', 2, 'w'), (1, NULL, 1, 'n'), (1, '', 1, 'e'), (1, 'a', NULL, 'm'), (1, 'ab', 0, 'q')"
    )
    ref = TableRef("public", "tk")
    cols = table_columns(conn, ref)
    table = _read(conn, ref, cols, ["k", "j"], 1)
    assert table.column("k").to_pylist() == ["", "B", "a", "a", "a", "ab", "é", None]
    expected = fingerprint_partition(conn, ref, cols, "p", ["k", "j"], None, 1)
    assert expected.null_key_count == 2
    assert arrow_readings(table.take([7, 6, 5, 4, 3, 2, 1, 0]), cols, ["k", "j"], None) == expected


def test_values_longer_than_a_csv_block_and_one_column_null_rows_are_read_whole(conn):
    # pyarrow's CSV reader refuses a row longer than its block ("straddling object"); a row
    # of one NULL column is an empty line, which it skips unless told not to.
    conn.execute("CREATE TABLE public.wide (p int, k text, t text, b bytea)")
    conn.execute(
        "INSERT INTO public.wide (p, k, t, b) SELECT 1, g::text, repeat(E'x,\"\n', 1000000), "
        "decode(repeat('00ff', 1500000), 'hex') FROM generate_series(1, 3) AS g"
    )
    conn.execute("INSERT INTO public.wide (p, k, t, b) VALUES (2, NULL, NULL, NULL), (2, '', '', '')")
    ref = TableRef("public", "wide")
    cols = table_columns(conn, ref)
    table = _read(conn, ref, cols, ["k"], 1)
    assert table.column("t").to_pylist()[0] == 'x,"\n' * 1000000
    assert arrow_readings(table, cols, ["k"], None) == fingerprint_partition(conn, ref, cols, "p", ["k"], None, 1)
    only_k = [c for c in cols if c.name == "k"]
    table = _read(conn, ref, only_k, ["k"], 2)
    assert table.column("k").to_pylist() == ["", None]
    assert arrow_readings(table, only_k, ["k"], None) == fingerprint_partition(conn, ref, only_k, "p", ["k"], None, 2)


def _random_doubles(n: int, seed: int) -> list[float]:
    """Random bit patterns over the whole range, and many of the values where printers differ:
    >= 2**53 (rounding bounds can be short decimals), near powers of two and ten, subnormals."""
    rng = random.Random(seed)
    out = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 2.225073858507201e-308,
           1.7976931348623157e308, -1.7976931348623157e308, 2.0**53, 2.0**53 + 2, 2.0**63, 2.0**64]
    for k in range(-1074, 1024, 7):
        out += [2.0**k, -(2.0**k), float.fromhex(f"0x1.fffffffffffffp{k}") if k < 1023 else 1.0]
    for e in range(-30, 30):
        out += [10.0**e, float(f"1e{e}") * 9.999999999999999, float(f"5e{e}")]
    while len(out) < n:
        pick = rng.random()
        if pick < 0.4:
            out.append(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])
        elif pick < 0.7:  # the trap is densest in [2**54, 2**58): a quarter of those differ
            out.append(rng.choice([1.0, -1.0]) * float(rng.randrange(2**53, 2 ** rng.randrange(54, 66))))
        elif pick < 0.8:
            out.append(float(rng.randrange(2**53, 2**64)) * 2.0 ** rng.randrange(0, 200))
        elif pick < 0.9:
            out.append(rng.choice([1, -1]) * rng.randrange(1, 2**52) / 2.0 ** rng.randrange(1, 12))
        else:
            out.append(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(52)))[0])  # subnormal
    return [x for x in out if x == x][:n] + [float("nan"), float("inf"), float("-inf")]


def test_float8_text_equals_the_server_for_random_doubles_across_the_whole_range(conn):
    values = _random_doubles(60_000, seed=20240601)
    server = [r[0] for r in conn.execute(
        sql.SQL("SELECT x::text FROM unnest(%(v)s::float8[]) WITH ORDINALITY AS u(x, i) ORDER BY i"),
        {"v": values},
    ).fetchall()]
    arr = pa.array(values, pa.float64())
    ours: list[str] = []
    for start in range(0, len(values), 1 << 16):
        ours += [b.decode() for b in _render_float8(arr.slice(start, 1 << 16)).cast(pa.large_binary()).to_pylist()]
    wrong = [(v, o, s) for v, o, s in zip(values, ours, server) if o != s]
    assert wrong == [], f"{len(wrong)} of {len(values)} differ, e.g. {wrong[:5]}"
    # The data does hit the trap: PostgreSQL prints more digits than repr (and Arrow) ...
    longer = [(v, s) for v, s in zip(values, server) if _digits(s) > _digits(repr(v))]
    assert len(longer) > 1000
    # ... and the rule, written out in exact fractions, agrees with the server on them, and
    # on the powers of two and ten, whose rounding intervals are lopsided.
    checked = longer + list(zip(values, server))[:1500]
    assert [(v, s) for v, s in checked if pg_float8_text(v) != s] == []


def pg_float8_text(x: float) -> str:
    """The rule PostgreSQL's float8 printer follows, in exact fractions, independent of the
    vectorised code: the shortest decimal strictly inside x's rounding interval (Ryu without
    "strictly shortest" accepts no bound), the nearest to x among those, ties to even."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign, ax = ("-" if x < 0 else ""), abs(x)
    v = Fraction(ax)
    lo = v - (v - Fraction(math.nextafter(ax, 0.0))) / 2  # half the gap below (halved at 2**k)
    hi = v + Fraction(math.ulp(ax)) / 2
    j = math.floor(math.log10(ax)) + 2  # 10**j > hi: no candidate yet
    inside: list[int] = []
    while not inside:
        j -= 1
        unit = Fraction(10) ** j
        below = math.floor(v / unit)
        # Both neighbours: below a power of two the interval is lopsided, so the nearer one
        # can be outside and the other inside.
        inside = [q for q in (below, below + 1) if lo < q * unit < hi]
    q = min(inside, key=lambda c: (abs(c * unit - v), c % 2))
    return sign + _pg_notation(str(q).rstrip("0"), len(str(q)) - 1 + j)


def _digits(text: str) -> int:
    mantissa = text.split("e")[0].lstrip("-").replace(".", "").strip("0")
    return len(mantissa)


def test_float8_digest_equals_the_server_for_random_doubles(conn):
    values = _random_doubles(20_000, seed=7)
    conn.execute("CREATE TABLE public.fl (p int, k int, f float8)")
    conn.execute(
        sql.SQL("INSERT INTO public.fl (p, k, f) SELECT 1, i, x FROM unnest(%(v)s::float8[]) WITH ORDINALITY AS u(x, i)"),
        {"v": values},
    )
    ref = TableRef("public", "fl")
    cols = table_columns(conn, ref)
    assert arrow_readings(_read(conn, ref, cols, ["k"], 1), cols, ["k"], None) == fingerprint_partition(
        conn, ref, cols, "p", ["k"], None, 1)


@pytest.mark.parametrize("value, text", [
    (Decimal("0.0000000001"), "0.0000000001"),  # Arrow's own cast says 1E-10
    (Decimal("0E-10"), "0.0000000000"),  # Arrow's: 0E-10
    (Decimal("-0.0000000005"), "-0.0000000005"),
    (Decimal("-1234567890.0123456789"), "-1234567890.0123456789"),
    (Decimal("0.5"), "0.5000000000"),
    (None, None),
])
def test_decimal_text_keeps_its_scale_and_never_uses_an_exponent(conn, value, text):
    arr = pa.array([value], pa.decimal128(20, 10))
    got = _render_decimal(arr, 10).to_pylist()[0]
    assert got == text
    if value is not None:
        assert conn.execute(sql.SQL("SELECT %(v)s::numeric(20,10)::text"), {"v": value}).fetchone()[0] == text


# ---------------------------------------------------------------------------------------------
# Property: hard values agree with the server, read from PostgreSQL and after Delta and Iceberg round trips

PROP = TableRef("public", "prop")
PROP_DDL = sql.SQL(
    "CREATE TABLE public.prop (p int, k bigint, t text, n numeric(12,2), tiny numeric(20,10), f float8, "
    "ts timestamptz, d date, b bytea, flag boolean, i integer)"
)
PROP_INSERT = sql.SQL(
    "INSERT INTO public.prop (p, k, t, n, tiny, f, ts, d, b, flag, i) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_ZONES = [dt.timezone.utc, dt.timezone(dt.timedelta(hours=5, minutes=30)), dt.timezone(dt.timedelta(hours=-7)),
          dt.timezone(dt.timedelta(hours=14))]
_FLOATS = st.one_of(
    st.floats(),
    st.integers(2**53, 2**64).map(float),
    st.integers(-1074, 1023).map(lambda k: 2.0**k),
    st.floats(min_value=2.0**53, max_value=2.0**80),
    st.floats(max_value=2.2250738585072014e-308, min_value=-2.2250738585072014e-308),
)
_ROW = st.tuples(
    st.none() | st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
    st.none() | st.decimals(min_value=Decimal("-9999999999.99"), max_value=Decimal("9999999999.99"), places=2),
    st.none() | st.decimals(min_value=Decimal("-9999999999"), max_value=Decimal("9999999999"), places=10),
    st.none() | _FLOATS,
    st.none() | st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                             timezones=st.sampled_from(_ZONES)),
    st.none() | st.dates(),
    st.none() | st.binary(max_size=12),
    st.none() | st.booleans(),
    st.none() | st.integers(-(2**31), 2**31 - 1),
)


@pytest.fixture
def prop(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute(PROP_DDL)
    return conn


@given(rows=st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), _ROW), max_size=25, unique_by=lambda r: r[0]))
def test_hard_values_agree_with_postgres_in_arrow_and_after_delta_and_iceberg_round_trips(prop, tmp_path, rows):
    part = len(list(tmp_path.glob("delta*"))) + 1  # one partition per example
    with prop.cursor() as cur:
        cur.executemany(PROP_INSERT, [(part, k, *values) for k, values in rows])
    cols = table_columns(prop, PROP)
    key = ["t", "k"]  # t is nullable text (sorted by bytes, NULLs last); k makes the key unique
    expected = fingerprint_partition(prop, PROP, cols, "p", key, "n", part)
    table = _read(prop, PROP, cols, key, part)
    assert arrow_readings(table, cols, key, "n") == expected
    delta = _delta_round_trip(table, tmp_path / f"delta{part}", part)
    assert arrow_readings(delta, cols, key, "n") == expected
    iceberg = _iceberg_round_trip(table, tmp_path / f"iceberg{part}", part)
    assert arrow_readings(iceberg, cols, key, "n") == expected


# ---------------------------------------------------------------------------------------------
# Types and values a lake cannot hold

def test_lake_types_of_the_supported_columns(conn):
    conn.execute(
        "CREATE TABLE public.ok (a bigint, b integer, c numeric(12,2), d numeric(38,0), e text, "
        "f varchar(10), g varchar, h date, i timestamptz, j timestamptz(3), k boolean, l float8, m bytea)"
    )
    types = [lake_type(c) for c in table_columns(conn, TableRef("public", "ok"))]
    assert types == [
        pa.int64(), pa.int32(), pa.decimal128(12, 2), pa.decimal128(38, 0), pa.string(), pa.string(),
        pa.string(), pa.date32(), pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="UTC"), pa.bool_(),
        pa.float64(), pa.binary(),
    ]


REFUSED = {
    "iv": ("interval", "months, days and microseconds"),
    "n": ("numeric", "per-value scale (1.5 vs 1.50) and NaN"),
    "wide": ("numeric(40,2)", "precision 40 is above 38"),
    "j": ("json", "json text"),
    "jb": ("jsonb", "normalises jsonb text"),
    "arr": ("integer[]", "array"),
    "r": ("real", "real prints"),
    "si": ("smallint", "no 2-byte integer"),
    "tsn": ("timestamp without time zone", "without time zone"),
    "c": ("character(3)", "blank-padded"),
    "u": ("uuid", "no lake type is known"),
    "dm": ("amount", "domain over numeric"),
    "di": ("posint", "domain over int8"),
}


def test_lake_type_refuses_what_cannot_round_trip_naming_column_type_and_reason(conn):
    conn.execute("CREATE DOMAIN public.amount AS numeric(12,2)")
    conn.execute("CREATE DOMAIN public.posint AS bigint CHECK (VALUE > 0)")
    conn.execute(
        "CREATE TABLE public.refused (iv interval, n numeric, wide numeric(40,2), j json, jb jsonb, "
        "arr int[], r real, si smallint, tsn timestamp, c char(3), u uuid, dm public.amount, di public.posint)"
    )
    cols = table_columns(conn, TableRef("public", "refused"))
    assert [c.name for c in cols] == list(REFUSED)
    for column in cols:
        type_name, reason = REFUSED[column.name]
        with pytest.raises(SpecError) as caught:
            lake_type(column)
        message = str(caught.value)
        assert f"column {column.name} has type {type_name}" in message
        assert reason in message, message
    with pytest.raises(SpecError, match="column n has type numeric"):
        read_stage_partition(conn, TableRef("public", "refused"), cols[1:2], "n", 1, ["n"])


@pytest.mark.parametrize("value, ddl_type", [
    ("NaN", "numeric(12,2)"), ("infinity", "date"), ("-infinity", "timestamptz"),
    ("0044-03-15 BC", "date"), ("10000-01-01", "date"), ("10000-01-01 00:00:00+00", "timestamptz"),
])
def test_values_a_lake_cannot_hold_are_refused_naming_the_column(conn, value, ddl_type):
    conn.execute(sql.SQL("CREATE TABLE public.bad (p int, k int, x {})").format(sql.SQL(ddl_type)))
    conn.execute(sql.SQL("INSERT INTO public.bad (p, k, x) VALUES (1, 1, NULL), (1, 2, %(v)s)"), {"v": value})
    cols = table_columns(conn, TableRef("public", "bad"))
    with pytest.raises(LakeValueError, match="column x holds"):
        _read(conn, TableRef("public", "bad"), cols, ["k"], 1)
    assert conn.execute(sql.SQL("SELECT 1")).fetchone() == (1,)  # the connection is still usable


def test_lake_data_outside_years_1_to_9999_or_of_another_type_is_refused():
    cols = [ColumnInfo("k", "integer", "N", False, "int4"), ColumnInfo("d", "date", "D", False, "date"),
            ColumnInfo("ts", "timestamp with time zone", "D", False, "timestamptz")]
    ok = pa.table({"k": pa.array([1], pa.int32()), "d": pa.array([0], pa.date32()),
                   "ts": pa.array([1], pa.timestamp("us", tz="UTC"))})
    expected = arrow_readings(ok, cols, ["k"], None)
    assert expected == arrow_readings(
        ok.set_column(2, "ts", pa.array([1000], pa.timestamp("ns", tz="Europe/Paris"))), cols, ["k"], None)
    with pytest.raises(LakeValueError, match="column d holds a date outside the years 1 to 9999"):
        arrow_readings(ok.set_column(1, "d", pa.array([-719163], pa.date32())), cols, ["k"], None)
    with pytest.raises(LakeValueError, match="column ts holds"):
        arrow_readings(ok.set_column(2, "ts", pa.array([253402300800000000], pa.timestamp("us", tz="UTC"))),
                       cols, ["k"], None)
    with pytest.raises(SpecError, match="column ts has Arrow type timestamp"):
        arrow_readings(ok.set_column(2, "ts", pa.array([0], pa.timestamp("us"))), cols, ["k"], None)
    with pytest.raises(SpecError, match="does not convert exactly"):
        arrow_readings(ok.set_column(2, "ts", pa.array([1], pa.timestamp("ns", tz="UTC"))), cols, ["k"], None)
    with pytest.raises(SpecError, match="has no column d"):
        arrow_readings(ok.drop_columns(["d"]), cols, ["k"], None)
    with pytest.raises(SpecError, match="an additive total must be exact"):
        arrow_readings(ok, cols, ["k"], "ts")


def test_the_csv_copy_leads_with_a_guard_names_its_columns_orders_by_bytes_and_binds_the_partition(conn):
    cols = [ColumnInfo("k", "text", "S", True, "text"), ColumnInfo("n", "bigint", "N", False, "int8")]
    query, params = sqlbuild.copy_partition_csv(
        TableRef("s", "stage a"), ["k", "n"], "day", business_key_order(cols, ["k", "n"]), dt.date(2024, 1, 1)
    )
    assert query.as_string(conn) == (
        'COPY (SELECT 0, "t"."k", "t"."n" FROM "s"."stage a" AS t WHERE "t"."day" = %(partition)s '
        'ORDER BY "t"."k" COLLATE "C" ASC, "t"."n" ASC) TO STDOUT (FORMAT csv)'
    )
    assert params == {"partition": dt.date(2024, 1, 1)}


def test_an_unpinned_session_is_refused_before_it_reads_rounded_floats(hard, db_url):
    cols = _hard_columns(hard)
    with psycopg.connect(db_url.reveal(), autocommit=True, options="-c extra_float_digits=0") as other:
        with pytest.raises(SessionNotPinnedError, match="extra_float_digits 0"):
            read_stage_partition(other, HARD, cols, "p", 7, ["k"])


def test_a_leading_byte_order_mark_is_read_back(conn):
    # pyarrow drops a byte-order mark at the start of the text it parses: the COPY's constant
    # first column keeps every value off that spot.
    conn.execute("CREATE TABLE public.bom (p int, k text, v text)")
    conn.execute("INSERT INTO public.bom VALUES (1, %s, %s), (1, 'b', %s)", ("\ufeffa", "\ufeffx", "\ufeff"))
    cols = table_columns(conn, TableRef("public", "bom"))
    with repeatable_read(conn):
        got = read_stage_partition(conn, TableRef("public", "bom"), cols, "p", 1, ["k"])
        server = fingerprint_partition(conn, TableRef("public", "bom"), cols, "p", ["k"], None, 1)
    assert got.column("k").to_pylist() == ["b", "\ufeffa"] and got.column("v").to_pylist() == ["\ufeff", "\ufeffx"]
    assert arrow_readings(got, cols, ["k"], None) == server


def test_a_decimal_total_past_38_digits_is_exact(conn):
    # Arrow's decimal128 sum wraps silently past 38 digits; PostgreSQL's numeric sum does not.
    conn.execute("CREATE TABLE public.wide (p int, k bigint, amount numeric(38,2))")
    conn.execute("INSERT INTO public.wide SELECT 1, g, 999999999999999999999999999999999999.99 FROM generate_series(1, 200) AS g")
    conn.execute("INSERT INTO public.wide VALUES (1, 201, -0.01)")
    cols = table_columns(conn, TableRef("public", "wide"))
    with repeatable_read(conn):
        got = read_stage_partition(conn, TableRef("public", "wide"), cols, "p", 1, ["k"])
        server = fingerprint_partition(conn, TableRef("public", "wide"), cols, "p", ["k"], "amount", 1)
    assert server.total == "199999999999999999999999999999999999997.99"
    assert arrow_readings(got, cols, ["k"], "amount") == server
