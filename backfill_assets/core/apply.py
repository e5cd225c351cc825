"""Apply an approved plan: replace and verify one partition per transaction.

For each partition (or each group of partitions that moved keys link; or, with the spec's
``replace_batch_rows``, each batch of consecutive small partitions), in plan order:

1. Finite ``lock_timeout`` and ``statement_timeout``; an advisory lock per target partition,
   held from before the transaction until after the post-commit verification (keeps any
   other backfill out, whatever its spec, so that the re-read sees this run's rows), then,
   inside the transaction, a table lock in SHARE ROW EXCLUSIVE mode. Row locks cannot cover rows that do not exist yet (another
   writer's INSERT into the partition), and PostgreSQL has no predicate locks outside
   SERIALIZABLE, so a table lock that conflicts with every writer's ROW EXCLUSIVE is what
   keeps other writers out. It does not block readers: under MVCC they see the old
   partition until commit, then the new one, never a half-written one.
2. Read the target: the approval must still cover it (coverage.judge: the target is what the
   approval was given against, or carries the approved readings after this approval's own
   runs reached it), else refuse before writing. This is checked for every partition before
   the first write too; under the lock it catches a writer that slipped in since.
   If the target already carries the approved fingerprint, record it as verified without
   rewriting (a rerun after an interruption converges).
3. Recheck, with the stage locked against writers: stage A's partition must still carry the
   approved fingerprint, by its seal (the rows its build wrote, untouched) or, where the
   seal does not hold, by a fingerprint recomputed now; for an ``immutable`` snapshot the
   source partition's fingerprint is recomputed too.
4. DELETE the target partition and INSERT the stage with explicit columns.
5. Fingerprint the target inside the same transaction; a mismatch rolls back.
6. Commit, then read the target again in a new transaction on a second connection (opened
   once per run) and confirm its fingerprint.

Any failure stops before the next partition; partitions already verified stay verified.
Every step is recorded in the ledger.

The protocol is written once against core.context.Target (locks, one atomic write,
reads under it, committed reads), which the spec's engine opens; the PostgreSQL specifics of
steps 1, 4 and 6 live in core.engines.postgres.target, so another engine adds a Target, not a
second apply.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NotRequired

import psycopg

from backfill_assets.core.build import BuildEngine, open_build_engine
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint, spec_lock, utc_now
from backfill_assets.core.coverage import Approval, latest_approval, refuse_if_expired, require_coverage, short_readings
from backfill_assets.core.errors import (
    ApprovalError,
    ApprovalHaltedError,
    BackfillError,
    FailedPartition,
    VerificationError,
)
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.planning import compare_readings as _compare
from backfill_assets.core.progress import Progress, ProgressEvent, quiet
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import ledger
from backfill_assets.core.store.control import control_ready, ensure_ledger_index
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.store.plans import find_plan

# A test or an operator may pause at these points (see core.context.Checkpoint).
STEPS = ("locked", "deleted", "inserted", "before-commit", "committed", "verified")


class Applied(Reading):
    """One partition of a run, final: its status and the approved readings it now carries
    (``target_version``: the lake version committed, absent for PostgreSQL)."""

    partition: str
    status: str
    target_version: NotRequired[str]


@dataclass
class ApplyResult:
    run_id: str
    plan_id: str
    approval_id: int
    partitions: list[Applied] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "plan_id": self.plan_id, "approval_id": self.approval_id,
                "partitions": self.partitions}


_short = short_readings


def _replaced(label: str, status: str, approved: Reading, done: int, total: int) -> ProgressEvent:
    """The progress event of one partition replaced (or found already replaced)."""
    return ProgressEvent("apply", f"{status} ({_short(approved)})", partition=label, done=done, total=total,
                         rows=approved["row_count"], status=status)


def replace_group(
    conn: psycopg.Connection, control: psycopg.Connection, target: Target, ctx: Context, stored: Plan,
    approval: Approval, labels: list[str], engine: BuildEngine, checkpoint: Checkpoint = no_checkpoint,
) -> str:
    """Replace the partitions ``labels`` in one atomic write of ``target``; return the ledger
    status. The protocol is the same for every engine (core.context.Target).

    Raises:
        ApprovalOutdatedError: under the lock, the approval no longer covers a partition (its
            target changed since the approval; rolled back, nothing written).
        VerificationError: a recheck or the verification before commit failed (rolled back).
        TransientDatabaseError: a lock or statement timeout (rolled back).
    """
    approved = {label: stored.approved(label) for label in labels}
    with target.writing(labels) as write:
        checkpoint("locked", labels)
        # A writer may have slipped in since apply's first check: read the target again here,
        # where nobody else can write it until the commit.
        covered = require_coverage(conn, control, ctx, stored, approval, labels, write.readings(labels))
        if all(covered[label].now == approved[label] for label in labels):
            return "skipped-already-verified"
        engine.recheck_stage(ctx, stored, labels)
        write.replace(labels, {
            "plan_id": stored.plan_id, "approval_id": str(approval.approval_id), "partitions": ",".join(labels),
            "content_hash": ",".join(approved[label]["content_hash"] for label in labels),
        })
        _compare(approved, write.readings(labels), "verification before commit")
        checkpoint("before-commit", labels)
    checkpoint("committed", labels)
    return "verified"


def verify_committed(target: Target, stored: Plan, labels: list[str]) -> None:
    """Read the committed partitions afresh and compare them with the approval.

    Raises:
        VerificationError: naming the partition and both readings.
    """
    _compare({label: stored.approved(label) for label in labels}, target.committed_readings(labels),
             "verification after commit")


def apply_plan(
    spec: Spec, plan_ref: str, factory: ConnectionFactory, *, run_id: str,
    only: list[str] | None = None, clock: Clock = utc_now, progress: Progress = quiet,
    checkpoint: Checkpoint = no_checkpoint, on_result: Callable[[Applied], None] | None = None,
    make_target: Callable[..., Target] | None = None,
) -> ApplyResult:
    """Replace the partitions of an approved plan, in order, verifying each.

    Args:
        run_id: a new id for this run (the ledger's key with the partition).
        only: apply only these partitions of the plan (with the partitions a moved key
            links them to, which are replaced in the same transaction).
        checkpoint: called at each step of each replace (see ``STEPS``); for tests.
        on_result: called with each partition's result as soon as it is final.
        make_target: ``(conn, control, factory, ctx, checkpoint) -> Target``, what is written to
            (default: the build engine's, ``BuildEngine.open_target``); for tests.

    Raises:
        ApprovalError: unknown, refused, unapproved or outdated plan; nothing written.
        ApprovalExpiredError: the plan's approval is older than the spec's
            ``approval_expires_after`` at ``clock()``, even if runs of it replaced some
            partitions already; nothing written.
        ApprovalHaltedError: an earlier run of the approval failed a partition that is not
            verified since and that this run does not retry; nothing written.
        ApprovalOutdatedError: the approval no longer covers a chosen partition (its target
            changed since the approval): before the first write, nothing written; or, for a
            change that slipped in during the run, under that partition's lock (that partition
            rolled back, the following ones not attempted).
        VerificationError: a recheck or verification failed; that partition rolled back,
            the following ones not attempted.
        TransientDatabaseError, ConcurrentRunError: safe to retry with the same plan.
    """
    with factory() as conn, factory.control(conn) as control, spec_lock(control, spec), \
            open_build_engine(conn, factory, spec, control) as engine:
        stored, approval, ctx, groups = _checked_before_writing(conn, control, engine, spec, plan_ref, only, clock())
        ensure_ledger_index(control, spec.control_schema)
        in_order = [label for g in groups for label in g]
        progress(ProgressEvent("apply", f"replacing {len(in_order)} partition(s)", done=0, total=len(in_order),
                               status="started"))
        doc = stored.document
        bounds = {e.partition: {"start": e.start, "end": e.end} for e in doc.partitions if e.start is not None}
        ledger.ledger_start(
            control, spec.control_schema, run_id=run_id, plan_id=stored.plan_id, approval_id=approval.approval_id,
            snapshot_id=doc.snapshot.id, target_table=doc.target,
            transform_version=doc.transform_version, run_started_at=clock(),
            partitions=[{"partition": label, **stored.approved(label), **bounds.get(label, {})} for label in in_order],
        )
        result = ApplyResult(run_id, stored.plan_id, approval.approval_id)
        target = (make_target or engine.open_target)(conn, control, factory, ctx, checkpoint)
        try:
            for n, labels in enumerate(groups):
                status, version = _replace_and_record(conn, control, engine, target, ctx, stored, approval, run_id,
                                                      groups, n, clock, checkpoint)
                for label in labels:
                    entry: Applied = {"partition": label, "status": status, **stored.approved(label)}
                    if version is not None:
                        entry["target_version"] = version
                    result.partitions.append(entry)
                    if on_result is not None:
                        on_result(entry)
                    progress(_replaced(label, status, stored.approved(label), len(result.partitions), len(in_order)))
        finally:
            target.close()
        return result


def _checked_before_writing(
    conn: psycopg.Connection, control: psycopg.Connection, engine: BuildEngine, spec: Spec, plan_ref: str,
    only: list[str] | None, now: dt.datetime,
) -> tuple[Plan, Approval, Context, list[list[str]]]:
    """The approved plan, its approval, the context and the groups to replace (in plan order),
    after every check apply makes before its first write: the approval not expired at ``now``,
    the spec and the target's columns unchanged, the stage (and an immutable source) as
    planned, the target still covered."""
    stored = find_plan(control, spec, plan_ref)
    approval = latest_approval(control, spec, stored.plan_id)
    if approval is None:
        raise ApprovalError(
            f"plan {stored.plan_id[:16]} has not been approved; run approve and review it first"
        )
    # Checked when a run starts (a run that started in time finishes), for a run resuming a
    # partly applied approval too: expiry bounds how long a person's review is acted on, and
    # partitions this approval's runs already replaced cannot make the rest any fresher.
    refuse_if_expired(control, spec, approval, now)
    ctx = engine.unchanged_spec(stored)
    groups = [list(g) for g in stored.document.replace_groups]
    if only is not None:
        missing = sorted(set(only) - set(stored.labels))
        if missing:
            raise ApprovalError(
                f"partition(s) {', '.join(missing)} are not in plan {stored.plan_id[:16]}; "
                "plan and approve them first"
            )
        groups = [g for g in groups if set(g) & set(only)]
    chosen = {label for g in groups for label in g}
    in_order = [label for label in stored.labels if label in chosen]
    refuse_after_failure(control, spec, stored.plan_id, in_order)
    # Each replace checks its own partitions again under the lock.
    require_coverage(conn, control, ctx, stored, approval, in_order, engine.unchanged_data(ctx, stored, in_order))
    return stored, approval, ctx, batched(groups, stored, spec.replace_batch_rows)


# The most partitions one batch replaces (replace_batch_rows): its statements, locks and ledger
# rows stay few enough for one transaction.
MAX_BATCH_PARTITIONS = 256


def batched(groups: list[list[str]], stored: Plan, most_rows: int) -> list[list[str]]:
    """Consecutive groups merged into batches of at most ``most_rows`` approved rows (and
    ``MAX_BATCH_PARTITIONS`` partitions), each replaced in one transaction; a group larger
    than that stays a batch of its own. ``most_rows`` 0: the groups as they are."""
    if most_rows <= 0:
        return groups
    out: list[list[str]] = []
    rows = 0
    for group in groups:
        size = sum(stored.approved(label)["row_count"] for label in group)
        if out and rows + size <= most_rows and len(out[-1]) + len(group) <= MAX_BATCH_PARTITIONS:
            out[-1] = [*out[-1], *group]
            rows += size
        else:
            out.append(list(group))
            rows = size
    return out


def _replace_and_record(
    conn: psycopg.Connection, control: psycopg.Connection, engine: BuildEngine, target: Target, ctx: Context,
    stored: Plan, approval: Approval, run_id: str, groups: list[list[str]], n: int, clock: Clock,
    checkpoint: Checkpoint,
) -> tuple[str, str | None]:
    """Replace and verify group ``n`` under its partition locks, recording each step in the
    ledger (``control``, the control store's connection); return its status and the lake version
    committed (None for PostgreSQL). On failure, mark it failed and the following groups not
    attempted, and raise."""
    spec, labels = ctx.spec, groups[n]
    ledger.ledger_mark(control, spec.control_schema, run_id, labels, "started", clock())
    try:
        with target.locked(labels):
            status = replace_group(conn, control, target, ctx, stored, approval, labels, engine, checkpoint)
            if status == "verified":
                try:
                    verify_committed(target, stored, labels)
                except VerificationError as err:
                    raise engine.explain(ctx, err, target.committed_version(labels)) from None
                checkpoint("verified", labels)
            # Recorded before the partition is released: the next run to lock it
            # judges its approval against a ledger that names this run.
            version = target.committed_version(labels)
            ledger.ledger_mark(control, spec.control_schema, run_id, labels, status, clock(), target_version=version)
            return status, version
    except Exception as err:
        # Our errors and the driver's carry no credential (see db.connect); of anything else
        # (a library's own failure) only its class is recorded, so the ledger still says the
        # partition failed and the following ones were not attempted.
        if isinstance(err, (BackfillError, psycopg.Error)):
            message = " ".join(str(err).split()) or err.__class__.__name__
        else:
            message = f"unexpected {err.__class__.__name__}; see the run's output"
        rest = [label for group in groups[n + 1:] for label in group]
        try:
            ledger.ledger_mark(control, spec.control_schema, run_id, labels, "failed", clock(), message)
            if rest:
                ledger.ledger_mark(control, spec.control_schema, run_id, rest, "not-attempted", clock(),
                                    f"stopped after partition(s) {', '.join(labels)} failed")
        except psycopg.Error:
            # The ledger could not take the record (its own lock or the connection failed
            # too): the failure itself is what the caller must see; the ledger still shows
            # the partition as started by this run, never as verified.
            pass
        raise


def refuse_after_failure(control: psycopg.Connection, spec: Spec, plan_id: str, labels: list[str]) -> None:
    """Apply stops after its first failure, across runs too (several runs of one approval, as
    a multi-run Dagster backfill makes): a run of an approval does not replace partitions
    while an earlier run of it failed a partition that no run of it has verified since,
    unless this run retries that partition itself.

    Raises:
        ApprovalHaltedError: naming each such partition, its run and its error.
    """
    failed = [f for f in ledger.unverified_failures(control, spec.control_schema, plan_id)
              if f["partition"] not in labels]
    if failed:
        raise ApprovalHaltedError(failed[0]["approval_id"], plan_id, [
            FailedPartition(f["partition"], f["run_id"], f["error"]) for f in failed
        ])


def approved_plan_for(control: psycopg.Connection, spec: Spec, labels: list[str]) -> str:
    """The newest approved plan that includes every one of ``labels``, from the control store.

    Raises:
        ApprovalError: some partition has no approved plan, or they are in different ones.
    """
    if not control_ready(control, spec.control_schema):
        raise ApprovalError(f"no plan has been approved for spec {spec.name}; plan and approve first")
    found = {label: ledger.newest_approved_plan_with(control, spec.control_schema, spec.name, label) for label in labels}
    missing = [label for label, plan_id in found.items() if plan_id is None]
    if missing:
        raise ApprovalError(
            f"partition(s) {', '.join(missing)} of {spec.target_name} have no approved plan; "
            "plan them and approve that plan before the target is materialized"
        )
    plans = sorted(set(found.values()))  # type: ignore[arg-type]
    if len(plans) > 1:
        raise ApprovalError(
            f"partitions {', '.join(labels)} are covered by different approved plans "
            f"({', '.join(p[:16] for p in plans)}); materialize them separately"
        )
    return plans[0]  # type: ignore[return-value]
