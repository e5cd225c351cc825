"""What an approval still covers, and when it expires.

An approval covers a partition only while its target is what the approval was given against
(and no later approval's run has replaced it since), or carries the approved readings after
this approval's own runs reached it (a crashed run resumes; a rerun skips). See :func:`judge`.

An approval does not live forever: once it is older than the spec's
``approval_expires_after`` it is expired (:func:`is_expired`), and no run may start from it,
not even one resuming a run of it that stopped part way (:func:`refuse_if_expired`). Approving
the plan again is a new review of the target as it is then; partitions the old approval's runs
already replaced are skipped by the new one's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg

from backfill_assets.core.build import BuildEngine, open_build_engine
from backfill_assets.core.context import Clock, Context, utc_now
from backfill_assets.core.errors import ApprovalError, ApprovalOutdatedError, SpecError
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.planning import short_readings, target_readings
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store import ledger
from backfill_assets.core.store.ledger import ApprovalRow, HistoryRow
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.store.plans import find_plan


@dataclass(frozen=True)
class Approval:
    """A recorded approval. ``target`` is each partition's target readings when it was given
    (None: recorded by an older version that did not read them)."""

    approval_id: int
    plan_id: str
    approved_by: str
    approved_at: dt.datetime
    target: dict[str, Reading] | None = field(repr=False)

    @classmethod
    def from_row(cls, row: ApprovalRow) -> "Approval":
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


def refuse_if_expired(control: psycopg.Connection, spec: Spec, approval: Approval, now: dt.datetime) -> None:
    """Refuse an expired approval, whatever its runs did so far (``control``: the control
    store's connection, whose ledger says what they verified).

    Raises:
        ApprovalExpiredError: naming the approval, when it expired and what its runs verified.
    """
    if approval.expired(spec, now):
        raise ApprovalExpiredError(
            approval.approval_id, approval.plan_id, approval.approved_by, approval.approved_at,
            approval.expires_at(spec), spec.approval_expires_after,
            ledger.verified_by_approval(control, spec.control_schema, approval.approval_id),
        )


def latest_approval(control: psycopg.Connection, spec: Spec, plan_id: str) -> Approval | None:
    """The newest approval of a plan (the one apply acts on), or None, from the control store."""
    row = ledger.latest_approval(control, spec.control_schema, plan_id)
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
    now: Reading | None = field(default=None, repr=False)

    @property
    def covered(self) -> bool:
        return self.state in ("unchanged", "applied")

    def as_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "covered": self.covered, "state": self.state,
                "reason": self.reason}


def _at(when: dt.datetime | None) -> str:
    return "an unrecorded time" if when is None else when.isoformat(timespec="seconds")


def judge(
    approval: Approval, stored: Plan, label: str, now: Reading,
    history: list[HistoryRow],
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
    conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, stored: Plan, approval: Approval,
    labels: list[str], now: dict[str, Reading] | None = None,
) -> dict[str, Coverage]:
    """Whether ``approval`` still covers each of ``labels`` (see :func:`judge`), reading the
    target on ``conn`` (unless ``now`` gives its readings) and the ledger on ``control``, each
    in the caller's transaction (the same one when the control store is the data database)."""
    if now is None:
        now = target_readings(conn, ctx, labels)
    history = ledger.partition_history(control, ctx.spec.control_schema, stored.document.target, labels)
    return {label: judge(approval, stored, label, now[label], history) for label in labels}


def require_coverage(
    conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, stored: Plan, approval: Approval,
    labels: list[str], now: dict[str, Reading] | None = None,
) -> dict[str, Coverage]:
    """:func:`coverage`, refusing any partition the approval no longer covers.

    Raises:
        ApprovalOutdatedError: naming each such partition and why.
    """
    found = coverage(conn, control, ctx, stored, approval, labels, now)
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

    Reads the target of those partitions (and checks each plan's stage as apply does) on
    ``conn``, the approvals, plans and ledger in the control store.
    """
    with factory.control(conn) as control, contextlib.ExitStack() as stack:
        if not store.control_ready(control, spec.control_schema):
            return []
        opened: list[BuildEngine] = []

        def engine() -> BuildEngine:  # opened for the first approval that needs it (a DuckDB file)
            if not opened:
                opened.append(stack.enter_context(open_build_engine(conn, factory, spec, control)))
            return opened[0]

        return _open_approvals(conn, control, engine, spec, clock())


def _open_approvals(conn: psycopg.Connection, control: psycopg.Connection, engine: Callable[[], BuildEngine],
                    spec: Spec, now: dt.datetime) -> list[OpenApproval]:
    out = []
    for row in ledger.open_approvals(control, spec.control_schema, spec.name):
        approval = Approval.from_row(row)
        labels = list(row["partitions"])
        if approval.expired(spec, now):
            out.append(_expired(spec, approval, labels, row["verified"]))
            continue
        try:
            stored = find_plan(control, spec, approval.plan_id)
            ctx = engine().unchanged_spec(stored)
            found = coverage(conn, control, ctx, stored, approval, labels, engine().unchanged_data(ctx, stored))
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
