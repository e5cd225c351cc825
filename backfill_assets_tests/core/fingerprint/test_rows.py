"""Fingerprint format 3 without a server: the golden vectors against the plain-Python
reference and DuckDB, and the properties the digest must have (docs/fingerprint.md)."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from backfill_assets.core.fingerprint import digest, rows
from backfill_assets.core.fingerprint.arrow import arrow_readings
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets_tests.core.fingerprint import golden

# Pinned: any change of the format must change these on purpose, with a new format number.
PORTABLE_HASH = "274029e09f43ce2013af62ab60498a67fbcc01408826fb60154f94728e1c560b"
POSTGRES_ONLY_HASH = "951fdd39a651c05bf5f3b69ce2cd5194cc8448b1f2af3b520d477e2d534cf3cd"
EMPTY_PORTABLE_HASH = "ce70d14de1cdae95e84834a9519803620b5f0558556f5a77d4c724623caee961"

FILE = golden.load()


def _values(section: str) -> list[list[object]]:
    return [[golden.decode(v) for v in r["values"]] for r in FILE[section]["rows"]]


@pytest.mark.parametrize("section", ["portable", "postgres_only"])
def test_the_reference_gives_the_golden_texts_hashes_and_readings(section):
    cols = golden.columns(section)
    assert [c["kind"] for c in FILE[section]["columns"]] == [rows.kind_of(c) for c in cols]
    for row, values in zip(FILE[section]["rows"], _values(section), strict=True):
        assert rows.row_text(cols, values) == row["text"]
        assert rows.row_hash(row["text"]) == row["hash"]
    total = "amount" if section == "portable" else None
    assert rows.reference_readings(cols, _values(section), ["k"], total).as_dict() == FILE[section]["readings"]
    # The file is what the reference writes (regenerate it only with a new format).
    assert golden.reference(section) == FILE[section]


def test_the_golden_digests_are_pinned():
    assert FILE["format"] == rows.FORMAT == 3
    assert FILE["portable"]["readings"]["content_hash"] == PORTABLE_HASH
    assert FILE["postgres_only"]["readings"]["content_hash"] == POSTGRES_ONLY_HASH
    assert rows.content_hash(golden.columns("portable"), 0, [0] * rows.SLICES) == EMPTY_PORTABLE_HASH


def _arrow(section_rows: list[list[object]]) -> pa.Table:
    cols = golden.columns("portable")
    schema = lake_schema(cols)
    return pa.table({c.name: pa.array([r[i] for r in section_rows], schema.field(c.name).type)
                     for i, c in enumerate(cols)}, schema=schema)


def test_duckdb_gives_the_golden_texts_and_readings_from_arrow():
    import duckdb

    cols = golden.columns("portable")
    table = _arrow(_values("portable"))
    fields = [(c.name, rows.kind_of(c)) for c in cols]
    with duckdb.connect() as con:
        con.register("t", table)
        text = sql.SQL(digest.row_text(fields))
        query = sql.SQL("SELECT {}, sha256({}) FROM t AS t").format(text, text).as_string(None)
        texts, hashes = map(list, zip(*con.execute(query).fetchall()))
    assert texts == [r["text"] for r in FILE["portable"]["rows"]]
    assert hashes == [r["hash"] for r in FILE["portable"]["rows"]]
    assert arrow_readings(table, cols, ["k"], "amount").as_dict() == FILE["portable"]["readings"]
    # In any row order, any chunking.
    shuffled = table.take(pa.array(list(range(table.num_rows))[::-1]))
    rechunked = pa.concat_tables([shuffled.slice(0, 5), shuffled.slice(5)])
    assert arrow_readings(rechunked, cols, ["k"], "amount").as_dict() == FILE["portable"]["readings"]


@pytest.mark.parametrize("left, right", [
    (("a", "bc"), ("ab", "c")),
    ((None, "x"), ("", "x")),
    ((None, "x"), ("NULL", "x")),
    ((None, "x"), ("~", "x")),
    (("|", ""), ("", "|")),
    (("1:", "a"), ("1", ":a")),
])
def test_texts_that_differ_render_differently(left, right):
    cols = golden.columns("portable")
    at = [c.name for c in cols].index("note"), [c.name for c in cols].index("code")
    base = _values("portable")[0]

    def text(pair):
        row = list(base)
        row[at[0]], row[at[1]] = pair
        return rows.row_text(cols, row)
    assert text(left) != text(right)


@pytest.mark.parametrize("a, b", [(0.0, -0.0), (float("nan"), float("inf")), (2.0**53, 2.0**53 + 2),
                                  (5e-324, 0.0), (1e20, 1.0000000000000002e20)])
def test_doubles_that_differ_render_differently(a, b):
    assert rows.render("double", a) != rows.render("double", b)


# --- properties over the reference: every accidental difference changes the digest ------------

_cols = golden.columns("portable")
_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)
_row = st.tuples(
    st.integers(-2**63, 2**63 - 1), st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)),
    st.one_of(st.none(), st.decimals(min_value=-10**9, max_value=10**9, places=2, allow_nan=False)),
    st.one_of(st.none(), st.booleans()), st.one_of(st.none(), st.floats()), st.one_of(st.none(), _texts),
    st.one_of(st.none(), st.binary(max_size=8)),
    st.one_of(st.none(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
)


def _full(t: tuple) -> list[object]:
    k, i, amount, flag, x, note, raw, day = t
    return [1, k, i, amount, None, flag, x, note, None, raw, day, None]


def _digest(rows_: list[list[object]]) -> str:
    return rows.reference_readings(_cols, rows_, ["k"], "amount").content_hash


@settings(max_examples=150)
@given(st.lists(_row, min_size=1, max_size=8), st.data())
def test_a_changed_missing_extra_or_duplicated_row_changes_the_digest(data_rows, data):
    table = [_full(t) for t in data_rows]
    before = _digest(table)
    # Order never matters.
    assert _digest(list(reversed(table))) == before
    # A row removed, a row duplicated, a row added that was not there.
    n = data.draw(st.integers(0, len(table) - 1))
    assert _digest(table[:n] + table[n + 1:]) != before
    assert _digest(table + [table[n]]) != before
    extra = _full(data.draw(_row))
    assert _digest(table + [extra]) != before
    # One value changed in any column to one that renders differently.
    column = data.draw(st.sampled_from([1, 2, 3, 5, 6, 7, 9, 10]))
    changed = list(table[n])
    new = data.draw({1: st.integers(-2**31, 2**31 - 1), 2: st.none() | st.integers(0, 9),
                     3: st.none() | st.decimals(min_value=0, max_value=9, places=2, allow_nan=False),
                     5: st.none() | st.booleans(), 6: st.none() | st.floats(), 7: st.none() | _texts,
                     9: st.none() | st.binary(max_size=3), 10: st.none() | st.dates()}[column])
    kind, scale = rows.kind_of(_cols[column]), 2 if column == 3 else None
    if rows.render(kind, new, scale) == rows.render(kind, changed[column], scale):
        return  # the same value (as the engines hold it): nothing changed
    changed[column] = new
    assert _digest(table[:n] + [changed] + table[n + 1:]) != before


@settings(max_examples=40, deadline=None)
@given(st.lists(_row, max_size=6))
def test_duckdb_agrees_with_the_reference_on_generated_rows(data_rows):
    table = [_full(t) for t in data_rows]
    keyed = [r for r in table]
    assert arrow_readings(_arrow(keyed), _cols, ["k"], "amount") == rows.reference_readings(_cols, keyed, ["k"], "amount")


def test_slices_are_the_leading_60_bit_groups_of_the_row_hash():
    h = rows.row_hash("x")
    assert rows.slices(h) == [int(h[0:15], 16), int(h[15:30], 16), int(h[30:45], 16)]
    assert struct.calcsize(">d") == 8 and Decimal("1.50") == Decimal("1.5")  # what the golden values rely on


def test_a_decimal_total_has_the_column_scale_and_no_negative_zero():
    # Found by test_generated_sources: Python values of scale 0 in a numeric(12,2) column.
    def total(amounts):
        table = [_full((k, None, a, None, None, None, None, None)) for k, a in enumerate(amounts)]
        return rows.reference_readings(_cols, table, ["k"], "amount").total

    assert total([Decimal("0")]) == "0.00"
    assert total([Decimal("-0.00")]) == "0.00"
    assert total([Decimal("1.5"), Decimal("2")]) == "3.50"
    assert total([None]) == "0" and total([]) == "0"  # nothing to add up, as PostgreSQL's coalesce(sum, 0)
