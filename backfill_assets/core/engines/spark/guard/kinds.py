"""The kinds of values the Spark guard tells apart (integer, decimal, float, text, DATE,
TIMESTAMP, TIMESTAMP_NTZ ...), and what it derives from types and literals."""

from __future__ import annotations

import re

from sqlglot import exp

Kinds = frozenset[str]

_INTEGER, _DECIMAL, _FLOAT, _STRING, _BINARY = "integer", "decimal", "float", "string", "binary"
_BOOLEAN, _DATE, _LTZ, _NTZ, _INTERVAL = "boolean", "date", "timestamp", "timestamp_ntz", "interval"
_NULL, _UNKNOWN = "null", "unknown"
_CONTAINERS = frozenset({"array", "map", "struct"})
_UNKNOWN_VALUE = exp.Var(this="?")  # a column the guard cannot see (of SELECT *, say): of an unknown kind
_NUMBERS = frozenset({_INTEGER, _DECIMAL, _FLOAT})

_TYPE_KINDS = {
    "TINYINT": _INTEGER, "SMALLINT": _INTEGER, "INT": _INTEGER, "BIGINT": _INTEGER,
    "DECIMAL": _DECIMAL, "FLOAT": _FLOAT, "DOUBLE": _FLOAT,
    "TEXT": _STRING, "VARCHAR": _STRING, "CHAR": _STRING, "BINARY": _BINARY, "BOOLEAN": _BOOLEAN,
    "DATE": _DATE, "TIMESTAMP": _LTZ, "TIMESTAMPTZ": _LTZ, "TIMESTAMPLTZ": _LTZ, "TIMESTAMPNTZ": _NTZ,
    "INTERVAL": _INTERVAL, "NULL": _NULL, "ARRAY": "array", "MAP": "map", "STRUCT": "struct",
}

# A time stamp literal with an explicit UTC offset, which needs no session time zone to read.
_OFFSET_LITERAL = re.compile(r".*\d:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|UTC|GMT|[+-]\d{1,2}(:?\d{2}){0,2})",
                             re.IGNORECASE | re.DOTALL)
# EXTRACT / date_part fields that a DATE answers without a time zone.
_DATE_FIELDS = frozenset({
    "YEAR", "Y", "YEARS", "YR", "YRS", "YEAROFWEEK", "QUARTER", "QTR", "MONTH", "MON", "MONS", "MONTHS",
    "WEEK", "W", "WEEKS", "DAY", "D", "DAYS", "DAYOFWEEK", "DOW", "DAYOFWEEK_ISO", "DOW_ISO", "DOY",
})
_DATE_UNITS = frozenset({"YEAR", "YEARS", "MONTH", "MONTHS", "WEEK", "WEEKS", "DAY", "DAYS"})


def _strip(kinds: Kinds) -> Kinds:
    """The kinds inside containers: an array's elements, a map's keys and values."""
    inner = kinds - _CONTAINERS
    return inner or frozenset({_UNKNOWN})


def _inexact(kinds: Kinds) -> bool:
    return _FLOAT in kinds or _UNKNOWN in kinds


def _maybe_timestamp(kinds: Kinds) -> bool:
    return _LTZ in kinds or _UNKNOWN in kinds


def _named(kinds: Kinds) -> str:
    names = {_LTZ: "TIMESTAMP", _NTZ: "TIMESTAMP_NTZ", _FLOAT: "FLOAT/DOUBLE", _UNKNOWN: "a kind the guard "
             "cannot learn"}
    return ", ".join(names.get(k, k.upper()) for k in sorted(kinds))


def _literal_kind(node: exp.Literal) -> str:
    if node.is_string:
        return _STRING
    text = node.name
    if re.fullmatch(r"\d+", text):
        return _INTEGER
    return _FLOAT if "e" in text.lower() else _DECIMAL


def _type_kinds(data_type: exp.DataType | None) -> Kinds:
    """The kinds of a type and of every type inside it (array elements, map keys and values,
    struct fields)."""
    if data_type is None:
        return frozenset({_UNKNOWN})
    kinds = {_TYPE_KINDS.get(node.this.name, _UNKNOWN) for node in data_type.walk() if isinstance(node, exp.DataType)}
    return frozenset(kinds)


def _date_interval(interval: exp.Interval) -> bool:
    """Whether an interval literal has only whole days, weeks, months or years."""
    unit = interval.args.get("unit")
    units = [unit] if not isinstance(unit, exp.IntervalSpan) else [unit.this, unit.expression]
    return all(isinstance(u, exp.Var) and u.name.upper() in _DATE_UNITS for u in units)
