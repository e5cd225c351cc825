"""The canonical fingerprint of a partition held in Arrow: one fingerprint across engines.

A stage partition approved in PostgreSQL is copied into a Delta Lake or Iceberg table; the lake
partition must then give exactly the readings ``fingerprint.fingerprint_partition`` gives in
PostgreSQL (docs/fingerprint.md, format v1, unchanged: the preamble names the PostgreSQL
columns and ``format_type`` types, each row record holds the values' PostgreSQL text forms).
So this module renders PostgreSQL's text forms from Arrow data with pyarrow.compute kernels,
one slice of rows at a time, and hashes the row records' contiguous buffer.

Only types whose values round-trip exactly through a lake table are accepted
(:func:`lake_type`). Two traps decide the shape of the code (measured in
backfill_assets_tests/core/test_arrow_fingerprint.py against a real server):

- Arrow's decimal-to-string cast switches to scientific notation (``1E-10``), so decimals are
  rendered from their unscaled integers;
- PostgreSQL prints float8 with its own port of Ryu built without "strictly shortest": a
  decimal lying exactly on the boundary half-way to a neighbouring double is not accepted,
  so for some doubles of magnitude >= 2**53 PostgreSQL prints one digit more than Arrow (and
  Python's repr): ``4.1293705688494416e+16`` against ``4.129370568849442e+16`` (about a
  quarter of the doubles in [2**54, 2**56) differ). Arrow's shortest digits are re-rendered
  in PostgreSQL's notation; the boundary cases, found with vectorised exact integer
  arithmetic, are printed again one by one in Python integers.

Reading a stage partition (:func:`read_stage_partition`) is one CSV COPY parsed by pyarrow.
"""

from __future__ import annotations

import binascii
import hashlib
import math
import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from backfill_assets.core import sqlbuild
from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.errors import LakeValueError, SessionNotPinnedError, SpecError
from backfill_assets.core.fingerprint import Fingerprint, business_key_order, preamble
from backfill_assets.core.spec import TableRef

if TYPE_CHECKING:
    import psycopg


# ---------------------------------------------------------------------------------------------
# Types

@dataclass(frozen=True)
class _Kind:
    """How one supported PostgreSQL type is held in Arrow and rendered back to its text."""

    name: str  # int, bool, float, decimal, text, bytes, date, timestamptz
    lake: pa.DataType  # the type of the lake column and of read_stage_partition
    work: pa.DataType  # what a lake's values are normalised to before sorting and rendering


_TEXT = pa.large_string()  # what text forms are built in
_NO_TEXT = pa.scalar("", _TEXT)  # the separator of element-wise joins
_NO_BYTES = pa.scalar(b"", pa.large_binary())
_UTC_MICROS = pa.timestamp("us", tz="UTC")
# Base type -> (its format_type text, as a pattern; kind; lake type; working type). Large
# types for work: a slice of long texts can pass 2 GiB.
_SUPPORTED = {
    "int8": (r"bigint", "int", pa.int64(), pa.int64()),
    "int4": (r"integer", "int", pa.int32(), pa.int32()),
    "bool": (r"boolean", "bool", pa.bool_(), pa.bool_()),
    "float8": (r"double precision", "float", pa.float64(), pa.float64()),
    "text": (r"text", "text", pa.string(), pa.large_string()),
    "varchar": (r"character varying(\(\d+\))?", "text", pa.string(), pa.large_string()),
    "date": (r"date", "date", pa.date32(), pa.date32()),
    "timestamptz": (r"timestamp(\(\d\))? with time zone", "timestamptz", _UTC_MICROS, _UTC_MICROS),
    "bytea": (r"bytea", "bytes", pa.binary(), pa.large_binary()),
}
# Base type -> (its format_type text, as a pattern; why its values cannot come back exactly).
_REFUSED = {
    "interval": (r"interval.*", "no lake type keeps an interval's months, days and microseconds "
                 "apart, so its text ('1 day' vs '24:00:00') cannot come back"),
    "json": (r"json", "json text keeps its spacing and key order, which a lake string does not "
             "tie to the value; store it as text if the text is what matters"),
    "jsonb": (r"jsonb", "PostgreSQL normalises jsonb text (key order, spacing), which a lake "
              "string does not; store it as text if the text is what matters"),
    "float4": (r"real", "real prints its own shortest digits for 4-byte floats and lake "
               "engines widen or narrow it differently; use double precision"),
    "int2": (r"smallint", "Iceberg has no 2-byte integer (it widens smallint to int), so the "
             "lake type would depend on the engine; use integer"),
    "timestamp": (r"timestamp(\(\d\))? without time zone", "a time stamp without time zone has "
                  "no agreed lake type (Delta's timestamp_ntz feature vs Iceberg's timestamp) "
                  "and no zone to render it in; use timestamp with time zone"),
    "bpchar": (r"character(\(\d+\))?", "character(n) is blank-padded, and PostgreSQL compares "
               "'a' = 'a ' while a lake string keeps or drops the padding as its writer does; "
               "use varchar or text"),
}
_NUMERIC = re.compile(r"numeric(?:\((\d+),(-?\d+)\))?")


def _refuse(column: ColumnInfo, reason: str) -> SpecError:
    return SpecError(f"column {column.name} has type {column.type_name}, which cannot go "
                     f"through a lake table exactly: {reason}")


def _domain(column: ColumnInfo) -> SpecError:
    """format_type prints a domain by its own name, never as its base type's text: a name
    that is not the base type's is a domain."""
    return _refuse(column, (
        f"it is a domain over {column.base_type}; a lake column holds the base type only, "
        "without the domain's constraints or declared typmod (which its name does not show: a "
        "domain over numeric(12,2) is not known to have scale 2), so the column would not mean "
        "the same there; declare it with its base type"
    ))


