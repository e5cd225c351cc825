"""The approvals and the ledger: who approved which plan against which target, and every
partition of every apply run with its status. Kept in the control schema (core.store.control
creates it), read by apply, status and the approval sensor.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, TypedDict, cast

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.store.control import control_ready

_INSERT_APPROVAL = sql.SQL(
    "INSERT INTO {schema}.approvals (plan_id, spec_name, target_table, partitions, approved_by, "
    "approved_at, target_readings, review) VALUES (%(plan_id)s, %(spec_name)s, %(target_table)s, "
    "%(partitions)s, %(approved_by)s, %(approved_at)s, %(target_readings)s, %(review)s) RETURNING approval_id"
)


_LATEST_APPROVAL = sql.SQL(
    "SELECT approval_id, plan_id, approved_by, approved_at, partitions, target_readings "
    "FROM {schema}.approvals WHERE plan_id = %(plan_id)s ORDER BY approval_id DESC LIMIT 1"
)


# The newest approval of each plan of a spec that its own runs have not yet verified in
# every partition (an older approval of the same plan is never applied: apply takes the newest),
# with the partitions its runs did verify.
_OPEN_APPROVALS = sql.SQL(
    "SELECT a.approval_id, a.plan_id, a.approved_by, a.approved_at, a.partitions, a.target_readings, "
    "ARRAY(SELECT DISTINCT l.partition FROM {schema}.ledger AS l WHERE l.approval_id = a.approval_id "
    "AND l.status IN ('verified', 'skipped-already-verified') ORDER BY l.partition) "
    "FROM (SELECT DISTINCT ON (plan_id) approval_id, plan_id, approved_by, approved_at, partitions, "
    "target_readings FROM {schema}.approvals WHERE spec_name = %(spec_name)s "
    "ORDER BY plan_id, approval_id DESC) AS a "
    "WHERE EXISTS (SELECT 1 FROM jsonb_array_elements_text(a.partitions) AS p(partition) "
    "WHERE NOT EXISTS (SELECT 1 FROM {schema}.ledger AS l WHERE l.approval_id = a.approval_id "
    "AND l.partition = p.partition AND l.status IN ('verified', 'skipped-already-verified'))) "
    "ORDER BY a.approval_id"
)


APPROVAL_FIELDS = ("approval_id", "plan_id", "approved_by", "approved_at", "partitions", "target_readings")
# An open approval also says which of its partitions its own runs verified.
OPEN_APPROVAL_FIELDS = (*APPROVAL_FIELDS, "verified")


class ApprovalRow(TypedDict):
    """An approval as recorded (``APPROVAL_FIELDS``); ``target_readings``: each partition's
    target readings it was given against (None: recorded by an older version)."""

    approval_id: int
    plan_id: str
    approved_by: str
    approved_at: dt.datetime
    partitions: list[str]
    target_readings: dict[str, Reading] | None


class OpenApprovalRow(ApprovalRow):
    """An open approval (``OPEN_APPROVAL_FIELDS``), with the partitions its runs verified."""

    verified: list[str]


def record_approval(conn: psycopg.Connection, schema: str, **fields: Any) -> int:
    """Record an approval with the target readings it was given against and the review the
    approver was shown; returns its id."""
    fields = {**fields, "partitions": Jsonb(fields["partitions"]),
              "target_readings": Jsonb(fields["target_readings"]), "review": Jsonb(fields["review"])}
    row = conn.execute(_INSERT_APPROVAL.format(schema=sql.Identifier(schema)), fields).fetchone()
    assert row is not None
    return int(row[0])


def latest_approval(conn: psycopg.Connection, schema: str, plan_id: str) -> ApprovalRow | None:
    """The newest approval of a plan (``APPROVAL_FIELDS``), or None."""
    row = conn.execute(
        _LATEST_APPROVAL.format(schema=sql.Identifier(schema)), {"plan_id": plan_id}
    ).fetchone()
    return None if row is None else cast(ApprovalRow, dict(zip(APPROVAL_FIELDS, row)))


def open_approvals(conn: psycopg.Connection, schema: str, spec_name: str) -> list[OpenApprovalRow]:
    """The newest approval of each plan of a spec not yet verified by its own runs in every
    partition (``OPEN_APPROVAL_FIELDS``: ``verified`` lists the partitions they did verify),
    oldest first."""
    rows = conn.execute(
        _OPEN_APPROVALS.format(schema=sql.Identifier(schema)), {"spec_name": spec_name}
    ).fetchall()
    return [cast(OpenApprovalRow, dict(zip(OPEN_APPROVAL_FIELDS, r))) for r in rows]


_VERIFIED_BY_APPROVAL = sql.SQL(
    "SELECT DISTINCT partition FROM {schema}.ledger WHERE approval_id = %(approval_id)s "
    "AND status IN ('verified', 'skipped-already-verified') ORDER BY partition"
)


def verified_by_approval(conn: psycopg.Connection, schema: str, approval_id: int) -> list[str]:
    """The partitions that runs of one approval verified (or found already verified), in
    order."""
    rows = conn.execute(
        _VERIFIED_BY_APPROVAL.format(schema=sql.Identifier(schema)), {"approval_id": approval_id}
    ).fetchall()
    return [r[0] for r in rows]


_LEDGER_START = sql.SQL(
    "INSERT INTO {schema}.ledger (run_id, plan_id, approval_id, snapshot_id, target_table, "
    "partition, transform_version, row_count, total, content_hash, status, run_started_at, "
    "window_start, window_end) "
    "SELECT %(run_id)s, %(plan_id)s, %(approval_id)s, %(snapshot_id)s, %(target_table)s, "
    "p.partition, %(transform_version)s, p.row_count, p.total, p.content_hash, 'pending', "
    "%(run_started_at)s, p.start, p.\"end\" FROM jsonb_to_recordset(%(partitions)s) "
    "AS p(partition text, row_count bigint, total text, content_hash text, start timestamptz, \"end\" timestamptz)"
)


_LEDGER_MARK = sql.SQL(
    "UPDATE {schema}.ledger SET status = %(status)s, "
    "started_at = coalesce(started_at, %(at)s), "
    "finished_at = CASE WHEN %(status)s = 'started' THEN NULL ELSE %(at)s END, "
    "error = %(error)s, target_version = coalesce(%(target_version)s, target_version) "
    "WHERE run_id = %(run_id)s AND partition = ANY(%(partitions)s)"
)


_LEDGER_LATEST = sql.SQL(
    "SELECT DISTINCT ON (l.partition) l.partition, l.status, l.run_id, l.plan_id, l.row_count, "
    "l.total, l.content_hash, l.run_started_at, l.finished_at, l.error, l.target_version, "
    "(SELECT v.content_hash FROM {schema}.ledger AS v WHERE v.target_table = l.target_table "
    "AND v.partition = l.partition AND v.status IN ('verified', 'skipped-already-verified') "
    "ORDER BY v.run_started_at DESC LIMIT 1) "
    "FROM {schema}.ledger AS l WHERE l.target_table = %(target_table)s "
    "ORDER BY l.partition, l.run_started_at DESC"
)


_LEDGER_RUN = sql.SQL(
    "SELECT partition, status, row_count, total, content_hash, error FROM {schema}.ledger "
    "WHERE run_id = %(run_id)s ORDER BY partition"
)


LEDGER_FIELDS = (
    "partition", "status", "run_id", "plan_id", "row_count", "total", "content_hash",
    "run_started_at", "finished_at", "error", "target_version", "last_verified_hash",
)


# Every run that reached a partition (a 'pending' or 'not-attempted' row never touched it).
_PARTITION_HISTORY = sql.SQL(
    "SELECT partition, run_id, plan_id, approval_id, status, content_hash, finished_at "
    "FROM {schema}.ledger WHERE target_table = %(target_table)s AND partition = ANY(%(partitions)s) "
    "AND status IN ('started', 'verified', 'skipped-already-verified', 'failed') "
    "ORDER BY finished_at DESC NULLS LAST, run_started_at DESC"
)


HISTORY_FIELDS = ("partition", "run_id", "plan_id", "approval_id", "status", "content_hash", "finished_at")


class LedgerRow(TypedDict):
    """The latest ledger row of a partition (``LEDGER_FIELDS``), with the content hash its
    last verified run recorded (``last_verified_hash``, None: never verified)."""

    partition: str
    status: str
    run_id: str
    plan_id: str
    row_count: int | None
    total: str | None
    content_hash: str | None
    run_started_at: dt.datetime
    finished_at: dt.datetime | None
    error: str | None
    target_version: str | None
    last_verified_hash: str | None


class HistoryRow(TypedDict):
    """A ledger row of a run that reached a partition (``HISTORY_FIELDS``)."""

    partition: str
    run_id: str
    plan_id: str
    approval_id: int
    status: str
    content_hash: str | None
    finished_at: dt.datetime | None


def ledger_start(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """One 'pending' row per partition of a run, with the approved readings (and a time
    window's ``start`` and ``end``, ISO 8601 instants)."""
    fields = {**fields, "partitions": Jsonb(fields["partitions"])}
    conn.execute(_LEDGER_START.format(schema=sql.Identifier(schema)), fields)


def ledger_mark(conn: psycopg.Connection, schema: str, run_id: str, partitions: list[str],
                status: str, at: Any, error: str | None = None, target_version: str | None = None) -> None:
    """Move partitions of a run to ``status``; ``target_version``: the lake version committed."""
    conn.execute(
        _LEDGER_MARK.format(schema=sql.Identifier(schema)),
        {"run_id": run_id, "partitions": partitions, "status": status, "at": at, "error": error,
         "target_version": target_version},
    )


def ledger_latest(conn: psycopg.Connection, schema: str, target_table: str) -> list[LedgerRow]:
    """The latest ledger row per partition of a target, with its last verified hash."""
    rows = conn.execute(
        _LEDGER_LATEST.format(schema=sql.Identifier(schema)), {"target_table": target_table}
    ).fetchall()
    return [cast(LedgerRow, dict(zip(LEDGER_FIELDS, r))) for r in rows]


def partition_history(
    conn: psycopg.Connection, schema: str, target_table: str, partitions: list[str]
) -> list[HistoryRow]:
    """Every ledger row of a run that reached one of ``partitions`` of a target
    (``HISTORY_FIELDS``), newest first."""
    rows = conn.execute(
        _PARTITION_HISTORY.format(schema=sql.Identifier(schema)),
        {"target_table": target_table, "partitions": partitions},
    ).fetchall()
    return [cast(HistoryRow, dict(zip(HISTORY_FIELDS, r))) for r in rows]


def ledger_run(conn: psycopg.Connection, schema: str, run_id: str) -> list[tuple]:
    """(partition, status, row_count, total, content_hash, error) of every row of a run."""
    return conn.execute(_LEDGER_RUN.format(schema=sql.Identifier(schema)), {"run_id": run_id}).fetchall()


def ledger_status(conn: psycopg.Connection, spec: Any) -> list[LedgerRow]:
    """The latest ledger row per partition of the spec's target (empty before any run),
    integer partitions in numeric order."""
    if not control_ready(conn, spec.control_schema):
        return []
    rows = ledger_latest(conn, spec.control_schema, spec.target_name)
    return sorted(rows, key=lambda r: partition_order(r["partition"]))


def partition_order(label: str) -> tuple:
    """A partition label's place: integer partitions in numeric order, then the others as text."""
    return (0, int(label), "") if label.lstrip("-").isdigit() else (1, 0, label)


_APPROVED_PLAN_WITH = sql.SQL(
    "SELECT a.plan_id FROM {schema}.approvals AS a JOIN {schema}.plans AS p "
    "ON p.plan_id = a.plan_id WHERE a.spec_name = %(spec_name)s AND p.status = 'ready' "
    "AND EXISTS (SELECT 1 FROM jsonb_array_elements(p.plan -> 'partitions') AS e "
    "WHERE e ->> 'partition' = %(partition)s) ORDER BY a.approval_id DESC LIMIT 1"
)




def newest_approved_plan_with(conn: psycopg.Connection, schema: str, spec_name: str, partition: str) -> str | None:
    """The plan id of the newest approval of a ready plan that includes ``partition``."""
    row = conn.execute(
        _APPROVED_PLAN_WITH.format(schema=sql.Identifier(schema)),
        {"spec_name": spec_name, "partition": partition},
    ).fetchone()
    return None if row is None else row[0]


# Each approval of a spec newer than a cursor (and, given a time, approved after it), at most
# a given number, when it was given, whether its own runs verified every one of its partitions
# (applied), and whether a newer approval of the same plan exists (superseded: apply takes the
# newest approval of a plan, so an older one is never applied as itself). Only the rows
# returned are judged: the rows passed over, and those after the limit, are not.
_APPROVALS_SINCE = sql.SQL(
    "SELECT a.approval_id, a.plan_id, a.partitions, a.approved_at, "
    "NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(a.partitions) AS p(partition) "
    "WHERE NOT EXISTS (SELECT 1 FROM {schema}.ledger AS l WHERE l.approval_id = a.approval_id "
    "AND l.partition = p.partition AND l.status IN ('verified', 'skipped-already-verified'))), "
    "EXISTS (SELECT 1 FROM {schema}.approvals AS n WHERE n.plan_id = a.plan_id "
    "AND n.approval_id > a.approval_id) "
    "FROM {schema}.approvals AS a WHERE a.spec_name = %(spec_name)s AND a.approval_id > %(after)s "
    "AND (%(approved_after)s::timestamptz IS NULL OR a.approved_at > %(approved_after)s::timestamptz) "
    "ORDER BY a.approval_id LIMIT %(limit)s"
)


APPROVAL_STATE_FIELDS = ("approval_id", "plan_id", "partitions", "approved_at", "applied", "superseded")


class ApprovalState(TypedDict):
    """An approval and what became of it (``APPROVAL_STATE_FIELDS``, see :func:`approvals_since`)."""

    approval_id: int
    plan_id: str
    partitions: list[str]
    approved_at: dt.datetime
    applied: bool
    superseded: bool


def approvals_since(
    conn: psycopg.Connection, schema: str, spec_name: str, after: int, *, limit: int,
    approved_after: dt.datetime | None = None,
) -> list[ApprovalState]:
    """The first ``limit`` approvals of a spec newer than ``after`` (``APPROVAL_STATE_FIELDS``),
    oldest first: ``applied`` when runs of that approval verified every one of its partitions
    (status verified or skipped-already-verified), ``superseded`` when the same plan has a
    newer approval. ``approved_after``: only approvals given after that time (the others are
    not read). One query; nothing is fingerprinted."""
    rows = conn.execute(
        _APPROVALS_SINCE.format(schema=sql.Identifier(schema)),
        {"spec_name": spec_name, "after": after, "limit": limit, "approved_after": approved_after},
    ).fetchall()
    return [ApprovalState(approval_id=int(r[0]), plan_id=r[1], partitions=list(r[2]), approved_at=r[3], applied=r[4],
                          superseded=r[5]) for r in rows]


# The partitions a run of the newest approval of a plan (the one apply applies) failed, each
# with its newest failure, where no run of that approval verified the partition after it.
_UNVERIFIED_FAILURES = sql.SQL(
    "SELECT DISTINCT ON (f.partition) f.partition, f.run_id, f.error, f.approval_id "
    "FROM {schema}.ledger AS f WHERE f.status = 'failed' AND f.approval_id = "
    "(SELECT max(a.approval_id) FROM {schema}.approvals AS a WHERE a.plan_id = %(plan_id)s) "
    "AND NOT EXISTS (SELECT 1 FROM {schema}.ledger AS v WHERE v.approval_id = f.approval_id "
    "AND v.partition = f.partition AND v.status IN ('verified', 'skipped-already-verified') "
    "AND v.finished_at >= f.finished_at) "
    "ORDER BY f.partition, f.finished_at DESC"
)


FAILURE_FIELDS = ("partition", "run_id", "error", "approval_id")


class Failure(TypedDict):
    """A partition's newest failure not verified since (``FAILURE_FIELDS``)."""

    partition: str
    run_id: str
    error: str | None
    approval_id: int


def unverified_failures(conn: psycopg.Connection, schema: str, plan_id: str) -> list[Failure]:
    """The partitions that runs of the newest approval of ``plan_id`` failed and no run of that
    approval has verified since (``FAILURE_FIELDS``, the newest failure of each), in partition
    order; empty before any run. Apply stops after its first failure: across the runs of a
    multi-run backfill, a run that finds one here must not replace other partitions."""
    if not control_ready(conn, schema):
        return []
    rows = conn.execute(
        _UNVERIFIED_FAILURES.format(schema=sql.Identifier(schema)), {"plan_id": plan_id}
    ).fetchall()
    return [Failure(partition=r[0], run_id=r[1], error=r[2], approval_id=int(r[3])) for r in rows]
