"""Approval: bound to one exact, stored plan and to the target as it was when approved.

An approval is a row in the control schema naming the plan id (a hash of everything the
approver saw) and recording each partition's target readings at that moment: what the
approver agreed to replace. It is refused for an unknown or refused plan, a plan of another
spec, a spec or target that changed since the plan, a snapshot copy whose seal broke, an
immutable source or a stage that no longer carries the planned fingerprint.

A plan id is content-addressed, so the same plan made again months later is still approved.
The recorded target readings keep such an old approval from rolling back a newer backfill:
an approval covers a partition only while its target is what the approval was given against
(and no later approval's run has replaced it since), or carries the approved readings after
this approval's own runs reached it (a crashed run resumes; a rerun skips). See
:func:`judge`.

An approval does not live forever: once it is older than the spec's
``approval_expires_after`` it is expired (:func:`is_expired`), and no run may start from it,
not even one resuming a run of it that stopped part way (:func:`refuse_if_expired`). Approving
the plan again is a new review of the target as it is then; partitions the old approval's runs
already replaced are skipped by the new one's.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from pydantic import ValidationError

from backfill_assets.core import control, ledger
from backfill_assets.core.db import ConnectionFactory, repeatable_read
from backfill_assets.core.errors import ApprovalError, ApprovalOutdatedError, BackfillError, PlanReferenceError, SpecError
from backfill_assets.core.context import Clock, Context, resolve, utc_now
from backfill_assets.core.plan import spec_document
from backfill_assets.core.plan_document import Plan
from backfill_assets.core.snapshot import copy_problem, immutable_source_changes
from backfill_assets.core.stages import stage_partitions_changed
from backfill_assets.core.target import target_for
from backfill_assets.core.spec import Spec, parse_table_name

MIN_PREFIX = 8


def find_plan(conn: psycopg.Connection, spec: Spec, plan_ref: str) -> Plan:
    """The stored plan with this id, or the only one starting with this prefix.

    Raises:
        PlanReferenceError: ``plan_ref`` is not 8 to 64 hex digits (a bad argument).
        ApprovalError: no such plan, an ambiguous prefix, or a plan of another spec.
    """
    ref = plan_ref.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{%d,64}" % MIN_PREFIX, ref):
        raise PlanReferenceError(plan_ref, MIN_PREFIX)
    if not control.control_ready(conn, spec.control_schema):
        raise ApprovalError(f"no plans exist in schema {spec.control_schema}; run plan first")
    found = control.plans_by_prefix(conn, spec.control_schema, ref)
    if not found:
        raise ApprovalError(f"there is no plan {ref}; run plan and use the plan_id it prints")
    if len(found) > 1:
        raise ApprovalError(f"plan prefix {ref} is ambiguous; give more of the plan id")
    plan_id, _, stored = found[0]
    try:
        plan = Plan.from_json(stored)
    except ValidationError as err:
        raise ApprovalError(
            f"plan {plan_id[:16]} was stored in a form this version cannot read "
            f"({err.error_count()} problem(s)); plan again", plan_id=plan_id,
        ) from None
    except ValueError as err:  # edited since it was stored
        raise ApprovalError(f"{err}; it was changed after it was made: plan again", plan_id=plan_id) from None
    if plan.document.spec != spec.name:
        raise ApprovalError(f"plan {plan_id[:16]} belongs to spec {plan.document.spec}, not {spec.name}",
                            plan_id=plan_id)
    return plan


def check_spec_unchanged(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, stored: Plan
) -> Context:
    """Resolve the current spec against the catalog and require the plan's spec-derived
    fields to be unchanged (target, keys, ordering, column types, transform).

    Raises:
        ApprovalError: the plan was refused, or the spec or target changed since.
        SpecError: the spec no longer matches the catalog.
    """
    if stored.status != "ready":
        problems = "; ".join(stored.problems) or "its stages did not match"
        raise ApprovalError(
            f"plan {stored.plan_id[:16]} was refused ({problems}); it cannot be approved or applied"
        )
    ctx = resolve(conn, spec, stored.labels)
    now = spec_document(ctx)
    planned = stored.document.spec_fields()
    changed = [k for k, v in now.items() if planned.get(k) != v]
    if changed:
        raise ApprovalError(
            f"the spec or the target changed since plan {stored.plan_id[:16]} was made "
            f"({', '.join(changed)} differ); plan again"
        )
    return ctx


def check_data_unchanged(
    conn: psycopg.Connection, ctx: Context, stored: Plan, partitions: list[str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Require stage A, and an immutable source, to still carry the planned fingerprints, and
    read the target as it is now.

    A copied snapshot is not hashed again: its seal is checked (one pass, no sort; see
    snapshot.copy_problem). It reaches the target only through the stage, which is checked here
    by its seal too, or hashed where the seal does not hold (stages.stage_partitions_changed),
    checked the same way again under the lock before each replace, and what it gives the
    target fingerprinted in full before the commit.

    Args:
        partitions: the target partitions to read (default: every partition of the plan).

    Returns:
        Each of those partitions' target readings, read in the same transaction as the
        checks: what an approval records it was given against (see :func:`record_approval`).

    Raises:
        ApprovalError: naming the partitions that changed.
    """
    spec, snap = ctx.spec, stored.document.snapshot
    wanted = stored.labels if partitions is None else partitions
    immutable = snap.mode == "immutable"
    with repeatable_read(conn):
        found = control.find_snapshot(conn, spec.control_schema, snap.id)
        if found is None or found["fingerprint"] != snap.fingerprint:
            raise ApprovalError(f"snapshot {snap.id} of plan {stored.plan_id[:16]} is gone; plan again")
        copy = found["snapshot_table"]
        problem = None if copy is None else copy_problem(conn, ctx, parse_table_name(copy), snap.fingerprint)
        if problem is not None:
            raise ApprovalError(f"the copy {copy} of snapshot {snap.id} {problem}; plan again")
        source_changed = list(immutable_source_changes(conn, ctx, stored.pinned_source())) if immutable else []
        stage = ctx.stage("a")
        approved = {label: stored.approved(label) for label in ctx.labels}
        stage_changed = stage_partitions_changed(conn, ctx, "a", approved)
        target = target_readings(conn, ctx, wanted)
    if source_changed:
        raise ApprovalError(
            f"the source no longer has the planned fingerprint in partition(s) "
            f"{', '.join(source_changed)}; plan again"
        )
    if stage_changed:
        raise ApprovalError(
            f"stage {stage} no longer has the planned fingerprint in partition(s) "
            f"{', '.join(stage_changed)}; plan again"
        )
    return target