def _kind(column: ColumnInfo) -> _Kind:
    """The kind of a supported column; SpecError naming the column, its type and why not."""
    base, name = column.base_type, column.type_name
    if column.category == "A" or base.startswith("_"):
        raise _refuse(column, "an array has no lake type that keeps its bounds, dimensions and "
                              "element NULLs as PostgreSQL prints them")
    if base == "numeric":
        return _numeric_kind(column)
    if base in _SUPPORTED:
        pattern, kind, lake, work = _SUPPORTED[base]
        if re.fullmatch(pattern, name) is None:
            raise _domain(column)
        return _Kind(kind, lake, work)
    if base in _REFUSED:
        pattern, reason = _REFUSED[base]
        raise _domain(column) if re.fullmatch(pattern, name) is None else _refuse(column, reason)
    raise _refuse(column, "no lake type is known to keep its values and their PostgreSQL text exactly")


def _numeric_kind(column: ColumnInfo) -> _Kind:
    m = _NUMERIC.fullmatch(column.type_name)
    if m is None:
        raise _domain(column)
    if m.group(1) is None:
        raise _refuse(column, (
            "numeric without a declared scale keeps a per-value scale (1.5 vs 1.50) and NaN "
            "that a lake decimal cannot hold; declare it as numeric(p,s)"
        ))
    p, s = int(m.group(1)), int(m.group(2))
    if p > 38:
        raise _refuse(column, f"precision {p} is above 38, the most a lake decimal (decimal128, "
                              "Delta and Iceberg) holds")
    if not 0 <= s <= p:
        raise _refuse(column, f"scale {s} is outside 0..{p}; a lake decimal needs "
                              "0 <= scale <= precision")
    return _Kind("decimal", pa.decimal128(p, s), pa.decimal128(p, s))


def lake_type(column: ColumnInfo) -> pa.DataType:
    """The Arrow type of ``column`` in a lake table, chosen so that every value comes back
    with the same PostgreSQL text.

    Supported: bigint, integer, numeric(p,s) with p <= 38, text, varchar(n), date,
    timestamptz, boolean, double precision, bytea.

    Raises:
        SpecError: the type cannot round-trip exactly (interval, numeric without a scale,
            json/jsonb, arrays, real, smallint, timestamp without time zone, char(n), domains,
            anything else); the message names the column, its type and the reason.
    """
    return _kind(column).lake


def lake_schema(columns: Sequence[ColumnInfo]) -> pa.Schema:
    """The Arrow schema of a lake table holding ``columns``, in their order."""
    return pa.schema([pa.field(c.name, lake_type(c)) for c in columns])


# ---------------------------------------------------------------------------------------------
# Reading a stage partition from PostgreSQL

_BATCH_BYTES = 8 << 20  # CSV bytes parsed at a time: memory stays a few batches deep
_PARSE_BLOCK = 1 << 20  # pyarrow's block (its unit of parallel parsing)


def _row_batches(copy: Iterator[bytes]) -> Iterator[tuple[bytes, int]]:
    """The CSV of a COPY TO in batches of whole rows, each with its longest row.

    The server sends one CopyData message per row (the protocol says so for copy-out), so a
    batch ends on a row boundary. pyarrow's CSV reader fails on a row longer than its block
    ("straddling object straddles two block boundaries", and its streaming reader can abort
    the process): handing it whole rows, with a block at least as long as the longest,
    reads a value of any length.
    """
    parts: list[bytes] = []
    size = longest = 0
    for row in copy:
        parts.append(row)
        n = len(row)
        size += n
        if n > longest:
            longest = n
        if size >= _BATCH_BYTES:
            yield b"".join(parts), longest
            parts, size, longest = [], 0, 0
    if parts:
        yield b"".join(parts), longest


def read_stage_partition(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], partition_key: str,
    partition_value: object, business_key: Sequence[str],
) -> pa.Table:
    """The rows of one partition of ``rel`` as an Arrow table of :func:`lake_schema`
    (``columns`` in their order), in business-key order (strings by bytes, NULLs last), every
    value exact: floats as the shortest exact text parses back, decimals at their scale,
    timestamptz in UTC microseconds, NULL apart from the empty string.

    One CSV ``COPY``, parsed by pyarrow's CSV reader with explicit column types in batches of
    whole rows as they arrive (:func:`_row_batches`): the server prints each value once,
    pyarrow parses it in C++, no Python object is made per value, and the CSV text is held a
    batch at a time. Runs in the caller's transaction; the connection must be pinned
    (db.pin_session: UTC, ISO dates, extra_float_digits 1, hex bytea).

    Raises:
        SpecError: a column type has no exact lake type (:func:`lake_type`), or a business-key
            column is not among ``columns``.
        SessionNotPinnedError: the session's settings would change the values read.
        LakeValueError: a value a lake column cannot hold (NaN in numeric(p,s), an infinite
            or BC date or time stamp, a year after 9999).
    """
    kinds = [_kind(c) for c in columns]
    names = [c.name for c in columns]
    _require_key(names, business_key)
    schema = pa.schema([pa.field(c.name, k.lake) for c, k in zip(columns, kinds)])
    # bytea arrives as its hex text and is decoded per batch.
    read_types = {"guard": pa.int8(), **{f"c{i}": (pa.large_string() if k.name == "bytes" else k.lake)
                                         for i, k in enumerate(kinds)}}
    parse = pcsv.ParseOptions(newlines_in_values=True, ignore_empty_lines=False)
    # NULL is an unquoted empty field, the empty string a quoted one; a one-column row holding
    # NULL is an empty line, which must not be skipped.
    convert = pcsv.ConvertOptions(
        column_types=read_types, null_values=[""], strings_can_be_null=True,
        quoted_strings_can_be_null=False, true_values=["t"], false_values=["f"],
    )
    _require_pinned(conn)
    query, params = sqlbuild.copy_partition_csv(
        rel, names, partition_key, business_key_order(columns, business_key), partition_value
    )
    batches: list[pa.RecordBatch] = []
    with conn.cursor() as cur, cur.copy(query, params) as copy:
        for data, longest in _row_batches(iter(copy)):
            read = pcsv.ReadOptions(column_names=list(read_types), block_size=max(_PARSE_BLOCK, longest + 1))
            try:
                parsed = pcsv.read_csv(pa.py_buffer(data), read_options=read, parse_options=parse,
                                       convert_options=convert)
            except pa.ArrowInvalid as err:
                raise _conversion_error(rel, names, err) from None
            del data
            for batch in parsed.to_batches():  # without the guard column (sqlbuild.copy_partition_csv)
                batches.append(pa.RecordBatch.from_arrays(
                    [_hex_to_binary(a) if k.name == "bytes" else a for a, k in zip(batch.columns[1:], kinds)],
                    schema=schema,
                ))
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


