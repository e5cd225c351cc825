"""The canonical fingerprint of a partition held in Arrow: one fingerprint across engines.

A stage partition approved in PostgreSQL is copied into a Delta Lake or Iceberg table; the lake
partition must then give exactly the readings ``fingerprint.fingerprint_partition`` gives in
PostgreSQL (docs/fingerprint.md, format v1, unchanged: the preamble names the PostgreSQL
columns and ``format_type`` types, each row record holds the values' PostgreSQL text forms).
So this module renders PostgreSQL's text forms from Arrow data with pyarrow.compute kernels,
one slice of rows at a time, and hashes the row records' contiguous buffer.

Only types whose values round-trip exactly through a lake table are accepted
(:func:`lake_type`). Two traps decide the shape of the code (measured in
backfill_assets_tests/core/fingerprint/test_arrow.py against a real server):

- Arrow's decimal-to-string cast switches to scientific notation (``1E-10``), so decimals are
  rendered from their unscaled integers;
- PostgreSQL prints float8 with its own port of Ryu built without "strictly shortest": a
  decimal lying exactly on the boundary half-way to a neighbouring double is not accepted,
  so for some doubles of magnitude >= 2**53 PostgreSQL prints one digit more than Arrow (and
  Python's repr): ``4.1293705688494416e+16`` against ``4.129370568849442e+16`` (about a
  quarter of the doubles in [2**54, 2**56) differ). Arrow's shortest digits are re-rendered
  in PostgreSQL's notation; the boundary cases, found with vectorised exact integer
  arithmetic, are printed again one by one in Python integers.

The types a lake holds are core.fingerprint.kinds, the text forms core.fingerprint.texts, and
reading a stage partition (core.fingerprint.stage_arrow) is one CSV COPY parsed by pyarrow.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.errors import LakeValueError, SpecError
from backfill_assets.core.fingerprint.partition import Fingerprint, preamble
from backfill_assets.core.pg.catalog import ColumnInfo

if TYPE_CHECKING:
    pass
from backfill_assets.core.fingerprint.kinds import NO_BYTES, Kind, kind_of, require_key
from backfill_assets.core.fingerprint.texts import MAX_SLICE, data_range, length_prefixes, render, row_numbers

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
    kinds = [kind_of(c) for c in columns]
    names = [c.name for c in columns]
    require_key(names, business_key)
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
            text = _take(rendered[i], idx, run) if rendered is not None else render(k, _take(d, idx, run))
            parts += [length_prefixes(text), text]
        rows = pc.binary_join_element_wise(*parts, NO_BYTES, null_handling="replace", null_replacement=b"")
        begin, end = data_range(rows)
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
    return first if pc.all(pc.equal(idx, pc.add(row_numbers(len(idx)), first))).as_py() else None


def _slice_rows(data: Sequence[pa.ChunkedArray], kinds: Sequence[Kind], n: int) -> int:
    """Rows per slice: at most 64k, fewer where long text or bytes would make a slice big."""
    variable = sum(
        sum(chunk.buffers()[2].size for chunk in d.chunks if chunk.buffers()[2] is not None)
        for d, k in zip(data, kinds) if k.name in ("text", "bytes")
    )
    per_row = 2 * variable / max(n, 1) + 64 * len(kinds)
    return max(1, min(MAX_SLICE, int(_SLICE_BYTES / per_row)))


def canonical_texts(table: pa.Table, columns: Sequence[ColumnInfo]) -> pa.Table:
    """Each of ``columns`` as its PostgreSQL text forms (NULL stays null), the forms the
    fingerprint hashes: PostgreSQL's input of them gives back the same values, which is how a
    lake partition is compared with a stage key by key (core.diff)."""
    kinds = [kind_of(c) for c in columns]
    return pa.table({c.name: _render_all(_normalise(table, c, k), k).cast(pa.large_string())
                     for c, k in zip(columns, kinds)})


def _render_all(data: pa.ChunkedArray, kind: Kind) -> pa.ChunkedArray:
    chunks = []
    for start in range(0, len(data), MAX_SLICE):
        chunks.append(render(kind, data.slice(start, MAX_SLICE).combine_chunks()))
    return pa.chunked_array(chunks, pa.large_binary())


def _any_null(columns: Sequence[pa.ChunkedArray]) -> int:
    mask = pc.is_null(columns[0])
    for c in columns[1:]:
        mask = pc.or_(mask, pc.is_null(c))
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)


def _sort_form(data: pa.ChunkedArray, kind: Kind) -> pa.ChunkedArray:
    """The key as sorted: floats with -0 made 0 (PostgreSQL's -0 = 0), so that rows equal as
    PostgreSQL compares them stay adjacent after a multi-column sort."""
    return pc.add(data, 0.0) if kind.name == "float" else data


def _adjacent_equal(sorted_keys: Sequence[pa.ChunkedArray], kinds: Sequence[Kind]) -> tuple[int, bool]:
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


def _total(by_name: dict[str, tuple[pa.ChunkedArray, Kind]], columns: Sequence[ColumnInfo], total: str | None) -> str | None:
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


def _normalise(table: pa.Table, column: ColumnInfo, kind: Kind) -> pa.ChunkedArray:
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


def _check_years(column: ColumnInfo, kind: Kind, data: pa.ChunkedArray) -> None:
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
