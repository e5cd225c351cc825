"""A stage partition read from PostgreSQL into Arrow: one CSV COPY in business-key order,
parsed by pyarrow a batch at a time, with the lake types of core.fingerprint.kinds."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.csv as pcsv

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.errors import LakeValueError, SessionNotPinnedError
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order
from backfill_assets.core.vocabulary import TableRef

if TYPE_CHECKING:
    import psycopg

from backfill_assets.core.fingerprint.kinds import kind_of, require_key
from backfill_assets.core.fingerprint.texts import hex_to_binary

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
    conn: psycopg.Connection, rel: TableRef, columns: Sequence[ColumnInfo], by: sqlbuild.PartitionBy | str,
    partition_value: object, business_key: Sequence[str],
) -> pa.Table:
    """The rows of one partition of ``rel`` (``by`` the partition key's values, or its windows) as an Arrow table of :func:`lake_schema`
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
    kinds = [kind_of(c) for c in columns]
    names = [c.name for c in columns]
    require_key(names, business_key)
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
        rel, names, by, business_key_order(columns, business_key), partition_value
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
                    [hex_to_binary(a) if k.name == "bytes" else a for a, k in zip(batch.columns[1:], kinds)],
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
