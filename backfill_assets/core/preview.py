"""The change preview: what approving a ready plan would do to the target, shown before
anyone approves, and the approval of exactly what was shown.

A preview is a review (core.approve.review: every check an approval needs) with the first
differing keys of each partition, recorded in the control store under its review id: a hash of
the plan id and the target's readings of every partition of the plan at that moment. Each
plan keeps its newest preview. Approving a preview (:func:`approve_previewed`) reviews the
plan again and refuses, saying to look again, when that preview is no longer the plan's newest,
when stage A or the spec changed (review refuses), or when the target is no longer what the
preview was made against; otherwise it records the approval with the review shown.

Nothing here writes the target or the stages.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass

import psycopg

from backfill_assets.core.approve import Review, confirm, review
from backfill_assets.core.context import Clock, utc_now
from backfill_assets.core.coverage import is_expired, short_list, utc_text
from backfill_assets.core.differences import Change
from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store import ledger, previews
from backfill_assets.core.store.plan_document import Plan

# How many differing keys per partition a preview names.
FIRST_KEYS = 5
# The most waiting plans of one spec :func:`waiting` lists.
WAITING_LIMIT = 20


@dataclass(frozen=True)
class Preview:
    """A review as shown on the dashboard: when it was made, and which partitions' target
    changed since the plan's previous preview (empty for a first preview)."""

    checked: Review
    made_at: dt.datetime
    changed_since: list[str] = dataclasses.field(default_factory=list)
    previous_at: dt.datetime | None = None

    @property
    def review_id(self) -> str:
        return self.checked.review_id


def make_preview(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, plan: str | Plan, *,
                 clock: Clock = utc_now, first: int = FIRST_KEYS) -> Preview:
    """Review a ready plan against the target as it is now, with its first ``first`` differing
    keys per partition, and record it as the plan's newest preview.

    Raises:
        ApprovalError, SpecError: the plan cannot be approved (see core.approve.review).
    """
    made_at = clock()  # before the target is read: a run that replaces a partition meanwhile marks it stale
    checked = review(conn, factory, spec, plan, first=first)
    with factory.control(conn) as control, control.transaction():
        before = previews.of_plan(control, spec.control_schema, checked.plan_id)
        previews.record(control, spec.control_schema, plan_id=checked.plan_id, spec_name=spec.name,
                        review_id=checked.review_id, target_readings=checked.target, changes=checked.changes,
                        made_at=made_at)
    if before is None:
        return Preview(checked, made_at)
    changed = [label for label in checked.stored.labels if before["target_readings"].get(label) != checked.target[label]]
    return Preview(checked, made_at, changed, before["made_at"])


@dataclass(frozen=True)
class Approved:
    approval_id: int
    checked: Review
    previewed_at: dt.datetime


def approve_previewed(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, review_id: str,
                      approved_by: str, *, plan_id: str | None = None, clock: Clock = utc_now) -> Approved:
    """Approve the plan of the preview ``review_id``, exactly as it was shown.

    Raises:
        ApprovalError: the preview is unknown or was replaced by a newer one, belongs to
            another plan than ``plan_id``, or the target changed since it was made (naming
            the partitions); or review refuses the plan. Nothing is recorded then.
    """
    if not approved_by.strip():
        raise ApprovalError("an approval needs the approver's name (approved_by)")
    wanted = review_id.strip().lower()
    with factory.control(conn) as control:
        shown = previews.by_review(control, spec.control_schema, wanted) if store.control_ready(
            control, spec.control_schema) else None
    if shown is None:
        raise ApprovalError(
            f"there is no current change preview {wanted[:16]} of spec {spec.name}: a newer preview of its plan "
            "replaced it, or it never existed; nothing was approved. Look again at the newest "
            "target_change_preview of the partitions and approve from its link"
        )
    if plan_id and shown["plan_id"] != plan_id.strip().lower():
        raise ApprovalError(
            f"change preview {wanted[:16]} is of plan {shown['plan_id'][:16]}, not of plan {plan_id.strip()[:16]}; "
            "nothing was approved. Approve from the preview's own link"
        )
    checked = review(conn, factory, spec, shown["plan_id"], diff=False)  # the preview's counts hold if the target does
    changed = [label for label in checked.stored.labels if shown["target_readings"].get(label) != checked.target[label]]
    if changed:
        raise ApprovalError(
            f"the target changed in partition(s) {short_list(changed)} since the change preview you were shown "
            f"(made at {utc_text(shown['made_at'])}); nothing was approved. Look again: evaluate the "
            "target_change_preview check of those partitions again and approve from the new preview"
        )
    # The same target and stage give the same changes: record the counts that were shown.
    checked = dataclasses.replace(checked, changes=shown["changes"])
    with factory.control(conn) as control:
        approval_id = confirm(control, checked, approved_by, clock=clock, previewed_at=shown["made_at"])
    return Approved(approval_id, checked, shown["made_at"])


@dataclass(frozen=True)
class WaitingPlan:
    """A ready plan nobody approved yet, with its newest preview (if any)."""

    plan_id: str
    partitions: list[str]
    created_at: dt.datetime
    review_id: str | None
    changes: dict[str, Change] | None
    previewed_at: dt.datetime | None
    # Partitions a run replaced after the preview was made: the preview is stale there.
    stale: list[str]


@dataclass(frozen=True)
class WaitingApproval:
    """An approval whose runs have not yet verified every one of its partitions."""

    approval_id: int
    plan_id: str
    approved_by: str
    approved_at: dt.datetime
    partitions: list[str]
    verified: list[str]
    expired: bool


@dataclass(frozen=True)
class Waiting:
    plans: list[WaitingPlan]
    approvals: list[WaitingApproval]


def waiting(control: psycopg.Connection, spec: Spec, *, now: dt.datetime | None = None,
            limit: int = WAITING_LIMIT) -> Waiting:
    """What waits for a person or a run: ready plans not approved, made or previewed within the
    spec's ``approval_expires_after`` (newest first, at most ``limit``; an older one can still
    be approved, but nobody is waiting on it), and approvals not yet applied (oldest first).
    Reads only the control store (``control``); a preview is stale in the partitions a verified
    run replaced since."""
    if not store.control_ready(control, spec.control_schema):
        return Waiting([], [])
    now = now or utc_now()
    schema = spec.control_schema
    plans = [
        WaitingPlan(row["plan_id"], list(row["partitions"]), row["created_at"], row["review_id"], row["changes"],
                    row["previewed_at"], list(row["replaced"]))
        for row in previews.waiting_plans(control, schema, spec.name, spec.target_name,
                                          now - spec.approval_expires_after, limit)
    ]
    approvals = [
        WaitingApproval(int(r["approval_id"]), r["plan_id"], r["approved_by"], r["approved_at"], list(r["partitions"]),
                        list(r["verified"]), is_expired(spec, r["approved_at"], now))
        for r in ledger.open_approvals(control, schema, spec.name)
    ]
    return Waiting(plans, approvals)