def _require_pinned(conn: psycopg.Connection) -> None:
    """Refuse a session whose settings would change the CSV's values: a float printed with
    extra_float_digits 0 parses back as another double, silently."""
    row = conn.execute(*sqlbuild.read_settings()).fetchone()
    assert row is not None
    float_digits, date_style, bytea_output, encoding = row
    if float_digits < 1 or not date_style.startswith("ISO") or bytea_output != "hex" or encoding != "UTF8":
        raise SessionNotPinnedError(
            f"the session reading the stage is not pinned (extra_float_digits {float_digits}, "
            f"DateStyle {date_style}, bytea_output {bytea_output}, client_encoding {encoding}); "
            "open it with db.connect or call db.pin_session first"
        )


def _require_key(names: Sequence[str], business_key: Sequence[str]) -> None:
    if not business_key:
        raise SpecError("a business key is needed to order and count a partition's rows")
    missing = [k for k in business_key if k not in names]
    if missing:
        raise SpecError(f"business key column(s) {', '.join(missing)} are not among the columns")


def _conversion_error(rel: TableRef, names: Sequence[str], err: pa.ArrowInvalid) -> LakeValueError:
    text = str(err)
    m = re.search(r"CSV column #(\d+)", text)
    at = int(m.group(1)) - 1 if m else -1  # the COPY's first column is the constant guard
    where = f"column {names[at]}" if 0 <= at < len(names) else "a column"
    return LakeValueError(
        f"{rel}: {where} holds a value its lake type cannot hold exactly ({' '.join(text.split())})",
        "a lake table holds no NaN in a decimal, no infinite or BC date or time stamp and no "
        "year after 9999; change those values in the stage or keep the target in PostgreSQL",
    )


# ---------------------------------------------------------------------------------------------
# Buffers: hex text <-> bytes and big-endian length prefixes, without a Python object per value

def _value_offsets(arr: pa.Array) -> pa.Array:
    """The n+1 offsets of a (large_)binary/string array as an integer array (zero-copy)."""
    offset_type = pa.int64() if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else pa.int32()
    return pa.Array.from_buffers(offset_type, len(arr) + 1, [None, arr.buffers()[1]], offset=arr.offset)


def _data_range(arr: pa.Array) -> tuple[int, int]:
    offsets = _value_offsets(arr)
    return offsets[0].as_py(), offsets[len(arr)].as_py()


def _hex_to_binary(arr: pa.Array) -> pa.Array:
    """bytea's hex text (``\\x00ff``) as binary: once each value's ``\\x`` is cut off, the hex
    digits of all values are contiguous in the array's data, so one unhexlify over the buffer
    decodes them all, and every offset halves. (A batch holds a few MiB: int32 offsets do.)"""
    arr = pc.utf8_slice_codeunits(arr, 2)  # a fresh array: offsets start at 0
    start, end = _data_range(arr)
    decoded = binascii.unhexlify(memoryview(arr.buffers()[2])[start:end]) if end > start else b""
    offsets = pc.cast(pc.divide(_value_offsets(arr), 2), pa.int32())
    return pa.Array.from_buffers(
        pa.binary(), len(arr), [arr.buffers()[0], offsets.buffers()[1], pa.py_buffer(decoded)],
        null_count=arr.null_count,
    )


def _binary_to_hex(arr: pa.Array) -> pa.Array:
    """bytea text from binary: one hexlify over the data buffer, offsets doubled."""
    start, end = _data_range(arr)
    encoded = binascii.hexlify(memoryview(arr.buffers()[2])[start:end]) if end > start else b""
    offsets = pc.multiply(pc.subtract(pc.cast(_value_offsets(arr), pa.int64()), start), 2)
    hexed = pa.Array.from_buffers(pa.large_binary(), len(arr), [None, offsets.buffers()[1], pa.py_buffer(encoded)])
    out = pc.binary_join_element_wise(pa.scalar(b"\\x", pa.large_binary()), hexed, _NO_BYTES)
    return pc.if_else(pc.is_valid(arr), out, pa.scalar(None, pa.large_binary())) if arr.null_count else out


