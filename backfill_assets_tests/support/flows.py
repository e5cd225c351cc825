"""The demo's flow in a few calls (plan and approve, apply), and independent references to
check it against: newest wins computed in Python, and the target's hashes."""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal

import psycopg
from psycopg import sql

from backfill_assets.cli import demo
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.fingerprint import rows as fingerprint_rows
from backfill_assets.core.fingerprint.partition import fingerprint_partitions
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest, TableRef

TARGET = TableRef("public", "orders_daily")
ALL_DAYS = PartitionRequest("2024-01-01..2024-01-07")


def newest_wins(rows: list[tuple], *, per_day: bool) -> dict[dt.date, list[tuple]]:
    """An independent newest-wins: the max of (updated_at, ingest_seq) per order_id, across
    days (records can move) or per (day, order_id); rows grouped by their day, key order."""
    best: dict[tuple, tuple] = {}
    for row in rows:
        day, order_id, _, updated_at, seq = row[:5]
        if order_id is None:
            continue
        key = (day, order_id) if per_day else (order_id,)
        if key not in best or (updated_at, seq) > best[key][3:5]:
            best[key] = row
    out: dict[dt.date, list[tuple]] = {}
    for row in sorted(best.values(), key=lambda r: r[1]):
        out.setdefault(row[0], []).append(row)
    return out


def expected_hash(conn: psycopg.Connection, rows: list[tuple]) -> str:
    """The content hash of a partition holding ``rows`` (the target's typed values), computed
    by the plain-Python reference of the fingerprint."""
    cols = table_columns(conn, TARGET)
    return fingerprint_rows.reference_readings(cols, rows, ["order_id"], None).content_hash


def check_against_newest_wins(conn, plan, rows, *, per_day: bool, days: list[dt.date]) -> None:
    """Every partition of the plan: both stages as an independent newest-wins gives them."""
    expected = newest_wins(rows, per_day=per_day)
    by_day = {p["partition"]: p for p in plan.as_json()["partitions"]}
    assert list(by_day) == [d.isoformat() for d in days]
    for day in days:
        entry, want = by_day[day.isoformat()], expected.get(day, [])
        assert entry["match"] and entry["stage_a"] == entry["stage_b"]
        assert entry["stage_a"]["content_hash"] == expected_hash(conn, want)
        assert entry["stage_a"]["row_count"] == len(want)
        total = sum((r[5] for r in want), Decimal("0.00"))
        assert entry["stage_a"]["total"] == (str(total) if want else "0")
        assert entry["stage_a"]["null_key_count"] == entry["stage_a"]["duplicate_key_count"] == 0


def target_hashes(conn: psycopg.Connection, days: list[dt.date] = demo.DEMO_DAYS) -> dict[str, str]:
    """The content hash of each day of the demo target."""
    cols = table_columns(conn, TARGET)
    found = fingerprint_partitions(conn, TARGET, cols, "order_date", ["order_id"], None, days, utf8=True)
    return {d.isoformat(): fp.content_hash for d, fp in zip(days, found)}


DAYS8 = [*demo.DEMO_DAYS, dt.date(2024, 1, 8)]


def approved(conn, factory, spec, request=ALL_DAYS):
    plan = make_plan(spec, request, factory)
    with factory.control(conn) as store:
        stored = find_plan(store, spec, plan.plan_id)
    approve_plan(conn, factory, spec, stored, "alice")
    return plan


def run(spec, plan, factory, **kwargs):
    return apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, **kwargs)


def all_target_rows(conn, day: dt.date | None = None):
    """Every target row, or those of one day, in key order."""
    return conn.execute(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note "
        "FROM public.orders_daily WHERE %(day)s::date IS NULL OR order_date = %(day)s ORDER BY order_id",
        {"day": day},
    ).fetchall()


def target_day_hashes(conn, days=DAYS8):
    return target_hashes(conn, days)


def control_rows(conn: psycopg.Connection, table: str) -> int:
    """The rows of a table of the control schema in ``conn``'s database (0 if it has none)."""
    ref = TableRef("backfill_control", table)
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (str(ref),)).fetchone()[0]:
        return 0
    return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(ref.schema, ref.name))).fetchone()[0]


def ledger_rows(conn) -> int:
    return control_rows(conn, "ledger")