def target_readings(conn: psycopg.Connection, ctx: Context, labels: list[str]) -> dict[str, dict[str, Any]]:
    """The target's readings of partitions ``labels`` of the context, in the caller's
    transaction (the same readings a plan records for its stages)."""
    target = target_for(conn, None, ctx)
    try:
        return target.readings(labels)
    finally:
        target.close()  # a lake target's catalog connections


@dataclass(frozen=True)
class Review:
    """Everything a person must see before approving a plan, after every check passed: the
    plan (with its problems), and each partition's target as it is now, which the approval
    will record it was given against. Front-ends render it and ask; :func:`confirm` records."""

    spec: Spec
    stored: Plan
    target: dict[str, dict[str, Any]]
    # What replacing each partition changes in the target: keys added, removed, changed and
    # unchanged (core.diff); None when that could not be read (a timeout): it only explains.
    changes: dict[str, dict[str, int]] | None = None

    @property
    def plan_id(self) -> str:
        return self.stored.plan_id


def review(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, plan: str | Plan,
) -> Review:
    """Every check an approval needs, once: the plan exists, belongs to the spec and was not
    refused; the spec and the target's columns are unchanged; the snapshot's seal holds (an
    immutable source still carries its fingerprint); stage A still carries the planned
    readings. Reads the target as it is now.

    Args:
        plan: a plan id or unique prefix, or a plan already found.

    Raises:
        PlanReferenceError: a malformed plan id.
        ApprovalError, SpecError: see :func:`find_plan`, :func:`check_spec_unchanged`,
            :func:`check_data_unchanged`.
    """
    stored = plan if isinstance(plan, Plan) else find_plan(conn, spec, plan)
    ctx = check_spec_unchanged(conn, factory, spec, stored)
    target = check_data_unchanged(conn, ctx, stored)
    try:
        changes = changes_of(conn, ctx, stored)
    except (psycopg.Error, BackfillError):  # only an explanation failed: approval does not depend on it
        changes = None
    return Review(spec, stored, target, changes)


