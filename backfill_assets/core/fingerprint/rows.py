"""Format 3 of the fingerprint: one row digest that every engine computes from typed values.

The byte format, and why it loses nothing that matters, is docs/fingerprint.md. In short:

- a row's text is its fields joined by ``|``, each field rendered by its column's kind
  (:data:`KINDS`), NULL as ``~``;
- a row's hash is the SHA-256 of its text's UTF-8 bytes;
- a partition's content hash is the SHA-256 of a preamble (this format's tag, the columns'
  names and canonical types), the row count and :data:`SLICES` exact sums of 60-bit slices of
  the row hashes: an order-independent digest, which every engine computes as a parallel
  aggregate, without a sort and without sending a row to the client.

This module is the specification in plain Python (:func:`reference_readings`): the engines'
SQL (core.pg.sqlbuild.digest for PostgreSQL, core.fingerprint.digest for DuckDB) must agree with
it on the golden vectors (backfill_assets_tests/core/fingerprint/golden_rows.json).
"""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import TypedDict

from backfill_assets.core.catalog import ColumnInfo

FORMAT = 3
TAG = "backfill-assets/fingerprint/v3"
SLICES = 3  # sums of 60-bit slices of each row hash: 180 bits (docs/fingerprint.md)
SLICE_HEX = 15  # 60 bits
NULL = "~"
SEPARATOR = "|"
NAN_BITS = "7ff8000000000000"  # every NaN renders as the canonical quiet NaN
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_EXACT = decimal.Context(prec=200)  # numeric(38,s) values and their sums, exactly, as in the engines

# Kind -> how a non-NULL value renders (the engines' SQL follows this table):
KINDS = {
    "integer": "decimal digits, '-' for negatives",
    "decimal": "plain decimal text with the column's declared scale, never an exponent",
    "numeric": "PostgreSQL's text of a numeric without a declared scale (the value's own scale, NaN)",
    "boolean": "'true' or 'false'",
    "double": "the 16 lower-case hex digits of its IEEE 754 bits, big-endian; every NaN 7ff8000000000000",
    "text": "<length of its UTF-8 bytes>:<the UTF-8 text>",
    "bytes": "lower-case hex of the bytes",
    "date": "ISO YYYY-MM-DD",
    "timestamp": "microseconds since 1970-01-01 00:00:00 UTC (a timestamp without time zone: as if UTC)",
    "other": "<length>:<PostgreSQL's text of the value> under the pinned session (PostgreSQL only)",
}
_BY_BASE = {
    "int2": "integer", "int4": "integer", "int8": "integer", "bool": "boolean", "float8": "double",
    "text": "text", "varchar": "text", "bytea": "bytes", "date": "date", "timestamptz": "timestamp",
    "timestamp": "timestamp",
}
# The canonical type a column is named by in the preamble (engine-neutral; a varchar(n)'s
# length is a constraint, not part of a value).
_TYPE_NAMES = {
    "int2": "smallint", "int4": "integer", "int8": "bigint", "bool": "boolean", "float8": "double",
    "text": "text", "varchar": "text", "bytea": "bytes", "date": "date", "timestamptz": "timestamptz",
    "timestamp": "timestamp",
}


def kind_of(column: ColumnInfo) -> str:
    """How a column's values render (a key of :data:`KINDS`), from its base type."""
    if column.category == "A":
        return "other"
    if column.base_type == "numeric":
        return "decimal" if _declared_scale(column) is not None else "numeric"
    return _BY_BASE.get(column.base_type, "other")


def type_name(column: ColumnInfo) -> str:
    """The column's canonical type name in the preamble."""
    if column.category == "A":
        return column.type_name
    if column.base_type == "numeric":
        scale = _declared_scale(column)
        return column.type_name if scale is None else column.type_name.replace("numeric", "decimal", 1)
    return _TYPE_NAMES.get(column.base_type, column.type_name)


def _declared_scale(column: ColumnInfo) -> int | None:
    """The scale of a numeric(p,s) column (its own typmod, not a domain's: a domain's name
    does not show the typmod, so a domain over numeric renders as ``numeric``)."""
    name = column.type_name
    if not name.startswith("numeric(") or "," not in name:
        return None
    return int(name[name.index(",") + 1 : -1])


class Reading(TypedDict):
    """A :class:`Fingerprint` as JSON values (:meth:`Fingerprint.as_dict`): what plans, builds,
    approvals and the ledger store of one partition, and what a target's readings are."""

    row_count: int
    null_key_count: int
    duplicate_key_count: int
    total: str | None
    content_hash: str


class Digest(TypedDict):
    """A source partition's fingerprint, with no key to count: its rows and content hash (for
    a pinned lake source, the digest of its files), what a snapshot pins."""

    row_count: int
    content_hash: str


