"""Shapes of source data for the benchmark, the naive way to backfill them, and the command-line runner.

Three shapes, each a deterministic generator (``generate_series`` arithmetic, no random):

- ``current``: the benchmark's own source (``--rows`` rows over 20 daily partitions, about 20%
  later versions of keys, ties on updated_at broken by seq, a few NULL keys, unicode and
  control characters);
- ``wide``: 650k rows over 6 days in 13 columns, half of them re-ingested exact copies,
  newer versions or late-arriving older versions of a key; timestamptz ordering with an
  ingest sequence as the final tiebreak, numeric(14,2) values near their limit, text with
  unicode, control characters and notes of a few hundred characters to a few KB;
- ``small``: 365 daily partitions of 920 to 1000 target rows, about 385k source rows, 10%
  of the keys restated by a later version.

The new shapes' sources carry an index on the partition key, as a source read one partition at
a time would: without it, the naive way's per-partition read is a full scan of the source
(365 of them for ``small``). The current shape keeps the benchmark's historic DDL (no index).

``naive_backfill`` is the way without safety: per partition, in one transaction, DELETE the
target partition and INSERT ... SELECT DISTINCT ON newest-wins, into a target with the same
DDL, at the server's settings (or with a given work_mem, as the core sets for its own
transactions). Sources are vacuumed after the load and each timed run starts after a
CHECKPOINT, so neither way pays for the other's (or the load's) dirty pages and hint bits. ``run_cli`` runs ``backfill-assets plan``, ``approve`` and ``apply`` as processes, the
way a user runs them, with each process's wall time, CPU time and peak RSS.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from psycopg import sql

from backfill_assets.core.windows import Window, window_at, zone

DAY0 = dt.date(2024, 1, 1)
URL_ENV = "BENCH_URL"


def day_list(n: int, first: dt.date = DAY0) -> list[dt.date]:
    """``n`` daily partitions from ``first`` (2024-01-01)."""
    return [first + dt.timedelta(days=i) for i in range(n)]


@dataclass(frozen=True)
class Shape:
    """A source shape: its spec (as the YAML a user writes), DDL, generator and size.

    ``ddl`` creates the schema, the source, the target and the naive way's target (the
    target's DDL copied with ``LIKE ... INCLUDING ALL``); ``generate`` fills the source.
    """

    key: str
    title: str
    spec: dict[str, Any]
    ddl: tuple[sql.Composable, ...]
    generate: sql.Composable
    params: dict[str, Any]
    days: int  # partitions: days, or windows for a shape with a partition_window
    window_start: dt.datetime | None = None  # the first window's start (a shape of time windows)
    first_day: dt.date = DAY0  # the first daily partition (a shape of dates)

    @property
    def schema(self) -> str:
        return self.spec["source"]["table"].split(".")[0]

    @property
    def control_schema(self) -> str:
        return self.spec.get("control_schema", "backfill_control")

    def table(self, which: str) -> sql.Identifier:
        """``src``, ``tgt`` or ``tgt_naive`` of this shape's schema."""
        return sql.Identifier(self.schema, which)

    def days_list(self, n: int | None = None) -> list[dt.date]:
        """The first ``n`` partitions (default: all)."""
        return day_list(self.days if n is None else n, self.first_day)

    def partitions_arg(self, n: int | None = None) -> str:
        """The ``--partitions`` range of the first ``n`` days or windows (default: all)."""
        if self.window_start is not None:
            labels = [w.label for w in self.windows(n)]
            return f"{labels[0]}..{labels[-1]}"
        days = self.days_list(n)
        return f"{days[0].isoformat()}..{days[-1].isoformat()}"

    def windows(self, n: int | None = None) -> list[Window]:
        """The first ``n`` windows of a shape of time windows (default: all)."""
        window = self.spec["partition_window"]
        tz = zone(window["time_zone"])
        assert self.window_start is not None
        found = [window_at(self.window_start, window["every"], tz)]
        while len(found) < (self.days if n is None else n):
            found.append(window_at(found[-1].end, window["every"], tz))
        return found


# --- the current shape (the benchmark's historic source) ------------------------------------

