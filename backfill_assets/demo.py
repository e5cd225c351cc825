"""A realistic, messy, deterministic sample source for the demo and the tests.

Late corrections, exact re-ingested duplicates, ties on ``updated_at`` broken by
``ingest_seq``, NULL business keys, unicode and control characters in text, an empty
partition, and a stale target to be replaced.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import psycopg
from psycopg import sql

DEMO_DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(7)]
EMPTY_DAY = dt.date(2024, 1, 5)  # no source rows: its target partition will be emptied
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
        "CONSTRAINT orders_daily_grain UNIQUE (order_date, order_id))"
    ),
)
_COLUMNS = ("order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note")
_INSERT = sql.SQL("INSERT INTO {rel} ({cols}) VALUES ({values})")


def source_rows(orders_per_day: int = 24, seed: int = 20240101) -> list[tuple]:
    """The raw source rows, in ingest order (a list, so tests can compute the answer)."""
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
        for _ in range(2):  # rows without a business key: dropped
            seq += 1
            rows.append((day, None, rng.randrange(100, 120), base, seq, Decimal("9.99"), "orphan", "no key"))
    return rows


def stale_target_rows() -> list[tuple]:
    """What an earlier, buggy run left in the target: old versions and a row in the empty day."""
    at = dt.datetime(2023, 12, 31, tzinfo=dt.timezone.utc)
    rows = [
        (day, day.toordinal() * 1000 + n, 1, at, 0, Decimal("0.01"), "stale", "from an old run")
        for day in DEMO_DAYS for n in range(3)
    ]
    return rows


def load(conn: psycopg.Connection, schema: str = "public", orders_per_day: int = 24) -> None:
    """(Re)create ``orders_raw`` and ``orders_daily`` in ``schema`` with the demo data."""
    src, tgt = sql.Identifier(schema, "orders_raw"), sql.Identifier(schema, "orders_daily")
    cols = sql.SQL(", ").join(sql.Identifier(c) for c in _COLUMNS)
    values = sql.SQL(", ").join(sql.Placeholder() for _ in _COLUMNS)
    with conn.transaction(), conn.cursor() as cur:
        for ddl in _DDL:
            cur.execute(ddl.format(src=src, tgt=tgt))
        cur.executemany(_INSERT.format(rel=src, cols=cols, values=values), source_rows(orders_per_day))
        cur.executemany(_INSERT.format(rel=tgt, cols=cols, values=values), stale_target_rows())
