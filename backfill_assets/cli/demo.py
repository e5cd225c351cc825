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


# --- the time-window demo: events by the hours of New York, over the night the clocks fall back

EVENTS_DAY = "2024-11-03"  # in America/New_York: 01:00-02:00 happens twice, so the day has 25 hours
_EVENTS_START = dt.datetime(2024, 11, 3, 3, 30, tzinfo=dt.timezone.utc)  # 23:30 EDT on 2 November
_EVENT_COLUMNS = ("created_at", "event_id", "device_id", "updated_at", "ingest_seq", "reading", "note")
_EVENTS_DDL = (
    sql.SQL("DROP TABLE IF EXISTS {src}, {tgt}"),
    sql.SQL("CREATE TABLE {src} (created_at timestamptz NOT NULL, event_id bigint, device_id int, "
            "updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, reading numeric(10,3), note text)"),
    sql.SQL("CREATE INDEX ON {src} (created_at)"),
    sql.SQL("CREATE TABLE {tgt} (created_at timestamptz NOT NULL, event_id bigint NOT NULL, device_id int, "
            "updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, reading numeric(10,3), note text, "
            "CONSTRAINT events_hourly_key UNIQUE (created_at, event_id))"),
)


def event_rows(seed: int = 20241103) -> list[tuple]:
    """Events every 6 minutes from 23:30 EDT on 2 November to 00:30 EST on 4 November, the
    hour the clocks repeat included, with corrections (a later version of an event), ties on
    ``updated_at`` broken by ``ingest_seq``, NULL event ids, one event exactly on each hour's
    boundary, and the notes of the orders' sample."""
    rng, rows, seq = random.Random(seed), [], 0
    for n in range(26 * 10):
        at = _EVENTS_START + dt.timedelta(minutes=6 * n)
        event_id = None if n % 37 == 11 else 1000 + n
        versions = 1 + (n % 5 == 0) + (n % 11 == 0)
        for v in range(versions):
            seq += 1
            updated = at + dt.timedelta(minutes=30 * (v if n % 7 else 0))  # some versions tie on updated_at
            rows.append((at, event_id, rng.randint(1, 9), updated, seq, Decimal(rng.randint(0, 99999)) / 1000,
                         NOTES[(n + v) % len(NOTES)]))
    return rows


def load_events(conn: psycopg.Connection, schema: str = "public") -> None:
    """(Re)create ``events_raw`` and ``events_hourly`` in ``schema``: the sample events, and a
    stale target row in the repeated hour's second reading."""
    src, tgt = sql.Identifier(schema, "events_raw"), sql.Identifier(schema, "events_hourly")
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in _EVENT_COLUMNS)
    values = sql.SQL(", ").join(sql.Placeholder() for _ in _EVENT_COLUMNS)
    stale = (dt.datetime(2024, 11, 3, 6, 30, tzinfo=dt.timezone.utc), 1, 1, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
             0, Decimal("0.001"), "from an old run")
    with conn.transaction(), conn.cursor() as cur:
        for ddl in _EVENTS_DDL:
            cur.execute(ddl.format(src=src, tgt=tgt))
        cur.executemany(_INSERT.format(rel=src, cols=cols, values=values), event_rows())
        cur.execute(_INSERT.format(rel=tgt, cols=cols, values=values), stale)


# --- several inputs: the events with their device's name, from a dimension table ------------

DEVICES = [(1, "thermostat hall"), (2, "Küche"), (3, "garage door"), (4, "東京 office"), (5, "porch\tlight"),
           (6, "basement pump"), (7, "attic fan"), (8, "Café sensor")]  # device 9 has no row: its name is NULL
_DEVICES_DDL = (
    sql.SQL("DROP TABLE IF EXISTS {dim}, {tgt}"),
    sql.SQL("CREATE TABLE {dim} (device_id int PRIMARY KEY, name text NOT NULL)"),
    sql.SQL("CREATE TABLE {tgt} (created_at timestamptz NOT NULL, event_id bigint NOT NULL, device_id int, "
            "device text, updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, reading numeric(10,3), "
            "CONSTRAINT events_devices_key UNIQUE (created_at, event_id))"),
)


def load_devices(conn: psycopg.Connection, schema: str = "public") -> None:
    """(Re)create ``devices`` (a dimension of the events' devices, one of them missing) and
    the empty target ``events_devices`` in ``schema``."""
    dim, tgt = sql.Identifier(schema, "devices"), sql.Identifier(schema, "events_devices")
    with conn.transaction(), conn.cursor() as cur:
        for ddl in _DEVICES_DDL:
            cur.execute(ddl.format(dim=dim, tgt=tgt))
        cur.executemany(sql.SQL("INSERT INTO {} (device_id, name) VALUES (%s, %s)").format(dim), DEVICES)