CURRENT_COLUMNS = ["d", "k", "updated_at", "seq", "amount", "status", "note"]
CURRENT_SPEC: dict[str, Any] = {
    "name": "bench", "database_url_env": URL_ENV,
    "source": {"table": "bench.src", }, "target": {"table": "bench.tgt"},
    "partition_key": "d", "business_key": ["k"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    "columns": CURRENT_COLUMNS, "total": "amount", "transform_version": "bench-v1",
    "partitions": {"type": "daily", "start": "2024-01-01", "end": "2025-01-01"},
}
_CURRENT_DDL = (
    sql.SQL("DROP SCHEMA IF EXISTS bench CASCADE"),
    sql.SQL("CREATE SCHEMA bench"),
    sql.SQL("CREATE TABLE bench.src (d date, k bigint, updated_at timestamptz NOT NULL, seq bigint NOT NULL, "
            "amount numeric(12,2), status text, note text)"),
    sql.SQL("CREATE TABLE bench.tgt (d date NOT NULL, k bigint NOT NULL, updated_at timestamptz, seq bigint, "
            "amount numeric(12,2), status text, note text, UNIQUE (d, k))"),
    sql.SQL("CREATE TABLE bench.tgt_naive (LIKE bench.tgt INCLUDING ALL)"),
)
# Per day: `distinct` first versions, then later versions of keys (r * 7919) % distinct; one
# duplicate in ten keeps the original updated_at (a tie that seq breaks); a few NULL keys.
_CURRENT_GENERATE = sql.SQL(
    "INSERT INTO bench.src (d, k, updated_at, seq, amount, status, note) "
    "SELECT date '2024-01-01' + i, "
    "CASE WHEN r %% 49999 = 7 THEN NULL WHEN r < %(distinct)s THEN r ELSE (r * 7919) %% %(distinct)s END, "
    "timestamptz '2024-01-01 00:00+00' + make_interval(days => i, secs => "
    "CASE WHEN r < %(distinct)s THEN r ELSE (r * 7919) %% %(distinct)s END) "
    "+ CASE WHEN r >= %(distinct)s AND r %% 10 <> 0 THEN interval '1 hour' ELSE interval '0' END, "
    "i::bigint * %(per_day)s + r, ((r * 37) %% 100000) / 100.0, "
    "CASE WHEN r >= %(distinct)s THEN 'corrected' ELSE 'placed' END, "
    "'note ' || r || CASE r %% 7 WHEN 0 THEN E'\\t☕' WHEN 1 THEN E'\\nline' WHEN 2 THEN 'é' ELSE '' END "
    "FROM generate_series(0, %(days)s - 1) AS i, generate_series(0::bigint, %(per_day)s - 1) AS r"
)


def current(rows: int, days: int = 20) -> Shape:
    """The benchmark's source: ``rows`` rows over ``days`` daily partitions."""
    per_day = rows // days
    return Shape("current", f"the bench's shape ({per_day * days} rows, {days} partitions)", CURRENT_SPEC,
                 _CURRENT_DDL, _CURRENT_GENERATE,
                 {"distinct": int(per_day * 0.8), "per_day": per_day, "days": days}, days)


# --- wide and duplicate-heavy ---------------------------------------------------------------

WIDE_COLUMNS = ["ingest_day", "event_id", "account_id", "updated_at", "ingest_seq", "amount", "fee",
                "currency", "status", "country", "title", "flags", "note"]
WIDE_SPEC: dict[str, Any] = {
    "name": "bench_wide", "database_url_env": URL_ENV,
    "source": {"table": "bench_wide.src", }, "target": {"table": "bench_wide.tgt"},
    "partition_key": "ingest_day", "business_key": ["event_id"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "ingest_seq", "direction": "desc"}],
    "columns": WIDE_COLUMNS, "total": "amount", "transform_version": "bench-wide-v1",
    "control_schema": "bench_wide_control",
    "partitions": {"type": "daily", "start": "2024-01-01", "end": "2025-01-01"},
}
_WIDE_DDL = (
    sql.SQL("DROP SCHEMA IF EXISTS bench_wide CASCADE"),
    sql.SQL("CREATE SCHEMA bench_wide"),
    sql.SQL("CREATE TABLE bench_wide.src (ingest_day date NOT NULL, event_id bigint, account_id bigint, "
            "updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, amount numeric(14,2), "
            "fee numeric(14,2), currency text, status text, country text, title text, flags integer, note text)"),
    sql.SQL("CREATE INDEX ON bench_wide.src (ingest_day)"),
    sql.SQL("CREATE TABLE bench_wide.tgt (ingest_day date NOT NULL, event_id bigint NOT NULL, account_id bigint, "
            "updated_at timestamptz NOT NULL, ingest_seq bigint NOT NULL, amount numeric(14,2), "
            "fee numeric(14,2), currency text, status text, country text, title text, flags integer, note text, "
            "UNIQUE (ingest_day, event_id))"),
    sql.SQL("CREATE TABLE bench_wide.tgt_naive (LIKE bench_wide.tgt INCLUDING ALL)"),
)
# Per day: `distinct` keys in a first version (v = 0), then one more row per key (r - distinct)
# * 7919 % distinct, by thirds: an exact re-ingested copy of the first version (v = 0 again,
# same ingest_seq: identical rows, not a tie to refuse), a newer version (v = 1; one in nine
# keeps the same updated_at, and the ingest sequence breaks the tie), or a late-arriving older
# version (v = 2: a higher ingest_seq but an earlier updated_at, so it loses). Every column is
# a function of (day, key, version).
_WIDE_GENERATE = sql.SQL(
    "INSERT INTO bench_wide.src (ingest_day, event_id, account_id, updated_at, ingest_seq, amount, fee, "
    "currency, status, country, title, flags, note) "
    "SELECT date '2024-01-01' + i, i * 10000000::bigint + x.key, "
    "CASE WHEN x.key %% 997 = 3 THEN NULL ELSE (x.key * 31) %% 5003 END, "
    "timestamptz '2024-01-01 00:00+00' + make_interval(days => i, secs => x.key * 0.123457) "
    "+ CASE x.v WHEN 1 THEN CASE WHEN x.key %% 9 = 0 THEN interval '0' ELSE interval '17 min 0.000123 s' END "
    "WHEN 2 THEN interval '-3 hours' ELSE interval '0' END, "
    "(i * %(per_day)s::bigint + x.key) * 3 + x.v, "
    "CASE WHEN x.key %% 2 = 0 THEN 1 ELSE -1 END * (999999999999.99 - ((x.key * 7907 + x.v) %% 100000000) / 100.0), "
    "CASE WHEN x.key %% 11 = 0 THEN NULL ELSE ((x.key * 13 + x.v) %% 100000) / 100.0 END, "
    "(ARRAY['EUR', 'USD', 'JPY', 'CHF'])[1 + x.key %% 4], "
    "(ARRAY['booked', 'corrected', 'late-replay'])[1 + x.v], "
    "(ARRAY['DE', 'FR', '日本', E'Côte d\\'Ivoire', 'São Tomé'])[1 + x.key %% 5], "
    "'Zahlung № ' || x.key || CASE x.key %% 6 WHEN 0 THEN E' – Café «Zürich» ✓' WHEN 1 THEN E'\\t東京 🚀' "
    "WHEN 2 THEN E'\\r\\nline two' WHEN 3 THEN E'\\x01ctl\\x1f' WHEN 4 THEN E'back\\\\slash' ELSE '' END, "
    "CASE WHEN x.key %% 13 = 0 THEN NULL ELSE (x.key * 7 + x.v) %% 1024 END, "
    "CASE WHEN x.key %% 17 = 0 THEN NULL ELSE repeat(md5(x.key::text || ':' || x.v) || E' ü\\t', "
    "CASE WHEN x.key %% 10 = 0 THEN 40 + x.key %% 70 ELSE 6 + x.key %% 17 END) END "
    "FROM generate_series(0, %(days)s - 1) AS i, generate_series(0, %(per_day)s - 1) AS r, "
    "LATERAL (SELECT CASE WHEN r < %(distinct)s THEN r ELSE ((r - %(distinct)s) * 7919) %% %(distinct)s END AS key, "
    "CASE WHEN r < %(distinct)s THEN 0 ELSE (r - %(distinct)s) %% 3 END AS v) AS x"
)