def changes_of(conn: psycopg.Connection, ctx: Context, stored: Plan) -> dict[str, dict[str, int]]:
    """Per partition, what replacing the target with stage A changes: the counts of keys added,
    removed, changed and unchanged (core.diff), read in one read-only snapshot."""
    from backfill_assets.core.diff import diff_against  # core.diff reads plans through this module

    # A lake partition is compared through a temporary table: not a read-only transaction.
    with repeatable_read(conn, read_only=not ctx.spec.target.is_lake):
        found = [diff_against(conn, ctx, label, "target", 0) for label in stored.labels]
    return {d.partition: {"added": d.added, "removed": d.removed, "changed": d.changed, "unchanged": d.unchanged}
            for d in found}


def confirm(conn: psycopg.Connection, checked: Review, approved_by: str, *, clock: Clock = utc_now) -> int:
    """Record the approval of a reviewed plan, against the target the review read. Returns
    the approval id. apply checks the stage and the target again before it writes."""
    return record_approval(conn, checked.spec, checked.stored, approved_by, target=checked.target, clock=clock)


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
    return confirm(conn, review(conn, factory, spec, stored), approved_by, clock=clock)


def record_approval(
    conn: psycopg.Connection, spec: Spec, stored: Plan, approved_by: str, *,
    target: dict[str, dict[str, Any]], clock: Clock = utc_now,
) -> int:
    """Record an approval of a plan that the caller has just checked and shown (see
    :func:`review` and :func:`confirm`, which call this). Returns its id.

    Args:
        target: what :func:`check_data_unchanged` returned: every plan partition's target
            readings, the state the approval is given against.

    apply checks the stage again before it writes, and the target against ``target``, so
    nothing approved here is trusted blindly.
    """
    missing = [label for label in stored.labels if label not in target]
    if missing:
        raise ApprovalError(
            f"the target was not read in partition(s) {', '.join(missing)} of plan "
            f"{stored.plan_id[:16]}; check it with check_data_unchanged before approving"
        )
    with conn.transaction():
        return ledger.record_approval(
            conn, spec.control_schema, plan_id=stored.plan_id, spec_name=spec.name,
            target_table=stored.document.target, partitions=stored.labels,
            approved_by=_approver(approved_by), approved_at=clock(),
            target_readings={label: target[label] for label in stored.labels},
        )


def _approver(name: str) -> str:
    if not name.strip():
        raise ApprovalError("an approval needs the approver's name (--by)")
    return name.strip()


# --- what an approval still covers ------------------------------------------------------


@dataclass(frozen=True)
class Approval:
    """A recorded approval. ``target`` is each partition's target readings when it was given
    (None: recorded by an older version that did not read them)."""

    approval_id: int
    plan_id: str
    approved_by: str
    approved_at: dt.datetime
    target: dict[str, dict[str, Any]] | None = field(repr=False)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Approval":
        return cls(int(row["approval_id"]), row["plan_id"], row["approved_by"], row["approved_at"],
                   row["target_readings"])

    def as_json(self) -> dict[str, Any]:
        return {"approval_id": self.approval_id, "plan_id": self.plan_id, "approved_by": self.approved_by,
                "approved_at": self.approved_at.isoformat()}

    def expires_at(self, spec: Spec) -> dt.datetime:
        return expiry(spec, self.approved_at)

    def expired(self, spec: Spec, now: dt.datetime) -> bool:
        return is_expired(spec, self.approved_at, now)