_MAX_SLICE = 1 << 16  # rows per slice at most
_BY_FOUR = pa.array(range(0, 4 * (_MAX_SLICE + 1), 4), pa.int64()).buffers()[1]


def _length_prefixes(text: pa.Array) -> pa.Array:
    """Each value's 4-byte big-endian signed length, -1 for NULL, as a large_binary array
    over one buffer: the lengths byte-swapped as 32-bit integers, viewed 4 bytes a value."""
    n = len(text)
    length = pc.cast(pc.fill_null(pc.binary_length(text), -1), pa.int64())
    u = pc.bit_wise_and(length, 0xFFFFFFFF)
    swapped = pc.bit_wise_or(
        pc.bit_wise_or(pc.shift_left(pc.bit_wise_and(u, 0xFF), 24), pc.shift_left(pc.bit_wise_and(u, 0xFF00), 8)),
        pc.bit_wise_or(pc.bit_wise_and(pc.shift_right(u, 8), 0xFF00), pc.shift_right(u, 24)),
    )
    data = pc.cast(swapped, pa.uint32()).buffers()[1]
    return pa.Array.from_buffers(pa.large_binary(), n, [None, _BY_FOUR, data])


# ---------------------------------------------------------------------------------------------
# Rendering PostgreSQL text forms

def _render(kind: _Kind, arr: pa.Array) -> pa.Array:
    """The PostgreSQL text of every value (NULL stays null), as large_binary."""
    if kind.name == "text":
        out = arr
    elif kind.name in ("int", "date"):  # decimal digits; ISO dates (years 1..9999 checked)
        out = pc.cast(arr, _TEXT)
    elif kind.name == "bool":  # the cast's text, not COPY's t/f
        out = pc.if_else(arr, pa.scalar("true", _TEXT), pa.scalar("false", _TEXT))
    elif kind.name == "timestamptz":
        out = _render_timestamptz(arr)
    elif kind.name == "decimal":
        out = _render_decimal(arr, kind.work.scale)
    elif kind.name == "float":
        out = _render_float8(arr)
    elif kind.name == "bytes":
        return _binary_to_hex(arr)
    else:  # pragma: no cover - _kind admits no other kind
        raise AssertionError(kind.name)
    return out.cast(pa.large_binary())


def _render_timestamptz(arr: pa.Array) -> pa.Array:
    """``2024-01-01 10:00:00+00``, ``...:59.999999+00``: UTC, the fraction trimmed of zeros.

    Whole seconds are cast to text; the microseconds (floored, so right before 1970 too) are
    written apart, which is cheaper than trimming the cast's six digits with a regex.
    """
    micros = pc.cast(arr, pa.int64())
    seconds = pc.divide(micros, 1_000_000)  # truncates toward zero
    fraction = pc.subtract(micros, pc.multiply(seconds, 1_000_000))
    below = pc.less(fraction, 0)
    seconds = pc.if_else(below, pc.subtract(seconds, 1), seconds)
    fraction = pc.if_else(below, pc.add(fraction, 1_000_000), fraction)
    whole = pc.cast(pc.cast(seconds, pa.timestamp("s")), _TEXT)
    digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(fraction, _TEXT), 6, "0"), "0")
    point = pc.if_else(pc.equal(fraction, 0), _NO_TEXT, pa.scalar(".", _TEXT))
    return pc.binary_join_element_wise(whole, point, digits, pa.scalar("+00", _TEXT), _NO_TEXT)


def _render_decimal(arr: pa.Array, scale: int) -> pa.Array:
    """numeric(p,s) text: exactly s fractional digits, never an exponent, no ``-0.00``.

    The 16-byte values are read as decimal128(38, 0), their unscaled integers, whose text
    never has an exponent; the point is put in by slicing the zero-padded digits.
    """
    unscaled = pa.Array.from_buffers(
        pa.decimal128(38, 0), len(arr), arr.buffers(), null_count=arr.null_count, offset=arr.offset
    )
    digits = pc.cast(unscaled, _TEXT)
    if scale == 0:
        return digits
    negative = pc.starts_with(digits, "-")  # never zero: an unscaled integer has no -0
    padded = pc.utf8_lpad(pc.ascii_ltrim(digits, "-"), scale + 1, "0")
    return pc.binary_join_element_wise(
        pc.if_else(negative, pa.scalar("-", _TEXT), _NO_TEXT),
        pc.utf8_slice_codeunits(padded, 0, -scale), pa.scalar(".", _TEXT),
        pc.utf8_slice_codeunits(padded, -scale), _NO_TEXT,
    )


def _render_float8(arr: pa.Array) -> pa.Array:
    """float8 text as PostgreSQL 12+ prints it with extra_float_digits 1.

    Arrow's cast gives the shortest round-trip digits in its own notation: fixed for decimal
    exponents -6..9, ``1e-7`` or ``1.5e+16`` beyond, ``inf``, ``nan``. PostgreSQL's is fixed
    for -4..14, ``1e-07`` beyond (a sign and at least two exponent digits), ``Infinity``,
    ``-Infinity``, ``NaN``. Where both are fixed (-4..9: most data) Arrow's text is kept as
    it is; the other finite values are written again from their digits
    (:func:`_float8_from_digits`).
    """
    text = pc.cast(arr, _TEXT)
    finite = pc.fill_null(pc.is_finite(arr), False)
    other = pc.or_(
        pc.match_substring(text, "e"),
        pc.or_(pc.starts_with(text, "0.0000"), pc.starts_with(text, "-0.0000")),
    )
    other = pc.and_(pc.fill_null(other, False), finite)
    if pc.any(other).as_py():
        text = pc.replace_with_mask(text, other, _float8_from_digits(pc.filter(arr, other), pc.filter(text, other)))
    if arr.null_count + pc.sum(pc.cast(finite, pa.int64())).as_py() < len(arr):
        special = pc.if_else(
            pc.is_nan(arr), pa.scalar("NaN", _TEXT),
            pc.if_else(pc.greater(arr, 0), pa.scalar("Infinity", _TEXT), pa.scalar("-Infinity", _TEXT)),
        )
        text = pc.if_else(finite, text, special)
    return text


