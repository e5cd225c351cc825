"""Many approvals inserted at once, for the tests of the approval sensor and the ledger's index."""

from __future__ import annotations

import datetime as dt

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from backfill_assets.core.store import control

SCHEMA = "backfill_control"


_SNAPSHOT = sql.SQL(
    "INSERT INTO {schema}.snapshots (snapshot_id, source_table, mode, partition_key, partitions, "
    "fingerprint, created_at) VALUES ('synthetic', 'public.orders_raw', 'copy', 'order_date', '[]', "
    "'synthetic', now())"
)


_PLANS = sql.SQL(
    "INSERT INTO {schema}.plans (plan_id, spec_name, target_table, status, snapshot_id, plan, created_at) "
    "SELECT md5('plan' || n), %(spec)s, 'public.orders_daily', 'ready', 'synthetic', '{{}}', now() "
    "FROM generate_series(1, %(n)s) AS n"
)


# One approval per plan (none superseded), given at each of the times, in order.
_APPROVALS = sql.SQL(
    "INSERT INTO {schema}.approvals (plan_id, spec_name, target_table, partitions, approved_by, "
    "approved_at, target_readings) "
    "SELECT md5('plan' || t.n), %(spec)s, 'public.orders_daily', %(partitions)s, 'alice', t.at, '{{}}' "
    "FROM unnest(%(times)s::timestamptz[]) WITH ORDINALITY AS t(at, n) ORDER BY t.n"
)


def synthetic_approvals(conn: psycopg.Connection, spec_name: str, times: list[dt.datetime],
                        partitions: list[str]) -> None:
    """A control schema holding one ready plan and one approval of it per time, inserted in
    one statement each (the sensor reads nothing else; no plan behind them is readable)."""
    schema = sql.Identifier(SCHEMA)
    with conn.transaction():
        control.ensure_control_schema(conn, SCHEMA)
        conn.execute(_SNAPSHOT.format(schema=schema))
        conn.execute(_PLANS.format(schema=schema), {"spec": spec_name, "n": len(times)})
        conn.execute(_APPROVALS.format(schema=schema), {
            "spec": spec_name, "times": times, "partitions": Jsonb(partitions)})
    control.ensure_ledger_index(conn, SCHEMA)  # as apply builds it
