"""A table of events for the time-window tests: its rows over the night New York's clocks fall
back (2024-11-03: 01:00-02:00 happens twice, so the day has 25 hours), the tables they are
loaded into, and the spec that windows them by the hour."""

from __future__ import annotations

import datetime as dt
import zoneinfo
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.core.windows import UTC, Windowing
from backfill_assets_tests.support.specs import URL_ENV

EVENT_COLUMNS = ["created_at", "event_id", "updated_at", "seq", "amount", "note"]
# The hours of New York, as the Dagster code location partitions them (a week of November 2024).
EVENTS_SPEC: dict[str, object] = {
    "name": "events_hourly", "database_url_env": URL_ENV,
    "source": {"table": "public.events_raw", "snapshot": "copy"},
    "target": {"table": "public.events_hourly"},
    "partition_key": "created_at",
    "partition_window": {"every": "hour", "time_zone": "America/New_York"},
    "business_key": ["event_id"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    "columns": EVENT_COLUMNS, "total": "amount", "transform_version": "v1",
    "partitions": {"type": "window", "start": "2024-11-01", "end": "2024-11-08"},
}


def events_spec(target: str | dict[str, Any] | None = None, where: Path | None = None, **changes: Any):
    """EVENTS_SPEC without its Dagster partitions, with ``changes`` (None drops a key), and
    for ``target`` ``delta`` or ``iceberg`` a lake table of that format under ``where`` (or the
    target mapping itself)."""
    data: dict[str, Any] = {k: v for k, v in EVENTS_SPEC.items() if k != "partitions"}
    if isinstance(target, dict):
        data["target"] = target
    elif target is not None:
        assert where is not None
        data["target"] = ({"format": "delta", "location": str(where / "events")} if target == "delta" else
                          {"format": "iceberg", "table": "lake.events",
                           "catalog": {"type": "sql", "warehouse": str(where / "wh")}})
    data.update(changes)
    return spec_from_mapping({k: v for k, v in data.items() if v is not None})


# The events as a lake holds them (Arrow): instants in UTC microseconds, exact decimals.
_TS = pa.timestamp("us", tz="UTC")
EVENTS_ARROW = pa.schema([("created_at", _TS), ("event_id", pa.int64()), ("updated_at", _TS), ("seq", pa.int32()),
                          ("amount", pa.decimal128(12, 2)), ("note", pa.string())])
# New York's hours, as the spec windows them.
NY_HOURS = Windowing("hour", zoneinfo.ZoneInfo("America/New_York"), "timestamptz")


def events_table(rows: list[tuple]) -> pa.Table:
    """Rows of FALL's shape (event_id, created_at, updated_at, seq, amount, note) as Arrow (a
    NULL key kept)."""
    return pa.Table.from_pylist([{"event_id": e, "created_at": c, "updated_at": u, "seq": s, "amount": Decimal(a),
                                  "note": n} for e, c, u, s, a, n in rows], schema=EVENTS_ARROW)


def utc(*parts: int) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=UTC)


FALL = [
    # event_id, created_at (UTC), updated_at, seq, amount, note
    (1, utc(2024, 11, 3, 4, 0), utc(2024, 11, 4), 1, "1.00", "midnight EDT, on the boundary"),
    (1, utc(2024, 11, 3, 4, 30), utc(2024, 11, 4), 2, "2.00", "same window, a later seq wins"),
    (2, utc(2024, 11, 3, 5, 0), utc(2024, 11, 4), 1, "3.00", "01:00 EDT, first of the repeated hour"),
    (2, utc(2024, 11, 3, 6, 0), utc(2024, 11, 4), 1, "4.00", "01:00 EST: the second, its own window"),
    (3, utc(2024, 11, 3, 5, 59, 59, 999999), utc(2024, 11, 5), 1, "5.00", "last microsecond of 01:00 EDT"),
    (3, utc(2024, 11, 3, 5, 59), utc(2024, 11, 4), 9, "6.00", "older version, same window"),
    (4, utc(2024, 11, 3, 7, 0), utc(2024, 11, 4), 1, "7.00", None),
    (5, utc(2024, 11, 4, 4, 59, 59), utc(2024, 11, 4), 1, "8.00", "ünïcödé\ttab\nnewline \x01 " + "long " * 400),
    (6, utc(2024, 11, 4, 5, 0), utc(2024, 11, 4), 1, "9.00", "the next day: outside the plan"),
    (7, utc(2024, 11, 3, 3, 59, 59), utc(2024, 11, 4), 1, "10.00", "the day before: outside the plan"),
    (None, utc(2024, 11, 3, 7, 30), utc(2024, 11, 4), 1, "11.00", "NULL key: dropped"),
]

