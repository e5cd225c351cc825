"""Change previews as the control store keeps them (core.preview): the newest preview of each
ready plan, and the plans waiting for an approval."""

from __future__ import annotations

import datetime as dt
from typing import Any, TypedDict, cast

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from backfill_assets.core.differences import Change
from backfill_assets.core.fingerprint.rows import Reading

_UPSERT = sql.SQL(
    "INSERT INTO {schema}.previews (plan_id, spec_name, review_id, target_readings, changes, made_at) "
    "VALUES (%(plan_id)s, %(spec_name)s, %(review_id)s, %(target_readings)s, %(changes)s, %(made_at)s) "
    "ON CONFLICT (plan_id) DO UPDATE SET review_id = EXCLUDED.review_id, "
    "target_readings = EXCLUDED.target_readings, changes = EXCLUDED.changes, made_at = EXCLUDED.made_at"
)
_FIELDS = ("plan_id", "spec_name", "review_id", "target_readings", "changes", "made_at")
_SELECT = "SELECT plan_id, spec_name, review_id, target_readings, changes, made_at FROM {schema}.previews "


class PreviewRow(TypedDict):
    """A plan's newest preview (``_FIELDS``): the target's readings it was made against and the
    changes it showed (None: they could not be read)."""

    plan_id: str
    spec_name: str
    review_id: str
    target_readings: dict[str, Reading]
    changes: dict[str, Change] | None
    made_at: dt.datetime


def record(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record a plan's newest preview (``_FIELDS``), replacing the one before."""
    fields = {**fields, "target_readings": Jsonb(fields["target_readings"]), "changes": Jsonb(fields["changes"])}
    conn.execute(_UPSERT.format(schema=sql.Identifier(schema)), fields)


def of_plan(conn: psycopg.Connection, schema: str, plan_id: str) -> PreviewRow | None:
    row = conn.execute(sql.SQL(_SELECT + "WHERE plan_id = %(id)s").format(schema=sql.Identifier(schema)),
                       {"id": plan_id}).fetchone()
    return None if row is None else cast(PreviewRow, dict(zip(_FIELDS, row)))


def by_review(conn: psycopg.Connection, schema: str, review_id: str) -> PreviewRow | None:
    """The preview with this review id, if it is still a plan's newest."""
    row = conn.execute(sql.SQL(_SELECT + "WHERE review_id = %(id)s").format(schema=sql.Identifier(schema)),
                       {"id": review_id}).fetchone()
    return None if row is None else cast(PreviewRow, dict(zip(_FIELDS, row)))


# Ready plans of a spec made (or previewed) after a time that were never approved and that no
# newer plan of the spec has replaced in any of their partitions, newest first, with their
# newest preview. A plan made again keeps its id and first created_at: its newest preview says
# when it was last made. Only plans of the window are read (their documents for the partitions).
_WAITING = sql.SQL(
    "WITH made AS (SELECT p.plan_id, p.status, p.created_at, greatest(p.created_at, v.made_at) AS seen, "
    "ARRAY(SELECT e ->> 'partition' FROM jsonb_array_elements(p.plan -> 'partitions') AS e) AS labels "
    "FROM {schema}.plans AS p LEFT JOIN {schema}.previews AS v ON v.plan_id = p.plan_id "
    "WHERE p.spec_name = %(spec_name)s AND greatest(p.created_at, v.made_at) > %(since)s), "
    "newest AS (SELECT DISTINCT ON (label) label, plan_id FROM made, unnest(labels) AS label "
    "ORDER BY label, seen DESC, plan_id) "
    "SELECT m.plan_id, m.labels, m.created_at, v.review_id, v.target_readings, v.changes, v.made_at, "
    "ARRAY(SELECT DISTINCT l.partition FROM {schema}.ledger AS l WHERE l.target_table = %(target)s "
    "AND l.partition = ANY(m.labels) AND l.status = 'verified' AND l.finished_at > v.made_at ORDER BY 1) "
    "FROM made AS m LEFT JOIN {schema}.previews AS v ON v.plan_id = m.plan_id "
    "WHERE m.status = 'ready' AND NOT EXISTS (SELECT 1 FROM {schema}.approvals AS a WHERE a.plan_id = m.plan_id) "
    "AND NOT EXISTS (SELECT 1 FROM newest AS n WHERE n.label = ANY(m.labels) AND n.plan_id <> m.plan_id) "
    "ORDER BY m.seen DESC LIMIT %(limit)s"
)
# ``replaced``: the plan's partitions of the target that a run replaced (and verified) after its
# preview was made (none without a preview).
WAITING_FIELDS = ("plan_id", "partitions", "created_at", "review_id", "target_readings", "changes", "previewed_at",
                  "replaced")


class WaitingRow(TypedDict):
    """A plan waiting for an approval (``WAITING_FIELDS``), with its newest preview's fields
    (None without one)."""

    plan_id: str
    partitions: list[str]
    created_at: dt.datetime
    review_id: str | None
    target_readings: dict[str, Reading] | None
    changes: dict[str, Change] | None
    previewed_at: dt.datetime | None
    replaced: list[str]


def waiting_plans(conn: psycopg.Connection, schema: str, spec_name: str, target_table: str, since: dt.datetime,
                  limit: int) -> list[WaitingRow]:
    """Up to ``limit`` ready plans made or previewed after ``since`` and waiting for an
    approval (``WAITING_FIELDS``), newest first."""
    rows = conn.execute(_WAITING.format(schema=sql.Identifier(schema)),
                        {"spec_name": spec_name, "target": target_table, "since": since, "limit": limit}).fetchall()
    return [cast(WaitingRow, dict(zip(WAITING_FIELDS, r))) for r in rows]