# --- expiry ------------------------------------------------------------------------------


def expiry(spec: Spec, approved_at: dt.datetime) -> dt.datetime:
    """When an approval given at ``approved_at`` expires: ``approval_expires_after`` later."""
    return approved_at + spec.approval_expires_after


def is_expired(spec: Spec, approved_at: dt.datetime, now: dt.datetime) -> bool:
    """Whether an approval given at ``approved_at`` has expired at ``now`` (at its expiry
    time exactly, it has). The spec's current ``approval_expires_after`` decides."""
    return expiry(spec, approved_at) <= now


def duration_text(value: dt.timedelta) -> str:
    """A duration as a spec writes it: ``7d``, ``36h``, ``90m`` (else seconds)."""
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def utc_text(when: dt.datetime) -> str:
    """A time stamp in UTC, to the second, for messages."""
    return when.astimezone(dt.timezone.utc).isoformat(timespec="seconds")


def short_list(labels: Sequence[str], most: int = 5) -> str:
    """The first ``most`` labels, and how many more."""
    shown = ", ".join(labels[:most])
    return shown if len(labels) <= most else f"{shown} and {len(labels) - most} more"


class ApprovalExpiredError(ApprovalError):
    """An approval older than the spec's ``approval_expires_after``: apply, and a Dagster
    target run, refuse it before writing anything, a run resuming a partly applied approval
    included. ``verified``: the partitions its own runs verified before (a run under a new
    approval of the plan skips those that still carry the approved rows)."""

    def __init__(
        self, approval_id: int, plan_id: str, approved_by: str, approved_at: dt.datetime,
        expired_at: dt.datetime, expires_after: dt.timedelta, verified: Sequence[str] = (),
    ) -> None:
        self.approval_id = approval_id
        self.approved_by = approved_by
        self.approved_at = approved_at
        self.expired_at = expired_at
        self.expires_after = expires_after
        self.verified = tuple(verified)
        done = ""
        if self.verified:
            done = (f" Its runs verified {len(self.verified)} of its partition(s) ({short_list(self.verified)}); "
                    "a run under a new approval skips those that still carry the approved rows.")
        super().__init__(
            f"approval {approval_id} of plan {plan_id[:16]} (by {approved_by} at {utc_text(approved_at)}) "
            f"expired at {utc_text(expired_at)} (approval_expires_after: {duration_text(expires_after)}). "
            f"Nothing was written.{done} Review the plan and approve the plan again to apply it.",
            plan_id=plan_id,
        )


def refuse_if_expired(conn: psycopg.Connection, spec: Spec, approval: Approval, now: dt.datetime) -> None:
    """Refuse an expired approval, whatever its runs did so far.

    Raises:
        ApprovalExpiredError: naming the approval, when it expired and what its runs verified.
    """
    if approval.expired(spec, now):
        raise ApprovalExpiredError(
            approval.approval_id, approval.plan_id, approval.approved_by, approval.approved_at,
            approval.expires_at(spec), spec.approval_expires_after,
            ledger.verified_by_approval(conn, spec.control_schema, approval.approval_id),
        )


def latest_approval(conn: psycopg.Connection, spec: Spec, plan_id: str) -> Approval | None:
    """The newest approval of a plan (the one apply acts on), or None."""
    row = ledger.latest_approval(conn, spec.control_schema, plan_id)
    return None if row is None else Approval.from_row(row)


