"""Writes to the demo source, and the counters the source sensor reads, for the sensor tests."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

INDEX = "CREATE INDEX orders_raw_watch ON public.orders_raw (order_date, ingest_seq)"


def settle(conn: psycopg.Connection, deadline_s: float = 20.0, *, keep: int = 0) -> None:
    """Wait until every other backend of this database has exited (but the one whose pid is
    ``keep``). A backend publishes its pending statistics before it leaves pg_stat_activity,
    so afterwards the counters include everything those connections did."""
    deadline = time.monotonic() + deadline_s
    query = sql.SQL("SELECT count(*) FROM pg_catalog.pg_stat_activity "
                    "WHERE datname = pg_catalog.current_database() AND pid <> pg_catalog.pg_backend_pid() "
                    "AND pid <> %(keep)s")
    while conn.execute(query, {"keep": keep}).fetchone()[0]:
        assert time.monotonic() < deadline, "other backends did not exit"
        time.sleep(0.05)


def write(factory, conn: psycopg.Connection, statement: str, params: dict[str, Any] | None = None) -> None:
    """One write on its own connection, then wait until its counters are published."""
    with factory() as w:
        w.execute(statement.encode(), params)
    settle(conn)


def source_reads(conn: psycopg.Connection) -> tuple[int, int, int, int]:
    """Sequential and index scans of the source, and the rows they returned."""
    row = conn.execute(
        b"SELECT seq_scan, seq_tup_read, coalesce(idx_scan, 0), coalesce(idx_tup_fetch, 0) "
        b"FROM pg_catalog.pg_stat_user_tables WHERE relid = 'public.orders_raw'::regclass"
    ).fetchone()
    return tuple(int(v) for v in row)


NEXT_SEQ = "(SELECT max(ingest_seq) + 1 FROM public.orders_raw)"