def wide(rows: int = 650_000, days: int = 6) -> Shape:
    """Wide and duplicate-heavy: ``rows`` source rows over ``days`` days, half of them collapsed."""
    per_day = rows // days
    return Shape("wide", f"wide, duplicate-heavy ({per_day * days} rows, {len(WIDE_COLUMNS)} columns, "
                         f"{days} partitions)", WIDE_SPEC, _WIDE_DDL, _WIDE_GENERATE,
                 {"distinct": per_day // 2, "per_day": per_day, "days": days}, days)


# --- many small partitions ------------------------------------------------------------------

SMALL_SPEC: dict[str, Any] = {
    **CURRENT_SPEC, "name": "bench_small", "control_schema": "bench_small_control",
    "source": {"table": "bench_small.src", }, "target": {"table": "bench_small.tgt"},
    "transform_version": "bench-small-v1",
}
_SMALL_DDL = (
    sql.SQL("DROP SCHEMA IF EXISTS bench_small CASCADE"),
    sql.SQL("CREATE SCHEMA bench_small"),
    sql.SQL("CREATE TABLE bench_small.src (d date NOT NULL, k bigint, updated_at timestamptz NOT NULL, "
            "seq bigint NOT NULL, amount numeric(12,2), status text, note text)"),
    sql.SQL("CREATE INDEX ON bench_small.src (d)"),
    sql.SQL("CREATE TABLE bench_small.tgt (d date NOT NULL, k bigint NOT NULL, updated_at timestamptz, "
            "seq bigint, amount numeric(12,2), status text, note text, UNIQUE (d, k))"),
    sql.SQL("CREATE TABLE bench_small.tgt_naive (LIKE bench_small.tgt INCLUDING ALL)"),
)
# Day i has n = 920 + (i * 37) % 81 keys, then n / 10 restatements: a later version (one day
# later, a higher seq) of key (j * 7919) % n.
_SMALL_ROWS = (  # each row's values after its day and key, and where they come from
    "timestamptz '2024-01-01 00:00+00' + make_interval(days => i, secs => x.key * 60) "
    "+ CASE WHEN x.restated THEN interval '1 day' ELSE interval '0' END, "
    "i * 10000::bigint + r, ((x.key * 37 + i) %% 100000) / 100.0, "
    "CASE WHEN x.restated THEN 'restated' ELSE 'placed' END, "
    "'note ' || x.key || CASE x.key %% 5 WHEN 0 THEN E'\\t☕' WHEN 1 THEN E'\\nline' WHEN 2 THEN 'é' ELSE '' END "
    "FROM generate_series(0, %(days)s - 1) AS i, LATERAL (SELECT 920 + (i * 37) %% 81 AS n) AS p, "
    "LATERAL generate_series(0, p.n + p.n / 10 - 1) AS r, "
    "LATERAL (SELECT r >= p.n AS restated, CASE WHEN r < p.n THEN r ELSE ((r - p.n) * 7919) %% p.n END AS key) AS x"
)
_SMALL_GENERATE = sql.SQL("INSERT INTO bench_small.src (d, k, updated_at, seq, amount, status, note) "
                          "SELECT date '2024-01-01' + i, x.key, " + _SMALL_ROWS)


def small(days: int = 365) -> Shape:
    """Many small partitions: ``days`` daily partitions of about 1k rows."""
    return Shape("small", f"many small partitions ({days} x ~1k rows)", SMALL_SPEC, _SMALL_DDL,
                 _SMALL_GENERATE, {"days": days}, days)


# --- a fact joined with a dimension (several inputs) --------------------------------------------

# small's rows with a customer id `c`, and a dimension of customers holding a tenth as many rows
# as the source: each row's status is its customer's region. Read with and without the join.
JOINED_CUSTOMERS = 38_500
JOINED_TRANSFORM = ("SELECT s.d, s.k, s.updated_at, s.seq, s.amount, c.region AS status, s.note "
                    "FROM source AS s LEFT JOIN customers AS c ON c.id = s.c")
JOINED_SPEC: dict[str, Any] = {
    **SMALL_SPEC, "name": "bench_joined", "control_schema": "bench_joined_control",
    "source": {"table": "bench_joined.src"}, "target": {"table": "bench_joined.tgt"},
    "inputs": {"customers": {"table": "bench_joined.customers"}}, "transform_sql": JOINED_TRANSFORM,
    "transform_version": "bench-joined-v1",
}
# The same backfill without the join: the same transform's shape over the source alone.
UNJOINED_SPEC: dict[str, Any] = {
    **{k: v for k, v in JOINED_SPEC.items() if k != "inputs"}, "name": "bench_unjoined",
    "control_schema": "bench_unjoined_control", "target": {"table": "bench_joined.tgt_unjoined"},
    "transform_sql": "SELECT s.d, s.k, s.updated_at, s.seq, s.amount, s.status, s.note FROM source AS s",
    "transform_version": "bench-unjoined-v1",
}
# The customers first (a tenth as many as the source's rows), then small's rows, each with the
# customer (seq * 7919) % customers.
_JOINED_CUSTOMERS = sql.SQL(
    "INSERT INTO bench_joined.customers (id, region) SELECT n, 'region ' || (n % 97) || CASE n % 3 WHEN 0 "
    "THEN ' ü' ELSE '' END FROM generate_series(0, {} - 1) AS n").format(sql.Literal(JOINED_CUSTOMERS))
_JOINED_DDL = (
    sql.SQL("DROP SCHEMA IF EXISTS bench_joined CASCADE"),
    sql.SQL("CREATE SCHEMA bench_joined"),
    sql.SQL("CREATE TABLE bench_joined.src (d date NOT NULL, k bigint, c bigint, updated_at timestamptz NOT NULL, "
            "seq bigint NOT NULL, amount numeric(12,2), status text, note text)"),
    sql.SQL("CREATE INDEX ON bench_joined.src (d)"),
    sql.SQL("CREATE TABLE bench_joined.customers (id bigint PRIMARY KEY, region text NOT NULL)"),
    sql.SQL("CREATE TABLE bench_joined.tgt (d date NOT NULL, k bigint NOT NULL, updated_at timestamptz, "
            "seq bigint, amount numeric(12,2), status text, note text, UNIQUE (d, k))"),
    sql.SQL("CREATE TABLE bench_joined.tgt_unjoined (LIKE bench_joined.tgt INCLUDING ALL)"),
    sql.SQL("CREATE TABLE bench_joined.tgt_naive (LIKE bench_joined.tgt INCLUDING ALL)"),
    _JOINED_CUSTOMERS,
)
_JOINED_GENERATE = sql.SQL("INSERT INTO bench_joined.src (d, k, c, updated_at, seq, amount, status, note) "
                           "SELECT date '2024-01-01' + i, x.key, ((i * 10000::bigint + r) * 7919) %% %(customers)s, "
                           + _SMALL_ROWS)


def joined(days: int = 365, spec: dict[str, Any] | None = None) -> Shape:
    """small's ``days`` partitions, each row with a customer of a dimension a tenth the source's
    size (``spec``: JOINED_SPEC, which joins it, or UNJOINED_SPEC, which does not)."""
    spec = JOINED_SPEC if spec is None else spec
    return Shape(spec["name"], f"{days} x ~1k rows joined with {JOINED_CUSTOMERS} customers", spec, _JOINED_DDL,
                 _JOINED_GENERATE, {"days": days, "customers": JOINED_CUSTOMERS}, days)


_NAIVE_JOIN = sql.SQL(
    "INSERT INTO bench_joined.tgt_naive (d, k, updated_at, seq, amount, status, note) "
    "SELECT DISTINCT ON (s.d, s.k) s.d, s.k, s.updated_at, s.seq, s.amount, c.region, s.note "
    "FROM bench_joined.src AS s LEFT JOIN bench_joined.customers AS c ON c.id = s.c "
    "WHERE s.d = %(partition)s AND s.k IS NOT NULL ORDER BY s.d, s.k, s.updated_at DESC, s.seq DESC"
)


def naive_join_backfill(conn: psycopg.Connection, shape: Shape) -> float:
    """The naive way with the join: per partition, one transaction of DELETE + INSERT ...
    SELECT DISTINCT ON over the source joined with the dimension as it is now. Seconds."""
    delete = _NAIVE_DELETE.format(target=shape.table("tgt_naive"), in_part=_AT_VALUE.format(sql.Identifier("d")))
    server_defaults(conn)
    start = time.perf_counter()
    for day in shape.days_list(None):
        with conn.transaction():
            conn.execute(delete, {"partition": day})
            conn.execute(_NAIVE_JOIN, {"partition": day})
    return time.perf_counter() - start


# --- time windows: New York's hours of 2023 -------------------------------------------------

HOURLY_START = dt.datetime(2023, 1, 1, 5, tzinfo=dt.timezone.utc)  # midnight EST, 1 January 2023
HOURLY_COLUMNS = ["at", "k", "updated_at", "seq", "amount", "note"]
HOURLY_SPEC: dict[str, Any] = {
    "name": "bench_hourly", "database_url_env": URL_ENV, "control_schema": "bench_hourly_control",
    "source": {"table": "bench_hourly.src"}, "target": {"table": "bench_hourly.tgt"},
    "partition_key": "at", "partition_window": {"every": "hour", "time_zone": "America/New_York"},
    "business_key": ["k"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    "columns": HOURLY_COLUMNS, "total": "amount", "transform_version": "bench-hourly-v1",
}
# The same rows by New York's days: windows of `at`, and the values of `d` (each row's day there).
DAY_WINDOWS_SPEC: dict[str, Any] = {
    **HOURLY_SPEC, "name": "bench_daywin", "control_schema": "bench_daywin_control",
    "target": {"table": "bench_hourly.tgt_daywin"},
    "partition_window": {"every": "day", "time_zone": "America/New_York"}, "transform_version": "bench-daywin-v1",
}
DAY_VALUES_SPEC: dict[str, Any] = {
    **{k: v for k, v in HOURLY_SPEC.items() if k != "partition_window"}, "name": "bench_dayval",
    "control_schema": "bench_dayval_control", "target": {"table": "bench_hourly.tgt_dayval"}, "partition_key": "d",
    "columns": ["d", *HOURLY_COLUMNS], "transform_version": "bench-dayval-v1",
}
_HOURLY_DDL = (
    sql.SQL("DROP SCHEMA IF EXISTS bench_hourly CASCADE"),
    sql.SQL("CREATE SCHEMA bench_hourly"),
    sql.SQL("CREATE TABLE bench_hourly.src (at timestamptz NOT NULL, d date NOT NULL, k bigint, "
            "updated_at timestamptz NOT NULL, seq bigint NOT NULL, amount numeric(12,2), note text)"),
    sql.SQL("CREATE INDEX ON bench_hourly.src (at)"),
    sql.SQL("CREATE INDEX ON bench_hourly.src (d)"),
    sql.SQL("CREATE TABLE bench_hourly.tgt (at timestamptz NOT NULL, k bigint NOT NULL, updated_at timestamptz, "
            "seq bigint, amount numeric(12,2), note text, UNIQUE (at, k))"),
    sql.SQL("CREATE TABLE bench_hourly.tgt_naive (LIKE bench_hourly.tgt INCLUDING ALL)"),
    sql.SQL("CREATE TABLE bench_hourly.tgt_daywin (LIKE bench_hourly.tgt INCLUDING ALL)"),
    sql.SQL("CREATE TABLE bench_hourly.tgt_dayval (d date NOT NULL, at timestamptz NOT NULL, k bigint NOT NULL, "
            "updated_at timestamptz, seq bigint, amount numeric(12,2), note text, UNIQUE (d, k))"),
)
# Hour i has 40 rows: keys i * 1000 + 0..35, then 4 later versions (an hour newer, a higher seq)
# of keys 0..3, each at a second of the hour; d is the row's day in New York.
_HOURLY_GENERATE = sql.SQL(
    "INSERT INTO bench_hourly.src (at, d, k, updated_at, seq, amount, note) "
    "SELECT x.at, (x.at AT TIME ZONE 'America/New_York')::date, i * 1000::bigint + r %% 36, "
    "x.at + CASE WHEN r >= 36 THEN interval '1 hour' ELSE interval '0' END, i * 100::bigint + r, "
    "((i * 37 + r) %% 100000) / 100.0, 'note ' || r || CASE r %% 5 WHEN 0 THEN E'\\t☕' WHEN 1 THEN 'é' ELSE '' END "
    "FROM generate_series(0, %(hours)s - 1) AS i, generate_series(0, 39) AS r, "
    "LATERAL (SELECT %(start)s::timestamptz + make_interval(hours => i, secs => (r * 89) %% 3600) AS at) AS x"
)


def hourly(hours: int = 8760, spec: dict[str, Any] | None = None, windows: int | None = None) -> Shape:
    """New York's hours of 2023 (8,760 of them, the spring's 23-hour day and the autumn's
    25-hour one included), 40 source rows and 36 target rows each, as time windows of ``at``
    (``spec``: another reading of the same rows, with ``windows`` partitions)."""
    spec = HOURLY_SPEC if spec is None else spec
    every = (spec.get("partition_window") or {}).get("every", "day")
    n = hours if windows is None else windows
    return Shape(spec["name"], f"{n} {every} partitions of New York's {hours} hours of 2023 (~{40 * hours // n} rows each)",
                 spec, _HOURLY_DDL, _HOURLY_GENERATE, {"hours": hours, "start": HOURLY_START}, n,
                 HOURLY_START if spec.get("partition_window") else None, dt.date(2023, 1, 1))


# --- load, reset, the naive way ---------------------------------------------------------------

_DROP_SCHEMA = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE")
_VACUUM_ANALYZE = sql.SQL("VACUUM (ANALYZE) {}")
_TRUNCATE = sql.SQL("TRUNCATE {}")
_COUNT = sql.SQL("SELECT count(*) FROM {}")


def load(conn: psycopg.Connection, shape: Shape) -> int:
    """Create the shape's tables (and drop its control schema), fill the source; return its rows.

    The source is vacuumed as well as analyzed: the first reader of freshly written rows sets
    their hint bits (writing every page once), and that cost belongs to neither way.
    """
    conn.execute(_DROP_SCHEMA.format(sql.Identifier(shape.control_schema)))
    for statement in shape.ddl:
        conn.execute(statement)
    conn.execute(shape.generate, shape.params)
    conn.execute(_VACUUM_ANALYZE.format(shape.table("src")))
    return int(conn.execute(_COUNT.format(shape.table("src"))).fetchone()[0])


def reset(conn: psycopg.Connection, shape: Shape) -> None:
    """The state every timed run starts from: no control schema (no snapshot, stage or plan to
    reuse), both targets empty, dirty pages flushed."""
    conn.execute(_DROP_SCHEMA.format(sql.Identifier(shape.control_schema)))
    conn.execute(_TRUNCATE.format(shape.table("tgt")))
    conn.execute(_TRUNCATE.format(shape.table("tgt_naive")))
    conn.execute(sql.SQL("CHECKPOINT"))


_NAIVE_DELETE = sql.SQL("DELETE FROM {target} WHERE {in_part}")
_NAIVE_INSERT = sql.SQL(
    "INSERT INTO {target} ({columns}) SELECT DISTINCT ON ({grain}) {selected} FROM {source} AS s "
    "WHERE {s_in_part} AND {keyed} ORDER BY {grain}, {ordering}"
)
# One partition's rows: a value (%(partition)s), or a window's range (%(start)s, %(end)s).
_AT_VALUE = sql.SQL("{} = %(partition)s")
_IN_RANGE = sql.SQL("{c} >= %(start)s AND {c} < %(end)s")
_DIRECTION = {"asc": sql.SQL("ASC"), "desc": sql.SQL("DESC")}
_NULLS = {"first": sql.SQL("NULLS FIRST"), "last": sql.SQL("NULLS LAST"), None: sql.SQL("")}
_NOT_NULL = sql.SQL("{} IS NOT NULL")
_ORDER_ITEM = sql.SQL("{} {} {}")


def naive_statements(spec: dict[str, Any], target: sql.Identifier) -> tuple[sql.Composed, sql.Composed]:
    """DELETE one partition of ``target``, and INSERT its newest-wins rows from the source
    (``DISTINCT ON`` the grain, in the spec's ordering; rows with a NULL key dropped). A
    partition is a value of the partition key (``%(partition)s``), or with the spec's
    ``partition_window`` the window from ``%(start)s`` to ``%(end)s``, keyed by the business key."""
    schema, name = spec["source"]["table"].split(".")
    part, keys = spec["partition_key"], spec["business_key"]
    windows = bool(spec.get("partition_window"))

    def in_part(column: sql.Identifier) -> sql.Composed:
        return _IN_RANGE.format(c=column) if windows else _AT_VALUE.format(column)

    grain = sql.SQL(", ").join(sql.Identifier("s", c) for c in [*([] if windows else [part]), *keys])
    ordering = sql.SQL(", ").join(
        _ORDER_ITEM.format(sql.Identifier("s", o["column"]), _DIRECTION[o["direction"]], _NULLS[o.get("nulls")])
        for o in spec["ordering"])
    insert = _NAIVE_INSERT.format(
        target=target, columns=sql.SQL(", ").join(sql.Identifier(c) for c in spec["columns"]),
        grain=grain, selected=sql.SQL(", ").join(sql.Identifier("s", c) for c in spec["columns"]),
        source=sql.Identifier(schema, name), s_in_part=in_part(sql.Identifier("s", part)),
        keyed=sql.SQL(" AND ").join(_NOT_NULL.format(sql.Identifier("s", k)) for k in keys),
        ordering=ordering,
    )
    return _NAIVE_DELETE.format(target=target, in_part=in_part(sql.Identifier(part))), insert


_SET_WORK_MEM = sql.SQL("SELECT set_config('work_mem', %(work_mem)s, true)")


_RESET_JIT = sql.SQL("RESET jit")


def server_defaults(conn: psycopg.Connection) -> psycopg.Connection:
    """The session as a naive backfill's would be: the tool's connections turn JIT off
    (core.pg.db.SESSION_SETTINGS), the server's default is on."""
    conn.execute(_RESET_JIT)
    return conn


def naive_backfill(conn: psycopg.Connection, shape: Shape, n_days: int | None = None,
                   work_mem: str | None = None) -> float:
    """The naive way over the first ``n_days`` partitions: per partition, one transaction of
    DELETE + INSERT ... SELECT DISTINCT ON, into ``tgt_naive`` (the target's DDL). Seconds.

    ``work_mem``: set for each transaction (default: the server's).
    """
    delete, insert = naive_statements(shape.spec, shape.table("tgt_naive"))
    server_defaults(conn)
    start = time.perf_counter()
    for day in shape.days_list(n_days):
        with conn.transaction():
            if work_mem is not None:
                conn.execute(_SET_WORK_MEM, {"work_mem": work_mem})
            conn.execute(delete, {"partition": day})
            conn.execute(insert, {"partition": day})
    return time.perf_counter() - start


def naive_window_backfill(conn: psycopg.Connection, shape: Shape, n: int | None = None) -> float:
    """The naive way over the first ``n`` windows of a shape of time windows: per window, one
    transaction of DELETE + INSERT ... SELECT DISTINCT ON (the business key) of the rows in
    its range of the column. Seconds."""
    delete, insert = naive_statements(shape.spec, shape.table("tgt_naive"))
    server_defaults(conn)
    start = time.perf_counter()
    for window in shape.windows(n):
        bounds = {"start": window.start, "end": window.end}
        with conn.transaction():
            conn.execute(delete, bounds)
            conn.execute(insert, bounds)
    return time.perf_counter() - start


# --- the command line, as processes -------------------------------------------------------------


@dataclass
class Process:
    """One finished process: wall seconds, CPU seconds (user + system) and peak RSS (MiB)."""

    args: list[str]
    seconds: float
    cpu: float
    peak_mib: float
    stdout: str


@dataclass
class CliRun:
    """``plan``, ``approve`` and ``apply`` of one backfill, in that order."""

    plan_id: str
    steps: dict[str, Process] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.steps.values())

    @property
    def peak_mib(self) -> float:
        return max(p.peak_mib for p in self.steps.values())

    def shares(self) -> str:
        """``plan 12.3 s (40%), approve ...``: each process's seconds and share of the whole."""
        return ", ".join(f"{name} {p.seconds:.2f} s ({100 * p.seconds / self.seconds:.0f}%)"
                         for name, p in self.steps.items())


def cli_command() -> list[str]:
    """The installed console script next to this interpreter (as a user runs it)."""
    script = Path(sys.executable).with_name("backfill-assets")
    return [str(script)] if script.exists() else [sys.executable, "-m", "backfill_assets.cli"]


# The measured process is started by this small launcher, not by the benchmark itself: on Linux a
# process's peak RSS (ru_maxrss) starts at the peak RSS of the process it was forked from (exec
# keeps the old image's high-water mark), so a child of the benchmark (100+ MiB with Dagster
# imported) would report at least that. The launcher is ~10 MiB and times the child itself.
_LAUNCHER = """
import json, resource, subprocess, sys, time
report, args = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
code = subprocess.call(args)
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(report, "w") as f:
    json.dump({"returncode": code, "seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
               "maxrss_kib": usage.ru_maxrss}, f)
"""


def run_process(args: Sequence[str], env: dict[str, str], folder: Path, name: str) -> Process:
    """Run ``args`` to completion through the launcher above: its wall seconds, CPU seconds
    and its own peak RSS.

    stdout and stderr go to files in ``folder`` (kept for a failure's post-mortem).

    Raises:
        RuntimeError: a non-zero exit, with the tail of its stderr.
    """
    out_path, err_path, report = folder / f"{name}.out", folder / f"{name}.err", folder / f"{name}.rusage"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, str(report), *args],
                       stdout=out, stderr=err, env=env, cwd=folder, check=True)
    usage = json.loads(report.read_text(encoding="utf-8"))
    if usage["returncode"] != 0:
        tail = err_path.read_text(encoding="utf-8", errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(args[1:3])} exited {usage['returncode']}: {tail}")
    return Process(list(args), usage["seconds"], usage["cpu"], usage["maxrss_kib"] / 1024,
                   out_path.read_text(encoding="utf-8"))


