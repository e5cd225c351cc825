"""The control schema: snapshots and plans (and, later, approvals and the ledger).

It lives in the same database as the target, so a plan, its stages and the target can be
read in one transaction.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

_LOCK = sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))")

_DDL = (
    sql.SQL("CREATE SCHEMA IF NOT EXISTS {schema}"),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.snapshots ("
        "snapshot_id text PRIMARY KEY, source_table text NOT NULL, mode text NOT NULL, "
        "snapshot_table text, partition_key text NOT NULL, partitions jsonb NOT NULL, "
        "fingerprint text NOT NULL, created_at timestamptz NOT NULL)"
    ),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.plans ("
        "plan_id text PRIMARY KEY, spec_name text NOT NULL, target_table text NOT NULL, "
        "status text NOT NULL CHECK (status IN ('ready', 'refused')), "
        "snapshot_id text NOT NULL REFERENCES {schema}.snapshots (snapshot_id), "
        "plan jsonb NOT NULL, created_at timestamptz NOT NULL)"
    ),
)

_SNAPSHOT_ROW = sql.SQL(
    "SELECT snapshot_id, snapshot_table, fingerprint FROM {schema}.snapshots "
    "WHERE snapshot_id = %(snapshot_id)s"
)
_INSERT_SNAPSHOT = sql.SQL(
    "INSERT INTO {schema}.snapshots (snapshot_id, source_table, mode, snapshot_table, "
    "partition_key, partitions, fingerprint, created_at) VALUES (%(snapshot_id)s, "
    "%(source_table)s, %(mode)s, %(snapshot_table)s, %(partition_key)s, %(partitions)s, "
    "%(fingerprint)s, %(created_at)s) ON CONFLICT (snapshot_id) DO NOTHING"
)
_INSERT_PLAN = sql.SQL(
    "INSERT INTO {schema}.plans (plan_id, spec_name, target_table, status, snapshot_id, plan, "
    "created_at) VALUES (%(plan_id)s, %(spec_name)s, %(target_table)s, %(status)s, "
    "%(snapshot_id)s, %(plan)s, %(created_at)s) ON CONFLICT (plan_id) DO NOTHING"
)
_PLAN_ROW = sql.SQL("SELECT status, plan FROM {schema}.plans WHERE plan_id = %(plan_id)s")


def ensure_control_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create the control schema and its tables if missing, in the caller's transaction.

    An advisory transaction lock keeps two first runs from racing on CREATE.
    """
    conn.execute(_LOCK, {"key": f"backfill_assets:control:{schema}"})
    for ddl in _DDL:
        conn.execute(ddl.format(schema=sql.Identifier(schema)))


def find_snapshot(conn: psycopg.Connection, schema: str, snapshot_id: str) -> tuple[str, str | None, str] | None:
    """(snapshot_id, snapshot_table, fingerprint) of a recorded snapshot, or None."""
    row = conn.execute(
        _SNAPSHOT_ROW.format(schema=sql.Identifier(schema)), {"snapshot_id": snapshot_id}
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def record_snapshot(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record a snapshot (idempotent: the id is derived from its content)."""
    fields = {**fields, "partitions": Jsonb(fields["partitions"])}
    conn.execute(_INSERT_SNAPSHOT.format(schema=sql.Identifier(schema)), fields)


def record_plan(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record a plan (idempotent: the id is derived from its content)."""
    fields = {**fields, "plan": Jsonb(fields["plan"])}
    conn.execute(_INSERT_PLAN.format(schema=sql.Identifier(schema)), fields)


def load_plan(conn: psycopg.Connection, schema: str, plan_id: str) -> tuple[str, dict[str, Any]] | None:
    """(status, plan document) of a stored plan, or None."""
    row = conn.execute(_PLAN_ROW.format(schema=sql.Identifier(schema)), {"plan_id": plan_id}).fetchone()
    if row is None:
        return None
    doc = row[1] if isinstance(row[1], dict) else json.loads(row[1])
    return row[0], doc