CoverageState = Literal["unchanged", "applied", "changed", "unrecorded", "refused", "expired"]
_REACHED = ("started", "verified", "skipped-already-verified", "failed")
_VERIFIED = ("verified", "skipped-already-verified")


@dataclass(frozen=True)
class Coverage:
    """Whether an approval still covers one partition, and why (or why not), for people.

    ``unchanged``: the target is as it was approved against; apply replaces it.
    ``applied``: it carries the approved readings and this approval's runs reached it; apply
    skips it as verified. ``changed``, ``unrecorded``, ``refused``: not covered; apply refuses.
    ``expired``: the approval expired; the target is not read, and apply refuses.
    """

    partition: str
    state: CoverageState
    reason: str
    now: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def covered(self) -> bool:
        return self.state in ("unchanged", "applied")

    def as_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "covered": self.covered, "state": self.state,
                "reason": self.reason}


def short_readings(fp: dict[str, Any]) -> str:
    """A fingerprint in one short phrase: rows, total and the start of the hash."""
    return f"{fp['row_count']} rows, total {fp['total']}, hash {fp['content_hash'][:16]}"


def _at(when: dt.datetime | None) -> str:
    return "an unrecorded time" if when is None else when.isoformat(timespec="seconds")


def judge(
    approval: Approval, stored: Plan, label: str, now: dict[str, Any],
    history: list[dict[str, Any]],
) -> Coverage:
    """Whether ``approval`` still covers partition ``label`` whose target reads ``now``.

    ``history`` is the partition's ledger rows (ledger.partition_history), newest first.
    Covered: the target equals what the approval recorded and no later approval's run has
    replaced it since (a target replaced and then put back is not the one approved against);
    or it carries the approved readings and a run of this approval reached it (started,
    verified, skipped, or failed after its commit: a crashed run resumes, a rerun skips).
    Anything else is a change since the approval, explained by the ledger where it can be.
    """
    n = approval.approval_id
    if approval.target is None or label not in approval.target:
        return Coverage(label, "unrecorded", f"approval {n} was recorded by an older version without the "
                        "target's readings, so what it was given against is unknown; approve the plan again", now)
    recorded, approved = approval.target[label], stored.approved(label)
    rows = [h for h in history if h["partition"] == label]
    own = [h for h in rows if h["approval_id"] == n and h["status"] in _REACHED]
    if now == approved and own:
        return Coverage(label, "applied", f"carries the approved readings; run {own[0]['run_id']} of this "
                        f"approval reached it ({own[0]['status']})", now)
    replaced = [h for h in rows if h["approval_id"] > n and h["status"] == "verified"]
    if now == recorded and not replaced:
        return Coverage(label, "unchanged", "the target is as it was when approved", now)
    if now == recorded:
        h = replaced[0]
        return Coverage(label, "changed", f"target replaced since approval {n}: a later run {h['run_id']} of "
                        f"plan {h['plan_id'][:16]} (approval {h['approval_id']}) verified it at {_at(h['finished_at'])}, "
                        "and it has the readings approved against only again since", now)
    later = next((h for h in rows if h["approval_id"] != n and h["status"] in _VERIFIED
                  and h["content_hash"] == now["content_hash"]
                  and (h["approval_id"] > n or (h["finished_at"] is not None and h["finished_at"] > approval.approved_at))),
                 None)
    why = (f"a later run {later['run_id']} of plan {later['plan_id'][:16]} verified it at {_at(later['finished_at'])}"
           if later is not None else "changed outside backfill_assets")
    return Coverage(label, "changed", f"target changed since approval {n}: it now has {short_readings(now)}, "
                    f"approved against {short_readings(recorded)}; {why}", now)


def coverage(
    conn: psycopg.Connection, ctx: Context, stored: Plan, approval: Approval, labels: list[str],
    now: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Coverage]:
    """Whether ``approval`` still covers each of ``labels`` (see :func:`judge`), reading the
    target (unless ``now`` gives its readings) and the ledger in the caller's transaction."""
    if now is None:
        now = target_readings(conn, ctx, labels)
    history = ledger.partition_history(conn, ctx.spec.control_schema, stored.document.target, labels)
    return {label: judge(approval, stored, label, now[label], history) for label in labels}


