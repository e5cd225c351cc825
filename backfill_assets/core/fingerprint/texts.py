"""PostgreSQL's text forms of values held in Arrow, rendered with pyarrow.compute kernels a
slice of rows at a time, for core.diff to compare a lake partition with a stage value by value
(core.fingerprint.arrow names the two traps that shape it), and hex <-> bytes without a Python
object per value."""

from __future__ import annotations

import binascii
import math
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    pass

from backfill_assets.core.fingerprint.kinds import NO_BYTES, NO_TEXT, TEXT, Kind

# ---------------------------------------------------------------------------------------------
# Buffers: hex text <-> bytes, without a Python object per value

def _value_offsets(arr: pa.Array) -> pa.Array:
    """The n+1 offsets of a (large_)binary/string array as an integer array (zero-copy)."""
    offset_type = pa.int64() if pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type) else pa.int32()
    return pa.Array.from_buffers(offset_type, len(arr) + 1, [None, arr.buffers()[1]], offset=arr.offset)


def data_range(arr: pa.Array) -> tuple[int, int]:
    offsets = _value_offsets(arr)
    return offsets[0].as_py(), offsets[len(arr)].as_py()


def hex_to_binary(arr: pa.Array) -> pa.Array:
    """bytea's hex text (``\\x00ff``) as binary: once each value's ``\\x`` is cut off, the hex
    digits of all values are contiguous in the array's data, so one unhexlify over the buffer
    decodes them all, and every offset halves. (A batch holds a few MiB: int32 offsets do.)"""
    arr = pc.utf8_slice_codeunits(arr, 2)  # a fresh array: offsets start at 0
    start, end = data_range(arr)
    decoded = binascii.unhexlify(memoryview(arr.buffers()[2])[start:end]) if end > start else b""
    offsets = pc.cast(pc.divide(_value_offsets(arr), 2), pa.int32())
    return pa.Array.from_buffers(
        pa.binary(), len(arr), [arr.buffers()[0], offsets.buffers()[1], pa.py_buffer(decoded)],
        null_count=arr.null_count,
    )


def _binary_to_hex(arr: pa.Array) -> pa.Array:
    """bytea text from binary: one hexlify over the data buffer, offsets doubled."""
    start, end = data_range(arr)
    encoded = binascii.hexlify(memoryview(arr.buffers()[2])[start:end]) if end > start else b""
    offsets = pc.multiply(pc.subtract(pc.cast(_value_offsets(arr), pa.int64()), start), 2)
    hexed = pa.Array.from_buffers(pa.large_binary(), len(arr), [None, offsets.buffers()[1], pa.py_buffer(encoded)])
    out = pc.binary_join_element_wise(pa.scalar(b"\\x", pa.large_binary()), hexed, NO_BYTES)
    return pc.if_else(pc.is_valid(arr), out, pa.scalar(None, pa.large_binary())) if arr.null_count else out


MAX_SLICE = 1 << 16  # rows per slice at most


# ---------------------------------------------------------------------------------------------
# Rendering PostgreSQL text forms

def render(kind: Kind, arr: pa.Array) -> pa.Array:
    """The PostgreSQL text of every value (NULL stays null), as large_binary."""
    if kind.name == "text":
        out = arr
    elif kind.name in ("int", "date"):  # decimal digits; ISO dates (years 1..9999 checked)
        out = pc.cast(arr, TEXT)
    elif kind.name == "bool":  # the cast's text, not COPY's t/f
        out = pc.if_else(arr, pa.scalar("true", TEXT), pa.scalar("false", TEXT))
    elif kind.name == "timestamptz":
        out = _render_timestamptz(arr)
    elif kind.name == "decimal":
        out = _render_decimal(arr, kind.work.scale)
    elif kind.name == "float":
        out = _render_float8(arr)
    elif kind.name == "bytes":
        return _binary_to_hex(arr)
    else:  # pragma: no cover - kind_of admits no other kind
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
    whole = pc.cast(pc.cast(seconds, pa.timestamp("s")), TEXT)
    digits = pc.utf8_rtrim(pc.utf8_lpad(pc.cast(fraction, TEXT), 6, "0"), "0")
    point = pc.if_else(pc.equal(fraction, 0), NO_TEXT, pa.scalar(".", TEXT))
    return pc.binary_join_element_wise(whole, point, digits, pa.scalar("+00", TEXT), NO_TEXT)


