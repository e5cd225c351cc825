"""Approval: bound to one exact, stored plan and to the target as it was when approved.

An approval is a row in the control schema naming the plan id (a hash of everything the
approver saw) and recording each partition's target readings at that moment: what the
approver agreed to replace. It is refused for an unknown or refused plan, a plan of another
spec, a spec or target that changed since the plan, a snapshot copy whose seal broke, an
immutable source or a stage that no longer carries the planned fingerprint.

A plan id is content-addressed, so the same plan made again months later is still approved.
The recorded target readings keep such an old approval from rolling back a newer backfill
(core.coverage says what an approval still covers, and when it expires).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg

from backfill_assets.core.build import open_build_engine
from backfill_assets.core.context import Clock, utc_now
from backfill_assets.core.differences import Change
from backfill_assets.core.errors import ApprovalError, BackfillError
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import ledger
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.store.plans import find_plan


class Shown(TypedDict):
    """What an approval records the approver was shown: the review's id, the counts of its
    changes per partition (None: they could not be read) and when it was made (None: at the
    approval)."""

    review_id: str
    changes: dict[str, dict[str, int]] | None
    previewed_at: str | None


@dataclass(frozen=True)
class Review:
    """Everything a person must see before approving a plan, after every check passed: the
    plan (with its problems), and each partition's target as it is now, which the approval
    will record it was given against. Front-ends render it and ask; :func:`confirm` records."""

    spec: Spec
    stored: Plan
    target: dict[str, Reading]
    # What replacing each partition changes in the target: keys added, removed, changed and
    # unchanged (core.diff), and with review(first=...) the first differing keys ("first");
    # None when that could not be read (a timeout): it only explains.
    changes: dict[str, Change] | None = None

    @property
    def plan_id(self) -> str:
        return self.stored.plan_id

    @property
    def review_id(self) -> str:
        """What the person is shown, by content: the plan and the target's readings of each of
        its partitions. Stage A is the plan's (review refuses otherwise), so the same id means
        the same change; a target that changed since gives another id."""
        return review_id(self.plan_id, self.target)

    def counts(self) -> dict[str, dict[str, int]] | None:
        """The changes' counts alone, per partition (what an approval records it was shown)."""
        if self.changes is None:
            return None
        return {label: {"added": c["added"], "removed": c["removed"], "changed": c["changed"],
                        "unchanged": c["unchanged"]} for label, c in self.changes.items()}


def review_id(plan_id: str, target: dict[str, Reading]) -> str:
    """SHA-256 of the plan id and each partition's target readings (canonical JSON)."""
    text = json.dumps({"plan_id": plan_id, "target": target}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def review(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, plan: str | Plan, *, first: int = 0,
    diff: bool = True,
) -> Review:
    """Every check an approval needs, once: the plan exists, belongs to the spec and was not
    refused; the spec and the target's columns are unchanged; the snapshot's seal holds (an
    immutable source still carries its fingerprint); stage A still carries the planned
    readings. Reads the target as it is now (on ``conn``, the data) and the plan from the
    control store.

    Args:
        plan: a plan id or unique prefix, or a plan already found.
        first: how many differing keys per partition to name in ``changes``.
        diff: False: do not compare stage A with the target (``changes`` is None), for a
            caller that holds what an earlier review of the same target showed.

    Raises:
        PlanReferenceError: a malformed plan id.
        ApprovalError, SpecError: see :func:`find_plan`, and the build engine's
            ``unchanged_spec`` and ``unchanged_data`` (core.build.BuildEngine).
    """
    if not isinstance(plan, Plan):  # refused before anything of the engine is opened
        with factory.control(conn) as control:
            plan = find_plan(control, spec, plan)
    stored = plan
    with open_build_engine(conn, factory, spec) as engine:
        ctx = engine.unchanged_spec(stored)
        target = engine.unchanged_data(ctx, stored)
        changes = None
        try:
            if diff:
                changes = engine.changes(ctx, stored, first)
        except (psycopg.Error, BackfillError):  # only an explanation failed: approval does not depend on it
            changes = None
    return Review(spec, stored, target, changes)


def confirm(control: psycopg.Connection, checked: Review, approved_by: str, *, clock: Clock = utc_now,
            previewed_at: Any = None) -> int:
    """Record the approval of a reviewed plan in the control store (``control``), against the
    target the review read, with the review the person was shown (its id and counts;
    ``previewed_at``: when it was made, if before this moment). Returns the approval id.
    apply checks the stage and the target again before it writes."""
    shown = Shown(review_id=checked.review_id, changes=checked.counts(),
                  previewed_at=None if previewed_at is None else str(previewed_at))
    return record_approval(control, checked.spec, checked.stored, approved_by, target=checked.target, clock=clock,
                           review=shown)


def approve_plan(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, stored: Plan,
    approved_by: str, *, clock: Clock = utc_now,
) -> int:
    """Review and confirm at once, for scripts that have shown the plan already (the demo,
    the benchmark, tests). Returns the approval id.

    Raises:
        ApprovalError, SpecError: see :func:`review`.
    """
    _approver(approved_by)
    checked = review(conn, factory, spec, stored)
    with factory.control(conn) as control:
        return confirm(control, checked, approved_by, clock=clock)


def record_approval(
    control: psycopg.Connection, spec: Spec, stored: Plan, approved_by: str, *,
    target: dict[str, Reading], clock: Clock = utc_now, review: Shown | None = None,
) -> int:
    """Record, in the control store, an approval of a plan that the caller has just checked
    and shown (see :func:`review` and :func:`confirm`, which call this). Returns its id.

    Args:
        target: what the build engine's ``unchanged_data`` returned: every plan partition's target
            readings, the state the approval is given against.
        review: what the approver was shown (see :func:`confirm`); None: nothing recorded.

    apply checks the stage again before it writes, and the target against ``target``, so
    nothing approved here is trusted blindly.
    """
    missing = [label for label in stored.labels if label not in target]
    if missing:
        raise ApprovalError(
            f"the target was not read in partition(s) {', '.join(missing)} of plan "
            f"{stored.plan_id[:16]}; check it with check_data_unchanged before approving"
        )
    with control.transaction():
        return ledger.record_approval(
            control, spec.control_schema, plan_id=stored.plan_id, spec_name=spec.name,
            target_table=stored.document.target, partitions=stored.labels,
            approved_by=_approver(approved_by), approved_at=clock(),
            target_readings={label: target[label] for label in stored.labels}, review=review,
        )


def _approver(name: str) -> str:
    if not name.strip():
        raise ApprovalError("an approval needs the approver's name (--by)")
    return name.strip()
