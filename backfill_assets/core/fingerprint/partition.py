"""Canonical fingerprints of a partition (the byte format is docs/fingerprint.md).

The content hash is SHA-256 over a preamble naming the columns and their types, then one
record per row in business-key order: a 2-byte column count, then per column a 4-byte signed
length (-1 for NULL) and the UTF-8 bytes of the value's PostgreSQL text form. Integers are
big-endian. This is exactly PostgreSQL's binary COPY row format for text columns, so the
server builds the bytes and we stream them into hashlib without decoding a value.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from backfill_assets.core.errors import BackfillError
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import ColumnInfo
from backfill_assets.core.vocabulary import TableRef

FORMAT_TAG = b"backfill-assets/fingerprint/v1\n"

_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_HEADER = len(_COPY_SIGNATURE) + 8  # signature, int32 flags, int32 extension length
_COPY_TRAILER = b"\xff\xff"


@dataclass(frozen=True)
class Fingerprint:
    """The readings of one partition of one relation."""

    row_count: int
    null_key_count: int
    duplicate_key_count: int
    total: str | None
    content_hash: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def differences(self, other: Fingerprint) -> list[str]:
        """Names of the readings that differ."""
        mine, theirs = self.as_dict(), other.as_dict()
        return [k for k in mine if mine[k] != theirs[k]]


def _int16(n: int) -> bytes:
    return struct.pack("!h", n)


def _field(value: bytes | None) -> bytes:
    if value is None:
        return struct.pack("!i", -1)
    return struct.pack("!i", len(value)) + value


def preamble(columns: Sequence[tuple[str, str]]) -> bytes:
    """The bytes hashed before the rows: format tag, then (name, type) of each column."""
    out = [FORMAT_TAG, _int16(len(columns))]
    for name, type_name in columns:
        out.append(_field(name.encode("utf-8")))
        out.append(_field(type_name.encode("utf-8")))
    return b"".join(out)


def encode_row(values: Sequence[str | None]) -> bytes:
    """One row record from the values' text forms (None is SQL NULL)."""
    return _int16(len(values)) + b"".join(
        _field(None if v is None else v.encode("utf-8")) for v in values
    )


def reference_digest(
    columns: Sequence[tuple[str, str]], rows: Iterable[Sequence[str | None]]
) -> str:
    """The content hash computed in plain Python from text values already in key order.

    This is the specification the streaming path must agree with; tests pin both.
    """
    h = hashlib.sha256(preamble(columns))
    for row in rows:
        h.update(encode_row(row))
    return h.hexdigest()


class CopyFormatError(BackfillError):
    """The server sent a binary COPY stream this module does not understand."""


def _hash_copy_stream(chunks: Iterable[bytes | memoryview], h: hashlib._Hash) -> None:
    """Feed the row records of a binary COPY stream into ``h``, skipping header and trailer.

    The last chunk is held back by one step so that its 2-byte trailer can be cut off
    without copying every chunk. (PostgreSQL sends one message per row and the trailer in
    a message of its own, but nothing here relies on that.)
    """
    head = b""
    pending: memoryview | None = None
    started = False
    for chunk in chunks:
        if not started:
            head += bytes(chunk)
            if len(head) < _COPY_HEADER:
                continue
            if head[: len(_COPY_SIGNATURE)] != _COPY_SIGNATURE:
                raise CopyFormatError("binary COPY stream has an unknown signature")
            extension = struct.unpack("!i", head[len(_COPY_SIGNATURE) + 4 : _COPY_HEADER])[0]
            if len(head) < _COPY_HEADER + extension:
                continue
            chunk = head[_COPY_HEADER + extension :]
            started = True
        if pending is None:
            pending = memoryview(chunk)
        elif len(chunk) >= len(_COPY_TRAILER):
            h.update(pending)
            pending = memoryview(chunk)
        else:  # a tiny chunk: keep enough bytes back to hold the whole trailer
            pending = memoryview(bytes(pending) + bytes(chunk))
    if pending is None or bytes(pending[-2:]) != _COPY_TRAILER:
        raise CopyFormatError("binary COPY stream ended without its trailer")
    h.update(pending[:-2])


def content_hash(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo],
    partition_key: str, order: Sequence[sqlbuild.OrderKey], partition: object,
    *, indexed: bool = False,
) -> str:
    """Stream one partition of ``rel`` through the canonical encoding into SHA-256.

    Runs in the caller's transaction; the connection must be pinned (see db.pin_session).
    """
    return content_hash_where(
        conn, rel, columns, sqlbuild.in_partition(partition_key), order, {"partition": partition},
        indexed=indexed,
    )


def content_hash_where(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo],
    where: sql.Composable, order: Sequence[sqlbuild.OrderKey], params: dict[str, object],
    *, indexed: bool = False,
) -> str:
    """The canonical hash of the rows of ``rel`` (aliased ``t``) matching ``where``.

    ``indexed``: an index on (partition key, ``order``) exists; read in its order rather
    than sorting (see :func:`sorts_disabled`).
    """
    h = hashlib.sha256(preamble([(c.name, c.type_name) for c in columns]))
    query, params = sqlbuild.copy_canonical_stream(rel, [c.name for c in columns], where, order, params)
    with sorts_disabled(conn, indexed), conn.cursor() as cur, cur.copy(query, params) as copy:
        _hash_copy_stream(copy, h)
    return h.hexdigest()


SNAPSHOT_ROWS_TAG = b"backfill-assets/snapshot-rows/v2\n"

