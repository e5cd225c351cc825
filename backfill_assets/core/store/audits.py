"""The audits: every time ``audit`` looked at a partition of a target, what it compared the
partition with (the newest verified ledger row), how (a metadata signal or the fingerprint)
and what it found. Kept in the control schema (core.store.control creates the table), read
by the next audit (a partition last seen holding, with the same signal since, still holds),
by ``status`` and by the Dagster check."""

from __future__ import annotations

import datetime as dt
from typing import Any, NotRequired, TypedDict, cast

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from backfill_assets.core.differences import FirstKey
from backfill_assets.core.store.control import control_ready

# The newest verified ledger row of each partition of a target (what an audit compares the
# partition with), and the newest ledger row of any status, when a run reached the partition
# after it (a run that started or failed after the verification: the audit says so).
_VERIFIED = sql.SQL(
    "SELECT DISTINCT ON (v.partition) v.partition, v.run_id, v.plan_id, v.row_count, v.total, "
    "v.content_hash, v.target_version, v.finished_at, "
    "(SELECT l.run_id || ' ' || l.status FROM {schema}.ledger AS l WHERE l.target_table = v.target_table "
    "AND l.partition = v.partition AND l.status IN ('started', 'failed') AND l.run_started_at > v.run_started_at "
    "ORDER BY l.run_started_at DESC LIMIT 1) "
    "FROM {schema}.ledger AS v WHERE v.target_table = %(target_table)s "
    "AND v.status IN ('verified', 'skipped-already-verified') "
    "ORDER BY v.partition, v.finished_at DESC, v.run_started_at DESC"
)

VERIFIED_FIELDS = ("partition", "run_id", "plan_id", "row_count", "total", "content_hash", "target_version",
                   "verified_at", "later_run")


class VerifiedRow(TypedDict):
    """A partition's newest verified ledger row (``VERIFIED_FIELDS``)."""

    partition: str
    run_id: str
    plan_id: str
    row_count: int
    total: str | None
    content_hash: str
    target_version: str | None  # the lake version it was verified at (None: PostgreSQL)
    verified_at: dt.datetime
    later_run: str | None  # "<run id> <status>" of a run that started or failed on it since

# The newest audit of each partition of a target, and when an audit last found it holding.
_LATEST = sql.SQL(
    "SELECT DISTINCT ON (a.partition) a.partition, a.audited_at, a.result, a.signal, a.signal_value, "
    "a.verified_run_id, (SELECT max(h.audited_at) FROM {schema}.audits AS h WHERE h.target_table = a.target_table "
    "AND h.partition = a.partition AND h.result = 'holds') "
    "FROM {schema}.audits AS a WHERE a.target_table = %(target_table)s "
    "ORDER BY a.partition, a.audited_at DESC"
)

LATEST_FIELDS = ("partition", "audited_at", "result", "signal", "signal_value", "verified_run_id", "last_holding_at")


class LatestAudit(TypedDict):
    """A partition's newest audit (``LATEST_FIELDS``)."""

    partition: str
    audited_at: dt.datetime
    result: str
    signal: str
    signal_value: str | None
    verified_run_id: str | None
    last_holding_at: dt.datetime | None  # when an audit last found it holding


class AuditReading(TypedDict):
    """What an audit compares of a partition: the readings a verification recorded."""

    row_count: int
    total: str | None
    content_hash: str


class DriftCounts(TypedDict):
    """The keys a target gained (added), lost (removed), changed and kept since its verification."""

    added: int
    removed: int
    changed: int
    unchanged: int


class Drift(TypedDict):
    """What changed in a drifted partition: the keys (None: they cannot be named, ``why``
    says why), and the first of them."""

    keys: DriftCounts | None
    first: NotRequired[list[FirstKey]]
    why: NotRequired[str]


class AuditRecord(TypedDict):
    """One partition of an audit as recorded (the readings and changes as JSON values)."""

    partition: str
    result: str
    signal: str
    signal_value: str | None
    verified_run_id: str | None
    readings: AuditReading | None
    changes: Drift | None

_INSERT = sql.SQL(
    "INSERT INTO {schema}.audits (audit_id, spec_name, target_table, partition, audited_at, result, signal, "
    "signal_value, verified_run_id, readings, changes) SELECT %(audit_id)s, %(spec_name)s, %(target_table)s, "
    "r.partition, %(audited_at)s, r.result, r.signal, r.signal_value, r.verified_run_id, r.readings, r.changes "
    "FROM jsonb_to_recordset(%(rows)s) AS r(partition text, result text, signal text, signal_value text, "
    "verified_run_id text, readings jsonb, changes jsonb)"
)


def verified_partitions(conn: psycopg.Connection, schema: str, target_table: str) -> dict[str, VerifiedRow]:
    """partition -> its newest verified ledger row (``VERIFIED_FIELDS``; ``later_run``: "<run id>
    <status>" of a run that started or failed on it since, or None); empty before any run."""
    if not control_ready(conn, schema):
        return {}
    rows = conn.execute(_VERIFIED.format(schema=sql.Identifier(schema)), {"target_table": target_table}).fetchall()
    return {r[0]: cast(VerifiedRow, dict(zip(VERIFIED_FIELDS, r))) for r in rows}


def latest_audits(conn: psycopg.Connection, schema: str, target_table: str) -> dict[str, LatestAudit]:
    """partition -> its newest audit (``LATEST_FIELDS``; ``last_holding_at``: when an audit last
    found it holding, or None); empty before any audit."""
    if not control_ready(conn, schema):
        return {}
    rows = conn.execute(_LATEST.format(schema=sql.Identifier(schema)), {"target_table": target_table}).fetchall()
    return {r[0]: cast(LatestAudit, dict(zip(LATEST_FIELDS, r))) for r in rows}


def record_audit(conn: psycopg.Connection, schema: str, *, audit_id: str, spec_name: str, target_table: str,
                 audited_at: Any, rows: list[AuditRecord]) -> None:
    """One row per partition audited (``partition``, ``result``, ``signal``, ``signal_value``,
    ``verified_run_id``, ``readings``, ``changes``), in the caller's transaction."""
    conn.execute(_INSERT.format(schema=sql.Identifier(schema)), {
        "audit_id": audit_id, "spec_name": spec_name, "target_table": target_table, "audited_at": audited_at,
        "rows": Jsonb(rows)})