def _float8_from_digits(arr: pa.Array, text: pa.Array) -> pa.Array:
    """PostgreSQL's text of finite doubles from Arrow's text of them.

    Arrow's digits ``d`` and decimal exponent ``E`` (the value is d[0].d[1:] x 10**E) are taken
    apart with string kernels (an ``e0`` or a ``.`` is appended so that every split has the
    part looked for) and written again in PostgreSQL's notation; then the few values whose
    shortest digits lie exactly on a rounding boundary are printed again
    (:func:`_boundary_rows`).
    """
    negative = pc.starts_with(text, "-")
    unsigned = pc.ascii_ltrim(text, "-")
    parts = pc.split_pattern(pc.binary_join_element_wise(unsigned, pa.scalar("e0", _TEXT), _NO_TEXT), "e")
    exp = pc.cast(pc.ascii_ltrim(pc.list_element(parts, 1), "+"), pa.int64())
    number = pc.split_pattern(pc.binary_join_element_wise(pc.list_element(parts, 0), pa.scalar(".", _TEXT), _NO_TEXT), ".")
    int_part, frac = pc.list_element(number, 0), pc.list_element(number, 1)
    mantissa = pc.binary_join_element_wise(int_part, frac, _NO_TEXT)
    stripped = pc.ascii_ltrim(mantissa, "0")
    lead = pc.subtract(pc.binary_length(mantissa), pc.binary_length(stripped))
    digits = pc.ascii_rtrim(stripped, "0")
    zero = pc.equal(digits, "")
    digits = pc.if_else(zero, pa.scalar("0", _TEXT), digits)
    e10 = pc.if_else(zero, 0, pc.add(pc.subtract(pc.subtract(pc.binary_length(int_part), 1), lead), exp))
    ndigits = pc.binary_length(digits)
    fixed = pc.and_(pc.greater_equal(e10, -4), pc.less(e10, 15))
    out = _fixed_and_exponent(digits, e10, ndigits, fixed)
    out = pc.binary_join_element_wise(pc.if_else(negative, pa.scalar("-", _TEXT), _NO_TEXT), out, _NO_TEXT)
    boundary = _boundary_rows(arr, digits, e10, ndigits)
    if boundary is not None:
        values = pc.filter(arr, boundary).to_pylist()
        below = pc.filter(pc.subtract(pc.add(e10, 1), ndigits), boundary).to_pylist()
        texts = [_text_past_bound(v, k - 1) for v, k in zip(values, below)]
        out = pc.replace_with_mask(out, boundary, pa.array(texts, _TEXT))
    return out


def _fixed_and_exponent(digits: pa.Array, e10: pa.Array, ndigits: pa.Array, fixed: pa.Array) -> pa.Array:
    """PostgreSQL's notation from the digits and decimal exponent of each value (no sign).

    Fixed: the digits are padded with zeros to 15 places before the point (14 - E zeros in
    front, up to E + 1 - len(d) behind), so the point always falls after the 15th character
    whatever E is; leading zeros of the integer part and an empty fraction are then trimmed.
    """
    s = _TEXT
    zeros = pa.scalar("0", s)
    zero_or_none = pc.if_else(fixed, zeros, _NO_TEXT)  # only fixed rows are padded
    front = pc.binary_repeat(zero_or_none, pc.max_element_wise(pc.subtract(14, e10), 0))
    back = pc.binary_repeat(zero_or_none, pc.max_element_wise(pc.subtract(pc.add(e10, 1), ndigits), 0))
    padded = pc.binary_join_element_wise(front, digits, back, _NO_TEXT)
    whole = pc.utf8_ltrim(pc.utf8_slice_codeunits(padded, 0, 15), "0")
    whole = pc.if_else(pc.equal(whole, ""), zeros, whole)
    fraction = pc.utf8_slice_codeunits(padded, 15)
    point = pc.if_else(pc.equal(fraction, ""), pa.scalar("", s), pa.scalar(".", s))
    fixed_text = pc.binary_join_element_wise(whole, point, fraction, _NO_TEXT)

    rest = pc.utf8_slice_codeunits(digits, 1)
    magnitude = pc.utf8_lpad(pc.cast(pc.abs(e10), s), 2, "0")
    exponent_text = pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(digits, 0, 1),
        pc.if_else(pc.equal(rest, ""), pa.scalar("", s), pa.scalar(".", s)), rest,
        pc.if_else(pc.less(e10, 0), pa.scalar("e-", s), pa.scalar("e+", s)), magnitude, _NO_TEXT,
    )
    return pc.if_else(fixed, fixed_text, exponent_text)