# Days of New York around both clock changes of 2024 (the 23-hour 10 March, the 25-hour 3
# November), rows on and beside each midnight; no two versions of a key in one day.
DST_DAYS = [
    (1, utc(2024, 3, 10, 4, 59), utc(2024, 3, 12), 1, "1.00", "23:59 EST on 9 March"),
    (2, utc(2024, 3, 10, 5, 0), utc(2024, 3, 12), 1, "2.00", "midnight of 10 March, on the boundary"),
    (3, utc(2024, 3, 11, 3, 59, 59, 999999), utc(2024, 3, 12), 1, "3.00", "last microsecond of 10 March (EDT)"),
    (3, utc(2024, 3, 10, 12, 0), utc(2024, 3, 11), 1, "3.50", "older version, same day"),
    (4, utc(2024, 3, 11, 4, 0), utc(2024, 3, 12), 1, "4.00", "midnight of 11 March (EDT)"),
    (5, utc(2024, 11, 3, 4, 0), utc(2024, 11, 5), 1, "5.00", "midnight of 3 November (EDT)"),
    (6, utc(2024, 11, 4, 4, 59, 59), utc(2024, 11, 5), 1, "6.00", "23:59:59 EST on 3 November"),
    (7, utc(2024, 11, 4, 5, 0), utc(2024, 11, 5), 1, "7.00", "midnight of 4 November: not asked for"),
]
DST_DAY_REQUEST = "2024-03-09..2024-03-11,2024-11-03"

# A `timestamp` column's clock readings in UTC around New York's spring day (23 hours): by New
# York's days, one row on 9 March, two on 10 March, one on 11 March.
UTC_CLOCK_ROWS = [
    (1, dt.datetime(2024, 3, 10, 4, 59, 59, 999999), utc(2024, 3, 11), 1, "1.00", "23:59:59.999999 EST, 9 March"),
    (2, dt.datetime(2024, 3, 10, 5, 0), utc(2024, 3, 11), 1, "2.00", "midnight, 10 March"),
    (3, dt.datetime(2024, 3, 11, 3, 59, 59), utc(2024, 3, 11), 1, "3.00", "23:59:59 EDT, 10 March"),
    (4, dt.datetime(2024, 3, 11, 4, 0), utc(2024, 3, 11), 1, "4.00", "midnight, 11 March"),
]


_CREATE = sql.SQL("CREATE TABLE {} (created_at {}, event_id bigint, updated_at timestamptz, seq int, "
                  "amount numeric(12,2), note text)")
_INSERT = sql.SQL("INSERT INTO public.events_raw (event_id, created_at, updated_at, seq, amount, note) "
                  "VALUES (%s, %s, %s, %s, %s, %s)")


def create_events(conn: psycopg.Connection, rows: list[tuple], ts_type: str = "timestamptz") -> None:
    """``public.events_raw`` holding ``rows`` (an index on created_at) and an empty
    ``public.events_hourly`` with UNIQUE (created_at, event_id); ``ts_type``: the type of both
    tables' created_at."""
    for name in ("events_raw", "events_hourly"):
        conn.execute(_CREATE.format(sql.Identifier("public", name), sql.SQL(ts_type)))  # type: ignore[arg-type]
    conn.execute(sql.SQL("CREATE INDEX ON public.events_raw (created_at)"))
    conn.execute(sql.SQL("ALTER TABLE public.events_hourly ADD UNIQUE (created_at, event_id)"))
    with conn.cursor() as cur:
        cur.executemany(_INSERT, rows)


def naive_newest(rows, windowing: Windowing, labels: list[str]) -> dict[str, list[tuple]]:
    """Newest wins per (window, event_id), by (updated_at, seq) descending: each window's
    rows in the target's column order and key order."""
    best: dict[tuple[str, int], tuple] = {}
    for event_id, created, updated, seq, amount, note in rows:
        label = windowing.label_at(created)
        if event_id is None or label not in labels:
            continue
        row = (created, event_id, updated, seq, Decimal(amount), note)
        if (label, event_id) not in best or (updated, seq) > best[(label, event_id)][2:4]:
            best[(label, event_id)] = row
    out: dict[str, list[tuple]] = {label: [] for label in labels}
    for (label, _), row in sorted(best.items(), key=lambda kv: kv[0][1]):
        out[label].append(row)
    return out


def plan_approve_apply(conn, factory, spec, request: str, run_id: str = "r1"):
    plan = make_plan(spec, PartitionRequest(request), factory)
    with factory.control(conn) as store:
        stored = find_plan(store, spec, plan.plan_id)
    approve_plan(conn, factory, spec, stored, "alice")
    result = apply_plan(spec, plan.plan_id, factory, run_id=run_id)
    return plan, result