# Types whose equal values have one binary form (see :func:`exact_in_binary`).
_EXACT_BASES = frozenset({
    "int2", "int4", "int8", "bool", "date", "timestamp", "timestamptz", "time", "text", "varchar",
    "uuid", "bytea", "char", "name", "oid",
})


def exact_in_binary(column: ColumnInfo) -> bool:
    """Whether two values of the column that compare equal (collatable ones under ``COLLATE
    "C"``, by bytes) always have the same binary form, and the type has a sort order.

    Numeric and blank-padded char only with a declared scale or length (``1.5 = 1.50`` and
    ``'a' = 'a '`` otherwise); floats (``-0 = 0``), intervals (``'1 day' = '24 hours'``),
    json, arrays, enums and every other type are read as text instead.
    """
    # The column's own declared scale or length (format_type's "numeric(12,2)"), not a
    # domain's: a domain's name says nothing about the typmod its values are stored with.
    if column.base_type == "numeric":
        return column.type_name.startswith("numeric(")
    if column.base_type == "bpchar":
        return column.type_name.startswith("character(")
    return column.base_type in _EXACT_BASES


def snapshot_rows_hash(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], where: sql.Composable,
    params: dict[str, object],
) -> tuple[int, str]:
    """The number and the SHA-256 of the rows of ``rel`` (aliased ``t``) matching ``where``,
    independent of their physical order: the readings of a snapshot's partition
    (docs/fingerprint.md, "The source snapshot fingerprint"), in one pass (the count is the
    COPY's own).

    A source has no key, so its rows are put in a total order of their values, typed where
    that is exact (:func:`exact_in_binary`: a typed sort, and a binary value nobody decodes,
    are cheaper than text); the stream is hashed as the server sends it. It names the server's
    binary forms, so it identifies a snapshot on PostgreSQL; it is not the portable stage
    fingerprint.
    """
    forms = [(c, exact_in_binary(c)) for c in columns]
    head = [SNAPSHOT_ROWS_TAG, _int16(len(columns))]
    for c, exact in forms:
        head += [_field(c.name.encode("utf-8")), _field(f"{c.type_name} {'binary' if exact else 'text'}".encode("utf-8"))]
    h = hashlib.sha256(b"".join(head))
    query, params = sqlbuild.copy_snapshot_stream(rel, [(c.name, exact, c.collatable) for c, exact in forms], where, params)
    with conn.cursor() as cur:
        with cur.copy(query, params) as copy:
            _hash_copy_stream(copy, h)
        return cur.rowcount, h.hexdigest()


@contextlib.contextmanager
def sorts_disabled(conn: psycopg.Connection, disabled: bool = True) -> Iterator[None]:
    """Make the planner read an ordered partition through its index instead of sorting it.

    On a freshly built table (no statistics, few visible pages) the planner picks a bitmap
    scan and an external sort over the (partition, key) index scan, about 20% slower on the
    whole stream. ``enable_sort`` is set for the caller's transaction and restored after;
    with no index to give the order the planner still sorts. Outside a transaction it does
    nothing.
    """
    in_transaction = conn.info.transaction_status == TransactionStatus.INTRANS
    if not (disabled and in_transaction):
        yield
        return
    row = conn.execute(_SORTS_OFF).fetchone()
    try:
        yield
    finally:
        if row is not None and conn.info.transaction_status == TransactionStatus.INTRANS:
            conn.execute(_RESTORE_SORTS, {"value": row[0]})


_SORTS_OFF = sql.SQL("SELECT current_setting('enable_sort'), set_config('enable_sort', 'off', true)")
_RESTORE_SORTS = sql.SQL("SELECT set_config('enable_sort', %(value)s, true)")


def business_key_order(columns: Sequence[ColumnInfo], business_key: Sequence[str]) -> list[sqlbuild.OrderKey]:
    """Ascending business-key order; collatable columns by bytes (locale-independent)."""
    by_name = {c.name: c for c in columns}
    return [sqlbuild.OrderKey(k, collate_c=by_name[k].collatable) for k in business_key]


def fingerprint_partition(
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo],
    partition_key: str, business_key: Sequence[str], total: str | None, partition: object,
    *, key_unique: bool = False, indexed: bool = False,
) -> Fingerprint:
    """All readings of one partition of a stage or target, in the caller's transaction.

    Call it inside one REPEATABLE READ transaction (or the writing transaction itself) so
    that the counts and the hash describe the same rows. ``key_unique``: a unique index or
    constraint covers (partition key, business key), so duplicates cannot exist and are not
    counted (stages have one; a target passes the grain check before any read).
    ``indexed``: an index gives the partition in business-key order (see
    catalog.has_ordered_index); the hash reads it instead of sorting.
    """
    query, params = sqlbuild.partition_readings(
        rel, partition_key, business_key, total, partition, key_unique=key_unique
    )
    row = conn.execute(query, params).fetchone()
    assert row is not None
    row_count, null_keys, total_text, duplicates = row
    if row_count == 0:  # nothing to stream: the hash of the preamble alone
        digest = hashlib.sha256(preamble([(c.name, c.type_name) for c in columns])).hexdigest()
    else:
        digest = content_hash(
            conn, rel, columns, partition_key, business_key_order(columns, business_key), partition,
            indexed=indexed,
        )
    return Fingerprint(
        row_count=int(row_count), null_key_count=int(null_keys),
        duplicate_key_count=int(duplicates), total=total_text, content_hash=digest,
    )