def _render_decimal(arr: pa.Array, scale: int) -> pa.Array:
    """numeric(p,s) text: exactly s fractional digits, never an exponent, no ``-0.00``.

    The 16-byte values are read as decimal128(38, 0), their unscaled integers, whose text
    never has an exponent; the point is put in by slicing the zero-padded digits.
    """
    unscaled = pa.Array.from_buffers(
        pa.decimal128(38, 0), len(arr), arr.buffers(), null_count=arr.null_count, offset=arr.offset
    )
    digits = pc.cast(unscaled, TEXT)
    if scale == 0:
        return digits
    negative = pc.starts_with(digits, "-")  # never zero: an unscaled integer has no -0
    padded = pc.utf8_lpad(pc.ascii_ltrim(digits, "-"), scale + 1, "0")
    return pc.binary_join_element_wise(
        pc.if_else(negative, pa.scalar("-", TEXT), NO_TEXT),
        pc.utf8_slice_codeunits(padded, 0, -scale), pa.scalar(".", TEXT),
        pc.utf8_slice_codeunits(padded, -scale), NO_TEXT,
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
    text = pc.cast(arr, TEXT)
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
            pc.is_nan(arr), pa.scalar("NaN", TEXT),
            pc.if_else(pc.greater(arr, 0), pa.scalar("Infinity", TEXT), pa.scalar("-Infinity", TEXT)),
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
    parts = pc.split_pattern(pc.binary_join_element_wise(unsigned, pa.scalar("e0", TEXT), NO_TEXT), "e")
    exp = pc.cast(pc.ascii_ltrim(pc.list_element(parts, 1), "+"), pa.int64())
    number = pc.split_pattern(pc.binary_join_element_wise(pc.list_element(parts, 0), pa.scalar(".", TEXT), NO_TEXT), ".")
    int_part, frac = pc.list_element(number, 0), pc.list_element(number, 1)
    mantissa = pc.binary_join_element_wise(int_part, frac, NO_TEXT)
    stripped = pc.ascii_ltrim(mantissa, "0")
    lead = pc.subtract(pc.binary_length(mantissa), pc.binary_length(stripped))
    digits = pc.ascii_rtrim(stripped, "0")
    zero = pc.equal(digits, "")
    digits = pc.if_else(zero, pa.scalar("0", TEXT), digits)
    e10 = pc.if_else(zero, 0, pc.add(pc.subtract(pc.subtract(pc.binary_length(int_part), 1), lead), exp))
    ndigits = pc.binary_length(digits)
    fixed = pc.and_(pc.greater_equal(e10, -4), pc.less(e10, 15))
    out = _fixed_and_exponent(digits, e10, ndigits, fixed)
    out = pc.binary_join_element_wise(pc.if_else(negative, pa.scalar("-", TEXT), NO_TEXT), out, NO_TEXT)
    boundary = _boundary_rows(arr, digits, e10, ndigits)
    if boundary is not None:
        values = pc.filter(arr, boundary).to_pylist()
        below = pc.filter(pc.subtract(pc.add(e10, 1), ndigits), boundary).to_pylist()
        texts = [_text_past_bound(v, k - 1) for v, k in zip(values, below)]
        out = pc.replace_with_mask(out, boundary, pa.array(texts, TEXT))
    return out


def _fixed_and_exponent(digits: pa.Array, e10: pa.Array, ndigits: pa.Array, fixed: pa.Array) -> pa.Array:
    """PostgreSQL's notation from the digits and decimal exponent of each value (no sign).

    Fixed: the digits are padded with zeros to 15 places before the point (14 - E zeros in
    front, up to E + 1 - len(d) behind), so the point always falls after the 15th character
    whatever E is; leading zeros of the integer part and an empty fraction are then trimmed.
    """
    s = TEXT
    zeros = pa.scalar("0", s)
    zero_or_none = pc.if_else(fixed, zeros, NO_TEXT)  # only fixed rows are padded
    front = pc.binary_repeat(zero_or_none, pc.max_element_wise(pc.subtract(14, e10), 0))
    back = pc.binary_repeat(zero_or_none, pc.max_element_wise(pc.subtract(pc.add(e10, 1), ndigits), 0))
    padded = pc.binary_join_element_wise(front, digits, back, NO_TEXT)
    whole = pc.utf8_ltrim(pc.utf8_slice_codeunits(padded, 0, 15), "0")
    whole = pc.if_else(pc.equal(whole, ""), zeros, whole)
    fraction = pc.utf8_slice_codeunits(padded, 15)
    point = pc.if_else(pc.equal(fraction, ""), pa.scalar("", s), pa.scalar(".", s))
    fixed_text = pc.binary_join_element_wise(whole, point, fraction, NO_TEXT)

    rest = pc.utf8_slice_codeunits(digits, 1)
    magnitude = pc.utf8_lpad(pc.cast(pc.abs(e10), s), 2, "0")
    exponent_text = pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(digits, 0, 1),
        pc.if_else(pc.equal(rest, ""), pa.scalar("", s), pa.scalar(".", s)), rest,
        pc.if_else(pc.less(e10, 0), pa.scalar("e-", s), pa.scalar("e+", s)), magnitude, NO_TEXT,
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
    return pc.is_in(row_numbers(len(arr)), value_set=pc.cast(hits, pa.int64()))


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


_ROW_NUMBERS = pa.array(range(MAX_SLICE), pa.int64())


def row_numbers(n: int) -> pa.Array:
    return _ROW_NUMBERS.slice(0, n) if n <= MAX_SLICE else pa.array(range(n), pa.int64())


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
