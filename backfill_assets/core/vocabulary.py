"""The words every module speaks: identifiers, table references, partition values and their
labels, and the limits every connection carries. Nothing here touches a database; identifiers are checked for shape only (non-empty,
no NUL, at most 63 bytes), and core.pg.catalog checks that they exist.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator

from backfill_assets.core.errors import SpecError

# PostgreSQL silently truncates longer identifiers to NAMEDATALEN - 1 bytes.
MAX_IDENTIFIER_BYTES = 63
# Staging objects are named "<name>__stage_a" and "<name>__snap_<16 hex>" in the control schema.
MAX_SPEC_NAME = 40
MAX_PARTITIONS = 100_000


def check_identifier(value: str) -> str:
    """Return ``value`` if it can be a PostgreSQL identifier, else raise ValueError."""
    if not value:
        raise ValueError("an identifier may not be empty")
    if "\x00" in value:
        raise ValueError("an identifier may not contain a NUL character")
    if len(value.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"identifier is longer than {MAX_IDENTIFIER_BYTES} bytes; "
            "PostgreSQL would silently truncate it"
        )
    return value


Identifier = Annotated[str, AfterValidator(check_identifier)]


@dataclass(frozen=True)
class TableRef:
    """A schema-qualified table name, always used as ``sql.Identifier(schema, name)``."""

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.name}"


def parse_table_name(text: str) -> TableRef:
    """Split ``schema.table`` (or ``table``, meaning ``public.table``) into a :class:`TableRef`."""
    parts = text.split(".")
    if len(parts) == 1:
        parts = ["public", parts[0]]
    if len(parts) != 2:
        raise ValueError("a table is written as schema.table (one dot)")
    return TableRef(check_identifier(parts[0]), check_identifier(parts[1]))


def _check_table(value: str) -> str:
    parse_table_name(value)
    return value


TableName = Annotated[str, AfterValidator(_check_table)]


# "window": time windows of a time stamp or date column (core.windows), named by their labels.
PartitionKind = Literal["date", "integer", "text", "window"]
PartitionValue = dt.date | int | str


@dataclass(frozen=True)
class PartitionRequest:
    """Partitions as written on the command line, before the key's type is known."""

    text: str

    def resolve(self, kind: PartitionKind) -> list[PartitionValue]:
        """Turn the request into sorted, distinct typed values for a key of ``kind``.

        ``a..b`` is an inclusive range (dates and integers); ``a,b,c`` is a list.
        """
        assert kind != "window", "a request for windows is read by core.windows.Windowing.request"
        items = request_items(self.text, "2024-01-01..2024-01-31 or a comma list like 2024-01-01,2024-01-03")
        values: set[PartitionValue] = set()
        for item in items:
            if ".." in item:
                lo_text, _, hi_text = item.partition("..")
                if kind == "text":
                    raise SpecError(
                        f"partition range {item!r}: ranges need a date or integer partition "
                        "key; list text partitions with commas"
                    )
                lo, hi = _parse_value(lo_text.strip(), kind), _parse_value(hi_text.strip(), kind)
                if lo > hi:  # type: ignore[operator]
                    raise SpecError(f"partition range {item!r} ends before it starts")
                values.update(_expand(lo, hi))
            else:
                values.add(_parse_value(item, kind))
            if len(values) > MAX_PARTITIONS:
                raise SpecError(f"--partitions names more than {MAX_PARTITIONS} partitions")
        return sorted(values)  # type: ignore[type-var]


def request_items(text: str, write: str) -> list[str]:
    """The comma-separated items of a ``--partitions`` request; SpecError, saying to ``write``
    what an item looks like, if it is empty or has an empty item."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise SpecError(f"--partitions is empty or has an empty item; write {write}")
    return items


def _parse_value(text: str, kind: PartitionKind) -> PartitionValue:
    if kind == "date":
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            raise SpecError(
                f"partition {text!r} is not a date; the partition key is a date, "
                "write partitions as YYYY-MM-DD"
            ) from None
    if kind == "integer":
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise SpecError(f"partition {text!r} is not an integer; the partition key is an integer")
        return int(text)
    if "\x00" in text:
        raise SpecError("a partition value may not contain a NUL character")
    return text


def _expand(lo: PartitionValue, hi: PartitionValue) -> list[PartitionValue]:
    if isinstance(lo, dt.date) and isinstance(hi, dt.date):
        days = (hi - lo).days
        if days >= MAX_PARTITIONS:
            raise SpecError(f"a partition range may span at most {MAX_PARTITIONS} partitions")
        return [lo + dt.timedelta(days=i) for i in range(days + 1)]
    assert isinstance(lo, int) and isinstance(hi, int)
    if hi - lo >= MAX_PARTITIONS:
        raise SpecError(f"a partition range may span at most {MAX_PARTITIONS} partitions")
    return list(range(lo, hi + 1))


def parse_labels(labels: list[str], kind: PartitionKind) -> list[PartitionValue]:
    """Typed partition values from their labels (as stored in a plan), in the given order."""
    return [_parse_value(label, kind) for label in labels]


def partition_label(value: PartitionValue) -> str:
    """The string form of a partition used in plans, ledgers and JSON (ISO for dates)."""
    return value.isoformat() if isinstance(value, dt.date) else str(value)


# The memory each sort or hash of the tool's own statements may use before it spills to disk.
# A default server gives 4MB, so a 50k-row partition's sort goes to temporary files; this is
# set for the tool's own connections only, and bounded (a statement has a few such nodes, and
# at most two connections of one run are busy at once).
WORK_MEM = "64MB"


@dataclass(frozen=True)
class Limits:
    """The finite waits of every connection the tool opens: how long a statement may wait for
    a lock (any lock: a table, a row, an advisory lock) and how long it may run at all.

    They reach the server as connection options (``-c lock_timeout=...``), so they hold from
    the first statement of the session to the last, whatever the code path. A spec's come
    from its ``lock_timeout_ms`` and ``statement_timeout_ms`` (``Spec.limits``); the statement
    bound covers the builds too, so a larger partition raises it in the spec, in one place.
    """

    lock_timeout_ms: int
    statement_timeout_ms: int
    work_mem: str | None = WORK_MEM  # None: the server's own (a benchmark's naive side)

    def __post_init__(self) -> None:
        if self.lock_timeout_ms <= 0 or self.statement_timeout_ms <= 0:
            raise ValueError("lock and statement timeouts must be positive (0 would mean no bound)")

    def options(self, given: str | None = None) -> str:
        """The libpq ``options`` that set them (and the tool's ``work_mem``) at connect time,
        after the ``given`` options (of a URL, or ``PGOPTIONS``), so that they win."""
        work_mem = "" if self.work_mem is None else f" -c work_mem={self.work_mem}"
        own = f"-c lock_timeout={self.lock_timeout_ms} -c statement_timeout={self.statement_timeout_ms}{work_mem}"
        return f"{given} {own}" if given else own


# For connections that serve no spec (the embedded server's setup, the UI's launcher, tests).
DEFAULT_LIMITS = Limits(lock_timeout_ms=5_000, statement_timeout_ms=600_000)
