"""The column types a lake table can hold exactly, and the Arrow type of each (one
:class:`Kind` per PostgreSQL type): what a stage's column becomes in Delta or Iceberg, and how
the canonical text of its values is rendered from Arrow (core.fingerprint.texts)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.errors import SpecError

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------
# Types

@dataclass(frozen=True)
class Kind:
    """How one supported PostgreSQL type is held in Arrow and rendered back to its text."""

    name: str  # int, bool, float, decimal, text, bytes, date, timestamptz
    lake: pa.DataType  # the type of the lake column and of read_stage_partition
    work: pa.DataType  # what a lake's values are normalised to before sorting and rendering


TEXT = pa.large_string()  # what text forms are built in
NO_TEXT = pa.scalar("", TEXT)  # the separator of element-wise joins
NO_BYTES = pa.scalar(b"", pa.large_binary())
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


def kind_of(column: ColumnInfo) -> Kind:
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
        return Kind(kind, lake, work)
    if base in _REFUSED:
        pattern, reason = _REFUSED[base]
        raise _domain(column) if re.fullmatch(pattern, name) is None else _refuse(column, reason)
    raise _refuse(column, "no lake type is known to keep its values and their PostgreSQL text exactly")


def _numeric_kind(column: ColumnInfo) -> Kind:
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
    return Kind("decimal", pa.decimal128(p, s), pa.decimal128(p, s))


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
    return kind_of(column).lake


def lake_schema(columns: Sequence[ColumnInfo]) -> pa.Schema:
    """The Arrow schema of a lake table holding ``columns``, in their order."""
    return pa.schema([pa.field(c.name, lake_type(c)) for c in columns])

def require_key(names: Sequence[str], business_key: Sequence[str]) -> None:
    if not business_key:
        raise SpecError("a business key is needed to order and count a partition's rows")
    missing = [k for k in business_key if k not in names]
    if missing:
        raise SpecError(f"business key column(s) {', '.join(missing)} are not among the columns")