def _boundary_rows(arr: pa.Array, digits: pa.Array, e10: pa.Array, ndigits: pa.Array) -> pa.Array | None:
    """Where Arrow's shortest digits D lie exactly on a rounding boundary of x, which
    PostgreSQL's Ryu (acceptBounds false) refuses; None when there are none.

    x = m * 2**e with m even (odd mantissas exclude the bounds in every printer), e >= 1
    (|x| >= 2**53: below, every bound needs more digits than x itself). 17 digits always lie
    strictly inside, so only len(D) <= 16 can be a bound. With D = d * 10**k, a bound
    B * 2**t (B = 2m+1 or 2m-1 odd, t = e - 1; B = 4m-1, t = e - 2 below a power of two)
    equals D iff k >= 0, d = r * 2**(t-k) with r odd, and r * 5**k = B; each test is exact
    int64 arithmetic (B < 2**55, so k <= 23).
    """
    bits = pa.Array.from_buffers(pa.int64(), len(arr), [None, arr.buffers()[1]], offset=arr.offset)
    biased = pc.bit_wise_and(pc.shift_right(bits, 52), 0x7FF)
    fraction_bits = pc.bit_wise_and(bits, (1 << 52) - 1)
    candidate = pc.and_(
        pc.and_(pc.greater_equal(biased, 1076), pc.less(biased, 2047)),
        pc.and_(pc.equal(pc.bit_wise_and(fraction_bits, 1), 0), pc.less_equal(ndigits, 16)),
    )
    if arr.null_count:
        candidate = pc.and_(candidate, pc.is_valid(arr))
    if not pc.any(candidate).as_py():
        return None
    where = pc.indices_nonzero(candidate)
    m = pc.bit_wise_or(pc.take(fraction_bits, where), 1 << 52)
    e = pc.subtract(pc.take(biased, where), 1075)
    k = pc.add(pc.subtract(pc.take(e10, where), pc.take(ndigits, where)), 1)
    d = pc.cast(pc.take(digits, where), pa.int64())
    power_of_two = pc.equal(m, 1 << 52)
    upper = _is_bound(d, k, pc.add(pc.multiply(m, 2), 1), pc.subtract(e, 1))
    lower = pc.if_else(
        power_of_two,
        _is_bound(d, k, pc.subtract(pc.multiply(m, 4), 1), pc.subtract(e, 2)),
        _is_bound(d, k, pc.subtract(pc.multiply(m, 2), 1), pc.subtract(e, 1)),
    )
    hits = pc.filter(where, pc.or_(upper, lower))
    if len(hits) == 0:
        return None
    return pc.is_in(_row_numbers(len(arr)), value_set=pc.cast(hits, pa.int64()))


def _is_bound(d: pa.Array, k: pa.Array, odd: pa.Array, t: pa.Array) -> pa.Array:
    """Whether d * 10**k == odd * 2**t, for odd odd: d = r * 2**(t-k), r odd, r * 5**k = odd."""
    shift = pc.subtract(t, k)
    ok = pc.and_(pc.and_(pc.greater_equal(k, 0), pc.less_equal(k, 23)),
                 pc.and_(pc.greater_equal(shift, 0), pc.less_equal(shift, 62)))
    safe_shift = pc.if_else(ok, shift, 0)
    five = pc.power(pa.scalar(5, pa.int64()), pc.if_else(ok, k, 0))
    r = pc.shift_right(d, safe_shift)
    quotient = pc.divide(odd, five)  # integer division; odd < 2**55, nothing wraps
    return pc.and_(
        pc.and_(ok, pc.equal(pc.shift_left(r, safe_shift), d)),
        pc.and_(pc.equal(pc.multiply(quotient, five), odd), pc.equal(quotient, r)),
    )


_ROW_NUMBERS = pa.array(range(_MAX_SLICE), pa.int64())


def _row_numbers(n: int) -> pa.Array:
    return _ROW_NUMBERS.slice(0, n) if n <= _MAX_SLICE else pa.array(range(n), pa.int64())


def _text_past_bound(x: float, j: int) -> str:
    """PostgreSQL's text of a double x >= 2**53 in magnitude whose shortest digits, multiples
    of 10**(j+1), lie on a bound of its rounding interval: the nearest multiple of the largest
    10**j (j or below) strictly inside the interval, in exact integer arithmetic (x is an
    integer there; the interval is scaled by 2 and, for j < 0, by 10**-j)."""
    sign, ax = ("-" if x < 0 else ""), abs(x)
    v = int(ax)
    low2, high2 = 2 * v - (v - int(math.nextafter(ax, 0.0))), 2 * v + int(math.ulp(ax))
    while True:
        unit, scale = 10 ** max(j, 0), 10 ** max(-j, 0)  # a candidate is q * unit / scale
        below = v * scale // unit
        inside = [q for q in (below, below + 1) if low2 * scale < 2 * q * unit < high2 * scale]
        if inside:
            q = min(inside, key=lambda c: (abs(c * unit - v * scale), c % 2))
            digits = str(q)
            e10 = len(digits) - 1 + j
            return sign + _pg_notation(digits.rstrip("0"), e10)
        j -= 1


def _pg_notation(digits: str, e10: int) -> str:
    if -4 <= e10 < 15:
        if e10 >= 0:
            whole = (digits + "0" * max(0, e10 + 1 - len(digits)))[: e10 + 1]
            fraction = digits[e10 + 1:]
        else:
            whole, fraction = "0", "0" * (-e10 - 1) + digits
        return whole + ("." + fraction if fraction else "")
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{mantissa}e{'-' if e10 < 0 else '+'}{abs(e10):02d}"


# ---------------------------------------------------------------------------------------------
# Readings

_SLICE_BYTES = 64 << 20  # about this much rendered text per slice