def require_coverage(
    conn: psycopg.Connection, ctx: Context, stored: Plan, approval: Approval, labels: list[str],
    now: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Coverage]:
    """:func:`coverage`, refusing any partition the approval no longer covers.

    Raises:
        ApprovalOutdatedError: naming each such partition and why.
    """
    found = coverage(conn, ctx, stored, approval, labels, now)
    refused = {label: c.reason for label, c in found.items() if not c.covered}
    if refused:
        raise ApprovalOutdatedError(approval.approval_id, stored.plan_id, refused)
    return found


@dataclass(frozen=True)
class OpenApproval:
    """An approval not yet verified by its own runs in every partition, with what it covers.
    ``problem``: why it covers nothing at all (the plan no longer matches the spec, the
    stage or the source, or the approval expired), or None. ``expired``: it is older than the
    spec's ``approval_expires_after`` (it expired at ``expires_at``): not open any more, apply
    refuses it, and its partitions are not judged (state ``expired``). ``verified``: the
    partitions its own runs verified."""

    approval: Approval
    partitions: list[Coverage]
    problem: str | None
    expires_at: dt.datetime | None = None
    expired: bool = False
    verified: tuple[str, ...] = ()

    @property
    def state(self) -> Literal["open", "expired"]:
        return "expired" if self.expired else "open"

    def as_json(self) -> dict[str, Any]:
        return {**self.approval.as_json(), "state": self.state,
                "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
                "problem": self.problem, "verified": list(self.verified),
                "partitions": [c.as_json() for c in self.partitions]}


def open_approvals(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, *, clock: Clock = utc_now,
) -> list[OpenApproval]:
    """The newest approval of each plan of ``spec`` that its runs have not verified in every
    partition, each with what it still covers: what apply would do with it now. An expired one
    is listed as such (``expired``), with the partitions its runs verified, and nothing read.

    Reads the target of those partitions (and checks each plan's stage as apply does).
    """
    if not control.control_ready(conn, spec.control_schema):
        return []
    out = []
    now = clock()
    for row in ledger.open_approvals(conn, spec.control_schema, spec.name):
        approval = Approval.from_row(row)
        labels = list(row["partitions"])
        if approval.expired(spec, now):
            out.append(_expired(spec, approval, labels, row["verified"]))
            continue
        try:
            stored = find_plan(conn, spec, approval.plan_id)
            ctx = check_spec_unchanged(conn, factory, spec, stored)
            found = coverage(conn, ctx, stored, approval, labels, check_data_unchanged(conn, ctx, stored))
            problem = None
        except (ApprovalError, SpecError) as err:
            # One approval that cannot be judged (its plan unreadable or drifted) is shown as
            # such; it does not hide the others.
            problem = " ".join(str(err).split())
            found = {label: Coverage(label, "refused", problem) for label in labels}
        out.append(OpenApproval(approval, [found[label] for label in labels], problem, approval.expires_at(spec),
                                verified=tuple(row["verified"])))
    return out


def _expired(spec: Spec, approval: Approval, labels: list[str], verified: list[str]) -> OpenApproval:
    """An expired approval as status shows it: when it expired and what its runs verified."""
    at = approval.expires_at(spec)
    problem = (f"expired at {utc_text(at)} (approval_expires_after: {duration_text(spec.approval_expires_after)}); "
               "apply refuses it: review the plan and approve the plan again")
    done = set(verified)
    partitions = [Coverage(label, "expired", "verified by a run of this approval" if label in done
                           else "not verified by a run of this approval") for label in labels]
    return OpenApproval(approval, partitions, problem, at, expired=True, verified=tuple(verified))
