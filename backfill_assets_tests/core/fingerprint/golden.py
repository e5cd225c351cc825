"""The golden vectors of fingerprint format 3 (golden_rows.json): rows of every type with
every hard value, their row texts, row hashes and the readings of the whole table.

Two tables: ``portable`` holds the types every engine holds (checked in PostgreSQL, DuckDB,
after a Delta and an Iceberg round trip, and by the Python reference); ``postgres_only`` the
types only PostgreSQL holds, rendered by their text form (checked in PostgreSQL and by the
reference). ``python -m backfill_assets_tests.core.fingerprint.golden`` writes the file from
the reference; the tests pin its readings by literal values, so a change of the format cannot
pass unnoticed.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.fingerprint import rows

FILE = Path(__file__).with_name("golden_rows.json")
UTC = dt.timezone.utc


def _double(bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(bits))[0]


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


# (name, format_type, typcategory, collatable, base type)
PORTABLE_COLUMNS = [
    ("p", "integer", "N", False, "int4"),  # the partition
    ("k", "bigint", "N", False, "int8"),  # the business key
    ("i", "integer", "N", False, "int4"),
    ("amount", "numeric(12,2)", "N", False, "numeric"),
    ("wide", "numeric(38,10)", "N", False, "numeric"),
    ("flag", "boolean", "B", False, "bool"),
    ("x", "double precision", "N", False, "float8"),
    ("note", "text", "S", True, "text"),
    ("code", "character varying(20)", "S", True, "varchar"),
    ("raw", "bytea", "U", False, "bytea"),
    ("day", "date", "D", False, "date"),
    ("at", "timestamp with time zone", "D", False, "timestamptz"),
]
LONG = "long " + "é" * 3000 + "😀" * 500 + "x" * 20000
# One row per hard value; the rest of the row plain. Values are typed Python values.
_PLAIN: dict[str, Any] = {
    "i": 7, "amount": Decimal("1.00"), "wide": Decimal("0E-10"), "flag": True, "x": 1.5, "note": "plain",
    "code": "c", "raw": b"\x01", "day": dt.date(2024, 1, 1), "at": _ts("2024-01-01T00:00:00+00:00"),
}
_HARD: list[dict[str, Any]] = [
    {},
    {"i": None, "amount": None, "wide": None, "flag": None, "x": None, "note": None, "code": None, "raw": None,
     "day": None, "at": None},
    {"i": -2147483648, "amount": Decimal("-0.00"), "wide": Decimal("-9999999999999999999999999999.9999999999"),
     "flag": False, "x": -0.0},
    {"i": 2147483647, "amount": Decimal("9999999999.99"), "wide": Decimal("9999999999999999999999999999.9999999999"),
     "x": 0.0},
    {"amount": Decimal("-1.50"), "wide": Decimal("0.0000000001"), "x": float("nan")},
    {"amount": Decimal("0.10"), "x": float("inf"), "note": ""},
    {"x": float("-inf"), "note": "NULL", "code": "~"},
    {"x": _double("0000000000000001"), "note": "~", "code": "|"},  # the smallest subnormal
    {"x": _double("800fffffffffffff"), "note": "|", "code": "3:abc"},  # the largest negative subnormal
    {"x": float(2**53 + 1), "note": "a|b~c\\d'e\"f", "code": "1:"},  # rounds to 2**53
    {"x": 1e20, "note": "tab\tnewline\ncarriage\rbell\x07escape\x1bdel\x7f"},
    {"x": 0.1, "note": "é ü ß 日本語 😀 👍🏽 e\u0301 \u200b", "code": "日本"},
    {"x": -1 / 3, "note": LONG},
    {"x": 1.7976931348623157e308, "raw": b""},
    {"x": 2.2250738585072014e-308, "raw": b"\x00\xff|~"},  # the smallest normal
    {"x": 4.1293705688494416e16, "raw": bytes(range(256))},  # printed one digit longer by PostgreSQL's text
    {"day": dt.date(1, 1, 1), "at": _ts("0001-01-01T00:00:00.000001+00:00")},
    {"day": dt.date(9999, 12, 31), "at": _ts("9999-12-31T23:59:59.999999+00:00")},
    {"day": dt.date(2024, 2, 29), "at": _ts("1969-12-31T23:59:59.500000+00:00")},
    {"day": dt.date(1970, 1, 1), "at": _ts("2024-01-01T12:00:00+02:00")},
    {"day": dt.date(1969, 12, 31), "at": _ts("2024-03-10T01:02:03.100000+05:30")},
]
# The business key: k. Partition 1 holds every row; k 9007199254740993 = 2**53 + 1.
_KEYS = [1, 2, -9223372036854775808, 9223372036854775807, 2**53 + 1, 0, -1] + list(range(100, 200))

POSTGRES_ONLY_COLUMNS = [
    ("p", "integer", "N", False, "int4"),
    ("k", "bigint", "N", False, "int8"),
    ("s", "smallint", "N", False, "int2"),
    ("n", "numeric", "N", False, "numeric"),
    ("r", "real", "N", False, "float4"),
    ("ts", "timestamp without time zone", "D", False, "timestamp"),
    ("iv", "interval", "T", False, "interval"),
    ("j", "jsonb", "U", False, "jsonb"),
    ("u", "uuid", "U", False, "uuid"),
    ("arr", "text[]", "A", True, "_text"),
    ("ch", "character(3)", "S", True, "bpchar"),
]
# Values as SQL literals cast to the column's type (what the server stores), with the text
# PostgreSQL prints for the ``other`` kinds under the pinned session.
_PG_ONLY: list[dict[str, tuple[str | None, Any]]] = [
    {"s": ("-32768", -32768), "n": ("1.50", Decimal("1.50")), "r": ("0.1", "0.1"),
     "ts": ("2024-01-01 12:00:00.5", dt.datetime(2024, 1, 1, 12, 0, 0, 500000)),
     "iv": ("1 day 02:00:00", "1 day 02:00:00"), "j": ('{"b": 1, "a": "|~"}', '{"a": "|~", "b": 1}'),
     "u": ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
     "arr": ("{a,NULL,\"b|c\"}", "{a,NULL,b|c}"), "ch": ("a", "a")},
    {"s": ("32767", 32767), "n": ("1.5", Decimal("1.5")), "r": ("-0", "-0"),
     "ts": ("0001-01-01 00:00:00", dt.datetime(1, 1, 1)), "iv": ("-3 mons", "-3 mons"), "j": ("[]", "[]"),
     "u": ("00000000-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000000"),
     "arr": ("{}", "{}"), "ch": ("", "")},
    {"s": (None, None), "n": ("NaN", Decimal("NaN")), "r": ("NaN", "NaN"), "ts": (None, None),
     "iv": ("00:00:00.000001", "00:00:00.000001"), "j": ("null", "null"), "u": (None, None),
     "arr": (None, None), "ch": (None, None)},
    {"s": ("0", 0), "n": ("-0.000", Decimal("-0.000")), "r": ("Infinity", "Infinity"),
     "ts": ("9999-12-31 23:59:59.999999", dt.datetime(9999, 12, 31, 23, 59, 59, 999999)),
     "iv": ("1 year 2 mons 3 days 04:05:06.789", "1 year 2 mons 3 days 04:05:06.789"),
     "j": ('"é\\n"', '"é\\n"'), "u": ("ffffffff-ffff-ffff-ffff-ffffffffffff", "ffffffff-ffff-ffff-ffff-ffffffffffff"),
     "arr": ("{{1,2},{3,4}}", "{{1,2},{3,4}}"), "ch": ("xyz", "xyz")},
]
# The kinds whose reference value is the PostgreSQL text: what the column's text form prints.
_PG_TEXT = {"r", "iv", "j", "u", "arr", "ch"}


def columns(which: str) -> list[ColumnInfo]:
    spec = PORTABLE_COLUMNS if which == "portable" else POSTGRES_ONLY_COLUMNS
    return [ColumnInfo(n, t, cat, coll, base) for n, t, cat, coll, base in spec]


def portable_rows() -> list[list[Any]]:
    out = []
    for key, hard in zip(_KEYS, _HARD):
        values = {"p": 1, "k": key, **_PLAIN, **hard}
        out.append([values[n] for n, *_ in PORTABLE_COLUMNS])
    return out


def postgres_only_rows() -> list[tuple[list[str | None], list[Any]]]:
    """(SQL literals, reference values) per row: literals for the server, values for
    rows.render (the text PostgreSQL prints, for the ``other`` kinds)."""
    out = []
    for n, row in enumerate(_PG_ONLY, 1):
        literals: list[str | None] = [str(1), str(n)]
        values: list[Any] = [1, n]
        for name, *_ in POSTGRES_ONLY_COLUMNS[2:]:
            literal, value = row[name]
            literals.append(literal)
            values.append(value)
        out.append((literals, values))
    return out


def _encode(value: Any) -> Any:
    """A typed value as JSON, tagged so that it reads back as the same Python value."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"double": struct.pack(">d", value).hex()}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, dt.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"date": value.isoformat()}
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(type(value))


def decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (tag, text), = value.items()
    return {
        "double": lambda: _double(text), "decimal": lambda: Decimal(text), "bytes": lambda: bytes.fromhex(text),
        "datetime": lambda: dt.datetime.fromisoformat(text), "date": lambda: dt.date.fromisoformat(text),
    }[tag]()


def reference(which: str) -> dict[str, Any]:
    """The file's section for one table, computed by the Python reference."""
    cols = columns(which)
    data = portable_rows() if which == "portable" else [values for _, values in postgres_only_rows()]
    readings = rows.reference_readings(cols, data, ["k"], "amount" if which == "portable" else None)
    section: dict[str, Any] = {
        "columns": [{"name": c.name, "type": c.type_name, "kind": rows.kind_of(c)} for c in cols],
        "rows": [],
        "readings": readings.as_dict(),
    }
    for values in data:
        text = rows.row_text(cols, values)
        section["rows"].append({"values": [_encode(v) for v in values], "text": text, "hash": rows.row_hash(text)})
    if which == "postgres_only":
        section["literals"] = [literals for literals, _ in postgres_only_rows()]
    return section


def load() -> dict[str, Any]:
    return json.loads(FILE.read_text(encoding="utf-8"))


def write() -> None:
    document = {
        "format": rows.FORMAT,
        "about": "Fingerprint format 3 golden vectors (docs/fingerprint.md): typed values, row texts, "
                 "row hashes and the readings of each table (business key k, total amount).",
        "portable": reference("portable"),
        "postgres_only": reference("postgres_only"),
    }
    FILE.write_text(json.dumps(document, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write()