def arrow_readings(
    table: pa.Table, columns: Sequence[ColumnInfo], business_key: Sequence[str], total: str | None,
) -> Fingerprint:
    """The readings of one partition held in Arrow, equal bit for bit to
    ``fingerprint.fingerprint_partition`` (with ``key_unique=False``) over the same rows in
    PostgreSQL.

    ``table`` holds at least ``columns`` by name, as a lake gives them back (string_view or
    large strings, dictionaries, another time zone name for UTC, other chunking: they are
    normalised). Rows are hashed in business-key order, strings and bytes by bytes, NULLs
    last, like ``COLLATE "C"``. Where keys tie (duplicate or NULL keys) PostgreSQL's own order
    is not defined, so neither is its digest: such rows are put in the order of their
    canonical text, by bytes, which makes the digest a function of the rows, but it need not
    equal the server's; those partitions already differ in their readings from a valid stage.

    The sort and the key counts read the key columns whole; the text forms are rendered and
    hashed a slice of rows at a time, so memory stays near the table's own size.

    Raises:
        SpecError: a column is missing from the table, has a type its PostgreSQL type does not
            map to, or has no exact lake type; ``total`` is not an integer or numeric(p,s)
            column among ``columns``.
        LakeValueError: a date or time stamp outside the years 1 to 9999.
    """
    kinds = [_kind(c) for c in columns]
    names = [c.name for c in columns]
    _require_key(names, business_key)
    data = [_normalise(table, c, k) for c, k in zip(columns, kinds)]
    by_name = dict(zip(names, zip(data, kinds)))
    n = table.num_rows
    total_text = _total(by_name, columns, total)
    h = hashlib.sha256(preamble([(c.name, c.type_name) for c in columns]))
    if n == 0:
        return Fingerprint(0, 0, 0, total_text, h.hexdigest())

    keys = [by_name[k] for k in business_key]
    null_keys = _any_null([d for d, _ in keys])
    key_table = pa.table({f"k{i}": _sort_form(d, k) for i, (d, k) in enumerate(keys)})
    sort_keys = [(f"k{i}", "ascending", "at_end") for i in range(len(keys))]
    order = pc.sort_indices(key_table, sort_keys=sort_keys)
    sorted_keys = key_table.take(order)
    duplicates, ties = _adjacent_equal([sorted_keys.column(i) for i in range(len(keys))], [k for _, k in keys])

    rendered = None
    if ties:
        # Break ties by every column's text, by bytes: render it all once, sort again.
        rendered = [_render_all(d, k) for d, k in zip(data, kinds)]
        tie_table = pa.table({**{f"k{i}": key_table.column(i) for i in range(len(keys))},
                              **{f"t{i}": r for i, r in enumerate(rendered)}})
        order = pc.sort_indices(
            tie_table, sort_keys=sort_keys + [(f"t{i}", "ascending", "at_end") for i in range(len(rendered))],
        )
    del key_table, sorted_keys

    count = pa.scalar(struct.pack("!h", len(columns)), pa.large_binary())
    step = _slice_rows(data, kinds, n)
    for start in range(0, n, step):
        idx = order.slice(start, step)
        run = _run_start(idx)
        parts: list[pa.Array | pa.Scalar] = [count]
        for i, (d, k) in enumerate(zip(data, kinds)):
            text = _take(rendered[i], idx, run) if rendered is not None else _render(k, _take(d, idx, run))
            parts += [_length_prefixes(text), text]
        rows = pc.binary_join_element_wise(*parts, _NO_BYTES, null_handling="replace", null_replacement=b"")
        begin, end = _data_range(rows)
        h.update(memoryview(rows.buffers()[2])[begin:end])
    return Fingerprint(n, null_keys, duplicates, total_text, h.hexdigest())


def _take(data: pa.ChunkedArray, idx: pa.Array, run: int | None) -> pa.Array:
    """The rows ``idx`` of ``data``; a slice where they are a run of rows in order (``run``:
    its first row), which is several times cheaper than a take from a chunked array."""
    taken = data.slice(run, len(idx)) if run is not None else data.take(idx)
    return taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken


def _run_start(idx: pa.Array) -> int | None:
    """The first row if ``idx`` is a run of consecutive rows in order (data read back in key
    order: a stage, or lake files written sorted), else None."""
    first = idx[0].as_py()
    if idx[len(idx) - 1].as_py() - first != len(idx) - 1:
        return None
    return first if pc.all(pc.equal(idx, pc.add(_row_numbers(len(idx)), first))).as_py() else None


def _slice_rows(data: Sequence[pa.ChunkedArray], kinds: Sequence[_Kind], n: int) -> int:
    """Rows per slice: at most 64k, fewer where long text or bytes would make a slice big."""
    variable = sum(
        sum(chunk.buffers()[2].size for chunk in d.chunks if chunk.buffers()[2] is not None)
        for d, k in zip(data, kinds) if k.name in ("text", "bytes")
    )
    per_row = 2 * variable / max(n, 1) + 64 * len(kinds)
    return max(1, min(_MAX_SLICE, int(_SLICE_BYTES / per_row)))


def canonical_texts(table: pa.Table, columns: Sequence[ColumnInfo]) -> pa.Table:
    """Each of ``columns`` as its PostgreSQL text forms (NULL stays null), the forms the
    fingerprint hashes: PostgreSQL's input of them gives back the same values, which is how a
    lake partition is compared with a stage key by key (core.diff)."""
    kinds = [_kind(c) for c in columns]
    return pa.table({c.name: _render_all(_normalise(table, c, k), k).cast(pa.large_string())
                     for c, k in zip(columns, kinds)})


def _render_all(data: pa.ChunkedArray, kind: _Kind) -> pa.ChunkedArray:
    chunks = []
    for start in range(0, len(data), _MAX_SLICE):
        chunks.append(_render(kind, data.slice(start, _MAX_SLICE).combine_chunks()))
    return pa.chunked_array(chunks, pa.large_binary())