@dataclass(frozen=True)
class Fingerprint:
    """The readings of one partition of one relation."""

    row_count: int
    null_key_count: int
    duplicate_key_count: int
    total: str | None
    content_hash: str

    def as_dict(self) -> Reading:
        return Reading(row_count=self.row_count, null_key_count=self.null_key_count,
                       duplicate_key_count=self.duplicate_key_count, total=self.total,
                       content_hash=self.content_hash)

    def differences(self, other: Fingerprint) -> list[str]:
        """Names of the readings that differ."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


def preamble(columns: Sequence[ColumnInfo]) -> str:
    """The tag, then each column's name and canonical type (lengths prefixed)."""
    parts = [TAG, str(len(columns))]
    for c in columns:
        t = type_name(c)
        parts += [f"{len(c.name.encode('utf-8'))}:{c.name}", f"{len(t.encode('utf-8'))}:{t}"]
    return "\n".join(parts)


def content_hash(columns: Sequence[ColumnInfo], row_count: int, sums: Sequence[int]) -> str:
    """The partition's content hash from its row count and the slice sums."""
    assert len(sums) == SLICES
    text = "\n".join([preamble(columns), str(row_count), *(str(int(s)) for s in sums)]) + "\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def total_text(value: object) -> str:
    """An exact total as its text: ``0`` when there is nothing to add up (no row, or every value
    NULL), else the integer or plain decimal text of the sum (the scale of the column kept)."""
    if value is None:
        return "0"
    if isinstance(value, decimal.Decimal):
        return format(value.copy_abs() if value == 0 else value, "f")  # no negative zero, as in every engine
    return str(value)


# --- the reference implementation, in plain Python ---------------------------------------------

def render(kind: str, value: object, scale: int | None = None) -> str:
    """One field from a typed Python value (``None`` is NULL). ``other`` takes PostgreSQL's
    text of the value; ``decimal`` needs the column's scale."""
    if value is None:
        return NULL
    if kind == "integer":
        return str(int(value))  # type: ignore[call-overload]
    if kind in ("decimal", "numeric"):
        d = decimal.Decimal(value)  # type: ignore[arg-type]
        if d.is_nan():
            return "NaN"
        if d.is_infinite():
            return "Infinity" if d > 0 else "-Infinity"
        if kind == "decimal":
            d = _at_scale(d, scale)
        text = format(d, "f")
        return text[1:] if text.startswith("-") and d == 0 else text  # no negative zero
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "double":
        f = float(value)  # type: ignore[arg-type]
        return NAN_BITS if f != f else struct.pack(">d", f).hex()
    if kind in ("text", "other"):
        s = str(value)
        return f"{len(s.encode('utf-8'))}:{s}"
    if kind == "bytes":
        return bytes(value).hex()  # type: ignore[call-overload]
    if kind == "date":
        assert isinstance(value, dt.date)
        return value.isoformat()
    if kind == "timestamp":
        assert isinstance(value, dt.datetime)
        moment = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
        return str((moment - _EPOCH) // dt.timedelta(microseconds=1))
    raise ValueError(f"unknown kind {kind}")


def row_text(columns: Sequence[ColumnInfo], values: Sequence[object]) -> str:
    return SEPARATOR.join(render(kind_of(c), v, _declared_scale(c)) for c, v in zip(columns, values, strict=True))


def row_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def slices(row_hash_hex: str) -> list[int]:
    """The row hash's first :data:`SLICES` 60-bit slices, as unsigned integers."""
    return [int(row_hash_hex[i * SLICE_HEX : (i + 1) * SLICE_HEX], 16) for i in range(SLICES)]


def reference_readings(
    columns: Sequence[ColumnInfo], rows: Iterable[Sequence[object]], business_key: Sequence[str],
    total: str | None,
) -> Fingerprint:
    """All readings of a partition's rows (typed values in ``columns`` order), in plain Python."""
    names = [c.name for c in columns]
    key_at = [names.index(k) for k in business_key]
    total_at = names.index(total) if total is not None else None
    count, nulls, sums, seen, duplicates, added = 0, 0, [0] * SLICES, set(), 0, None
    for row in rows:
        count += 1
        key = tuple(row[i] for i in key_at)
        if any(v is None for v in key):
            nulls += 1
        elif key in seen:
            duplicates += 1
        else:
            seen.add(key)
        if total_at is not None and row[total_at] is not None:
            value = row[total_at]
            added = value if added is None else (
                _EXACT.add(added, value) if isinstance(value, decimal.Decimal) else added + value)  # type: ignore[operator]
        for i, s in enumerate(slices(row_hash(row_text(columns, row)))):
            sums[i] += s
    if added is not None and total_at is not None and kind_of(columns[total_at]) == "decimal":
        # A sum of numeric(p,s) values has scale s, whatever scale the Python values carry.
        added = _at_scale(added, _declared_scale(columns[total_at]))
    return Fingerprint(count, nulls, duplicates, None if total is None else total_text(added),
                       content_hash(columns, count, sums))


def _at_scale(value: object, scale: int | None) -> decimal.Decimal:
    assert scale is not None
    return decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-scale), context=_EXACT)  # type: ignore[arg-type]
