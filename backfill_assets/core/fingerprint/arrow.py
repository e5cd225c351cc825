"""A partition held in Arrow: its readings (format 3, computed by DuckDB) and, for core.diff,
its values' PostgreSQL text forms.

A stage partition approved in PostgreSQL is copied into a Delta Lake or Iceberg table; the lake
partition must then give exactly the readings ``fingerprint.fingerprint_partition`` gives in
PostgreSQL. The lake library hands the partition over as Arrow, each column is checked and
normalised to the Arrow type its PostgreSQL type maps to (core.fingerprint.kinds; only safe
casts), and DuckDB computes the count, the NULL and duplicate keys and the format-3 digest in
one aggregate (core.fingerprint.digest); the exact total is summed by Arrow in decimal256.

``canonical_texts`` renders PostgreSQL's text forms with pyarrow.compute kernels
(core.fingerprint.texts): core.diff compares a lake partition with a stage key by key and
column by column in SQL, which needs the values themselves, not a digest. Its traps (Arrow's
``1E-10`` for decimals; PostgreSQL's Ryu, built without "strictly shortest", printing
``4.1293705688494416e+16`` where Arrow prints ``4.129370568849442e+16``) are in texts.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.errors import LakeValueError, SpecError
from backfill_assets.core.fingerprint import digest, rows
from backfill_assets.core.fingerprint.kinds import Kind, kind_of, require_key
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.fingerprint.texts import MAX_SLICE, render


def arrow_readings(
    table: pa.Table, columns: Sequence[ColumnInfo], business_key: Sequence[str], total: str | None,
) -> Fingerprint:
    """The readings of one partition held in Arrow, equal to ``fingerprint.fingerprint_partition``
    (with ``key_unique=False``) over the same rows in PostgreSQL.

    ``table`` holds at least ``columns`` by name, as a lake gives them back (string_view or
    large strings, dictionaries, another time zone name for UTC, other chunking: they are
    normalised). Duplicate keys compare as PostgreSQL compares them (-0 = 0 in a double key).

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
    total_text = _total(by_name, columns, total)
    normalised = pa.table(dict(zip(names, data)))
    count, null_keys, duplicates, sums = digest.readings(
        normalised, [(c.name, rows.kind_of(c)) for c in columns], business_key,
        [k for k in business_key if by_name[k][1].name == "float"],
    )
    return Fingerprint(count, null_keys, duplicates, total_text, rows.content_hash(columns, count, sums))


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