def _any_null(columns: Sequence[pa.ChunkedArray]) -> int:
    mask = pc.is_null(columns[0])
    for c in columns[1:]:
        mask = pc.or_(mask, pc.is_null(c))
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _sort_form(data: pa.ChunkedArray, kind: _Kind) -> pa.ChunkedArray:
    """The key as sorted: floats with -0 made 0 (PostgreSQL's -0 = 0), so that rows equal as
    PostgreSQL compares them stay adjacent after a multi-column sort."""
    return pc.add(data, 0.0) if kind.name == "float" else data


def _adjacent_equal(sorted_keys: Sequence[pa.ChunkedArray], kinds: Sequence[_Kind]) -> tuple[int, bool]:
    """(rows equal to the row before them on a key with no NULL: the duplicate count; whether
    any two neighbours tie in ORDER BY, where NULL ties NULL and NaN ties NaN)."""
    n = len(sorted_keys[0])
    if n < 2:
        return 0, False
    same = tie = None
    for data, kind in zip(sorted_keys, kinds):
        data = data.combine_chunks() if isinstance(data, pa.ChunkedArray) else data
        a, b = data.slice(1), data.slice(0, n - 1)
        eq = pc.equal(a, b)
        if kind.name == "float":
            eq = pc.or_(eq, pc.and_(pc.is_nan(a), pc.is_nan(b)))
        eq = pc.fill_null(eq, False)
        both_null = pc.and_(pc.is_null(a), pc.is_null(b))
        t = pc.or_(eq, both_null)
        same = eq if same is None else pc.and_(same, eq)
        tie = t if tie is None else pc.and_(tie, t)
    duplicates = int(pc.sum(pc.cast(same, pa.int64())).as_py() or 0)
    return duplicates, bool(pc.any(tie).as_py())


def _total(by_name: dict[str, tuple[pa.ChunkedArray, _Kind]], columns: Sequence[ColumnInfo], total: str | None) -> str | None:
    """``coalesce(sum(total), 0)::text``: exact; ``0`` for no rows or only NULLs; a numeric(p,s)
    sum keeps the scale s."""
    if total is None:
        return None
    if total not in by_name:
        raise SpecError(f"total {total} is not among the columns")
    data, kind = by_name[total]
    if kind.name not in ("int", "decimal"):
        col = next(c for c in columns if c.name == total)
        raise SpecError(f"total {total} has type {col.type_name}; an additive total must be "
                        "exact (integer or numeric)")
    # Summed as decimal256(76, s): an int64 sum can wrap, and so can a decimal128 one past 38
    # digits (Arrow does not raise); 76 digits hold the sum of any number of rows there can be.
    scale = kind.work.scale if kind.name == "decimal" else 0
    summed = pc.sum(pc.cast(data, pa.decimal256(76, scale)))
    if not summed.is_valid:
        return "0"
    return format(summed.as_py(), "f")  # one Decimal, at scale s: no exponent, no -0


def _normalise(table: pa.Table, column: ColumnInfo, kind: _Kind) -> pa.ChunkedArray:
    """The column as ``kind.work``: a lake may hand back large or view strings, dictionaries,
    another name for UTC, nanoseconds or another integer width. Only casts that keep every
    value are made (safe casts); anything else is a SpecError."""
    if column.name not in table.column_names:
        raise SpecError(f"the lake table has no column {column.name}")
    data = table.column(column.name)
    t = data.type
    if pa.types.is_dictionary(t):
        data = pc.cast(data, t.value_type)
        t = t.value_type
    target = kind.work
    accepted = {
        "int": pa.types.is_integer,
        "bool": pa.types.is_boolean,
        "float": pa.types.is_float64,
        "decimal": pa.types.is_decimal,
        "text": lambda x: pa.types.is_string(x) or pa.types.is_large_string(x) or pa.types.is_string_view(x),
        "bytes": lambda x: (pa.types.is_binary(x) or pa.types.is_large_binary(x) or pa.types.is_binary_view(x)
                            or pa.types.is_fixed_size_binary(x)),
        "date": lambda x: pa.types.is_date32(x) or pa.types.is_date64(x),
        "timestamptz": lambda x: pa.types.is_timestamp(x) and x.tz is not None,
    }[kind.name]
    if not accepted(t):
        raise SpecError(
            f"the lake column {column.name} has Arrow type {t}, which does not hold "
            f"{column.type_name} (expected {kind.lake})"
        )
    if t != target:
        try:
            data = pc.cast(data, target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise SpecError(f"the lake column {column.name} ({t}) does not convert exactly to "
                            f"{target}: {' '.join(str(err).split())}") from None
    if kind.name in ("date", "timestamptz"):
        _check_years(column, kind, data)
    return data


_YEAR_RANGE = {  # the first and last value PostgreSQL prints as YYYY-...: years 1 to 9999
    "date": (-719162, 2932896),
    "timestamptz": (-62135596800000000, 253402300799999999),
}


def _check_years(column: ColumnInfo, kind: _Kind, data: pa.ChunkedArray) -> None:
    if data.null_count == len(data):
        return
    bounds = pc.min_max(pc.cast(data, pa.int32() if kind.name == "date" else pa.int64()))
    low, high = _YEAR_RANGE[kind.name]
    if bounds["min"].as_py() < low or bounds["max"].as_py() > high:
        raise LakeValueError(
            f"column {column.name} holds a {column.type_name} outside the years 1 to 9999",
            "PostgreSQL prints such values with a BC suffix or a five-digit year, which this "
            "fingerprint does not render; keep them out of lake tables",
        )
