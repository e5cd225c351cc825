"""A realistic, messy, deterministic sample source for the demo and the tests.

Late corrections, exact re-ingested duplicates, ties on ``updated_at`` broken by
``ingest_seq``, NULL business keys, unicode and control characters in text, an empty
partition, records whose correction moves them to another day (one of them out of the
demo's range), and a stale target to be replaced.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from pathlib import Path

import psycopg
from psycopg import sql

DEMO_DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(7)]
EMPTY_DAY = dt.date(2024, 1, 5)  # no source rows: its target partition will be emptied
# (order_id, from day, to day): a correction moves the order; the second leaves the range.
MOVES = (
    (dt.date(2024, 1, 3).toordinal() * 1000 + 10, dt.date(2024, 1, 3), dt.date(2024, 1, 4)),
    (dt.date(2024, 1, 7).toordinal() * 1000 + 5, dt.date(2024, 1, 7), dt.date(2024, 1, 8)),
)
NOTES = [
    "café ☕", "tab\there", "line\nbreak", "back\\slash", "quote ' and \"", "", None, "NULL",
    "日本語", "emoji 🧾", "carriage\rreturn", "plain",
]

_DDL = (
    sql.SQL("DROP TABLE IF EXISTS {src}, {tgt}"),
    sql.SQL(
        "CREATE TABLE {src} (order_date date, order_id bigint, customer_id bigint, "
        "updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, amount numeric(12,2), "
        "status text, note text)"
    ),
    sql.SQL(
        "CREATE TABLE {tgt} (order_date date NOT NULL, order_id bigint NOT NULL, "
        "customer_id bigint, updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, "
        "amount numeric(12,2), status text, note text, "
        "CONSTRAINT orders_daily_order_key UNIQUE (order_id))"
    ),
)
_COLUMNS = ("order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note")
_INSERT = sql.SQL("INSERT INTO {rel} ({cols}) VALUES ({values})")
COLUMNS = _COLUMNS
# The loaded source, as the DuckDB step of the demo writes it to a Delta table.
SOURCE_ROWS_QUERY = sql.SQL("SELECT {} FROM public.orders_raw").format(sql.SQL(", ").join(map(sql.Identifier, _COLUMNS)))


def arrow_schema() -> object:
    """The source's columns as Arrow types (imported here: only the lake steps need pyarrow)."""
    import pyarrow as pa
    return pa.schema([
        ("order_date", pa.date32()), ("order_id", pa.int64()), ("customer_id", pa.int64()),
        ("updated_at", pa.timestamp("us", tz="UTC")), ("ingest_seq", pa.int64()), ("amount", pa.decimal128(12, 2)),
        ("status", pa.string()), ("note", pa.string()),
    ])


def write_parquet_folder(folder: Path, partition_key: str = "order_date", rows: list[tuple] | None = None) -> int:
    """The sample source rows (default: those :func:`load` inserts) as a Hive-partitioned
    Parquet folder, ``<partition_key>=<value>/part-0.parquet`` (the partitions written are
    replaced): the source of ``deploy/examples/orders_spark.yaml``. Returns the rows written."""
    import pyarrow as pa
    import pyarrow.dataset as pads
    rows = source_rows() if rows is None else rows
    data = pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=arrow_schema())
    pads.write_dataset(data, str(folder), format="parquet", partitioning=[partition_key], partitioning_flavor="hive",
                       existing_data_behavior="delete_matching")
    return data.num_rows


def source_rows(orders_per_day: int = 24, seed: int = 20240101, *, moved: bool = True) -> list[tuple]:
    """The raw source rows, in ingest order (a list, so tests can compute the answer).

    With ``moved``, the orders in MOVES get a later version dated on another day.
    """
    rng = random.Random(seed)
    rows: list[tuple] = []
    seq = 0
    for day in DEMO_DAYS:
        if day == EMPTY_DAY:
            continue
        base = dt.datetime.combine(day, dt.time(8), tzinfo=dt.timezone.utc)
        for n in range(orders_per_day):
            order_id = day.toordinal() * 1000 + n
            customer = rng.randrange(100, 120)
            amount = Decimal(rng.randrange(500, 50000)) / 100
            at = base + dt.timedelta(minutes=7 * n)
            seq += 1
            rows.append((day, order_id, customer, at, seq, amount, "placed", rng.choice(NOTES)))
            kind = n % 6
            if kind == 1:  # a late correction, hours later
                seq += 1
                rows.append((day, order_id, customer, at + dt.timedelta(hours=30), seq,
                             amount + Decimal("1.50"), "corrected", rng.choice(NOTES)))
            elif kind == 2:  # re-ingested: an exact duplicate row
                rows.append(rows[-1])
            elif kind == 3:  # same updated_at, different content: ingest_seq breaks the tie
                seq += 1
                rows.append((day, order_id, customer, at, seq, amount, "shipped", rng.choice(NOTES)))
            elif kind == 4:  # an older version arriving late (lower updated_at, higher seq)
                seq += 1
                rows.append((day, order_id, customer, at - dt.timedelta(hours=1), seq,
                             amount - Decimal("1.00"), "draft", None))
        for order_id, old, new in MOVES if moved else ():
            if old == day:  # the correction re-dates the order: it moves partition
                seq += 1
                at = base + dt.timedelta(days=2)
                rows.append((new, order_id, 199, at, seq, Decimal("42.00"), "re-dated", "moved"))
        for _ in range(2):  # rows without a business key: dropped
            seq += 1
            rows.append((day, None, rng.randrange(100, 120), base, seq, Decimal("9.99"), "orphan", "no key"))
    return rows


def stale_target_rows(*, moved: bool = True) -> list[tuple]:
    """What an earlier run left in the target: old versions, rows in the empty day, and the
    moved orders in their old days."""
    at = dt.datetime(2023, 12, 31, tzinfo=dt.timezone.utc)
    rows = [
        (day, day.toordinal() * 1000 + n, 1, at, 0, Decimal("0.01"), "stale", "from an old run")
        for day in DEMO_DAYS for n in range(3)
    ]
    rows += [(old, order_id, 1, at, 0, Decimal("0.02"), "stale", "before the move")
             for order_id, old, _ in (MOVES if moved else ())]
    return rows


def load(conn: psycopg.Connection, schema: str = "public", orders_per_day: int = 24, *,
         moved: bool = True) -> None:
    """(Re)create ``orders_raw`` and ``orders_daily`` in ``schema`` with the demo data.

    The target's key ``UNIQUE (order_id)`` is unique across days, as records that can move
    need; it also enforces the grain ``(order_date, order_id)``.
    """
    src, tgt = sql.Identifier(schema, "orders_raw"), sql.Identifier(schema, "orders_daily")
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)
    values = sql.SQL(", ").join(sql.Placeholder() for _ in _COLUMNS)
    with conn.transaction(), conn.cursor() as cur:
        for ddl in _DDL:
            cur.execute(ddl.format(src=src, tgt=tgt))
        cur.executemany(_INSERT.format(rel=src, cols=cols, values=values), source_rows(orders_per_day, moved=moved))
        cur.executemany(_INSERT.format(rel=tgt, cols=cols, values=values), stale_target_rows(moved=moved))