def write_spec(shape: Shape, folder: Path) -> Path:
    """The shape's spec as the YAML file a user writes."""
    path = folder / f"{shape.spec['name']}.yaml"
    path.write_text(yaml.safe_dump(shape.spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def run_cli(shape: Shape, url: str, folder: Path, n_days: int | None = None) -> CliRun:
    """The whole safe backfill of the first ``n_days`` partitions through the command line:
    ``plan --json``, ``approve --yes``, ``apply``, each a fresh process."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = str(write_spec(shape, folder))
    env = {**os.environ, URL_ENV: url}
    cli = cli_command()
    tag = f"{shape.key}-{n_days or shape.days}"
    plan = run_process([*cli, "plan", "--spec", spec_file, "--partitions", shape.partitions_arg(n_days), "--json"],
                       env, folder, f"{tag}-plan")
    plan_id = json.loads(plan.stdout)["plan_id"]
    run = CliRun(plan_id, {"plan": plan})
    run.steps["approve"] = run_process(
        [*cli, "approve", "--spec", spec_file, "--plan", plan_id, "--by", "bench", "--yes"], env, folder, f"{tag}-approve")
    run.steps["apply"] = run_process([*cli, "apply", "--spec", spec_file, "--plan", plan_id], env, folder, f"{tag}-apply")
    return run


def startup_seconds(folder: Path, n: int = 3) -> tuple[float, float]:
    """The fixed cost of one process: ``backfill-assets --help`` (interpreter start and the
    command line's imports), the best of ``n``; and its peak RSS in MiB."""
    folder.mkdir(parents=True, exist_ok=True)
    runs = [run_process([*cli_command(), "--help"], dict(os.environ), folder, "startup") for _ in range(n)]
    fastest = min(runs, key=lambda p: p.seconds)
    return fastest.seconds, fastest.peak_mib


# --- the server's settings ------------------------------------------------------------------------

# The settings that decide how fast a backfill runs, compared with PostgreSQL's built-in defaults.
SETTINGS = ("work_mem", "shared_buffers", "maintenance_work_mem", "max_wal_size", "min_wal_size",
            "synchronous_commit", "fsync", "full_page_writes", "wal_level", "checkpoint_timeout",
            "effective_cache_size", "max_parallel_workers_per_gather", "random_page_cost", "jit",
            "autovacuum", "temp_buffers")
_SETTINGS = sql.SQL(
    "SELECT name, current_setting(name), setting, boot_val, source FROM pg_settings "
    "WHERE name = ANY(%(names)s) ORDER BY name"
)


def server_settings(conn: psycopg.Connection) -> tuple[list[str], list[str]]:
    """The settings above as ``name=value``, and those that differ from PostgreSQL's built-in
    default (``boot_val``; initdb writes some into postgresql.conf at their default values)."""
    shown, changed = [], []
    for name, value, setting, boot, source in conn.execute(_SETTINGS, {"names": list(SETTINGS)}).fetchall():
        shown.append(f"{name}={value}")
        if setting != boot:
            changed.append(f"{name}={value} (built-in default {boot}, set by {source})")
    return shown, changed
