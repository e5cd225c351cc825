"""Apply an approved plan: replace and verify one partition per transaction.

For each partition (or each group of partitions that moved keys link), in plan order:

1. Finite ``lock_timeout`` and ``statement_timeout``; an advisory lock per target partition,
   held from before the transaction until after the post-commit verification (keeps any
   other backfill out, whatever its spec, so that the re-read sees this run's rows), then,
   inside the transaction, a table lock in SHARE ROW EXCLUSIVE mode. Row locks cannot cover rows that do not exist yet (another
   writer's INSERT into the partition), and PostgreSQL has no predicate locks outside
   SERIALIZABLE, so a table lock that conflicts with every writer's ROW EXCLUSIVE is what
   keeps other writers out. It does not block readers: under MVCC they see the old
   partition until commit, then the new one, never a half-written one.
2. Read the target: the approval must still cover it (approve.judge: the target is what the
   approval was given against, or carries the approved readings after this approval's own
   runs reached it), else refuse before writing. This is checked for every partition before
   the first write too; under the lock it catches a writer that slipped in since.
   If the target already carries the approved fingerprint, record it as verified without
   rewriting (a rerun after an interruption converges).
3. Recheck: stage A's partition fingerprint, recomputed now, must equal the approved one;
   for an ``immutable`` snapshot the source partition's too.
4. DELETE the target partition and INSERT the stage with explicit columns.
5. Fingerprint the target inside the same transaction; a mismatch rolls back.
6. Commit, then read the target again on a fresh connection and confirm its fingerprint.

Any failure stops before the next partition; partitions already verified stay verified.
Every step is recorded in the ledger.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg

from backfill_assets.core import control, sqlbuild
from backfill_assets.core.approve import (
    Approval, check_data_unchanged, check_spec_unchanged, find_plan, latest_approval,
    require_coverage, short_readings,
)
from backfill_assets.core.db import ConnectionFactory, read_committed, repeatable_read, transient_errors
from backfill_assets.core.errors import ApprovalError, BackfillError, VerificationError
from backfill_assets.core.fingerprint import business_key_order
from backfill_assets.core.plan_document import Plan
from backfill_assets.core.context import Clock, Context, Progress, quiet, set_timeouts, spec_lock, utc_now
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.snapshot import immutable_source_changes
from backfill_assets.core.spec import Spec

# A test or an operator may pause at these points (see Checkpoint).
STEPS = ("locked", "deleted", "inserted", "before-commit", "committed", "verified")
Checkpoint = Callable[[str, list[str]], None]


def _no_checkpoint(step: str, labels: list[str]) -> None:
    pass


@dataclass
class ApplyResult:
    run_id: str
    plan_id: str
    approval_id: int
    partitions: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "plan_id": self.plan_id, "approval_id": self.approval_id,
                "partitions": self.partitions}


_short = short_readings


def _replaced(label: str, status: str, approved: dict[str, Any], done: int, total: int) -> ProgressEvent:
    """The progress event of one partition replaced (or found already replaced)."""
    return ProgressEvent("apply", f"{status} ({_short(approved)})", partition=label, done=done, total=total,
                         rows=approved["row_count"], status=status)


def _readings(conn: psycopg.Connection, ctx: Context, rel, value: object) -> dict[str, Any]:
    return ctx.readings(conn, rel, value).as_dict()


def _values(ctx: Context, labels: list[str]) -> list[object]:
    return [ctx.partitions[ctx.labels.index(label)] for label in labels]


def replace_group(
    conn: psycopg.Connection, ctx: Context, stored: Plan, approval: Approval, labels: list[str],
    checkpoint: Checkpoint = _no_checkpoint,
) -> str:
    """Replace the partitions ``labels`` in one transaction; return the ledger status.

    Raises:
        ApprovalOutdatedError: under the lock, the approval no longer covers a partition (its
            target changed since the approval; rolled back, nothing written).
        VerificationError: a recheck or the in-transaction verification failed (rolled back).
        TransientDatabaseError: a lock or statement timeout (rolled back).
    """
    spec = ctx.spec
    target, stage = spec.target_ref, ctx.stage("a")
    values = _values(ctx, labels)
    approved = {label: stored.approved(label) for label in labels}
    # READ COMMITTED whatever the server's default: every read after the lock sees every
    # write the lock waited for.
    with transient_errors(f"replacing partition(s) {', '.join(labels)} of {target}"), read_committed(conn):
        set_timeouts(conn, spec)
        conn.execute(sqlbuild.lock_for_replace(target))
        checkpoint("locked", labels)
        # A writer may have slipped in since apply's first check: read the target again here,
        # where nobody else can write it until the commit.
        covered = require_coverage(conn, ctx, stored, approval, labels)
        if all(covered[label].now == approved[label] for label in labels):
            return "skipped-already-verified"
        for value, label in zip(values, labels):
            now = _readings(conn, ctx, stage, value)
            if now != approved[label]:
                raise VerificationError(label, "recheck of the approved stage", _short(approved[label]), _short(now))
        if ctx.spec.source.snapshot == "immutable":  # only this group's partitions
            for label, (planned, now) in immutable_source_changes(conn, ctx, stored.pinned_source(labels)).items():
                raise VerificationError(
                    label, "recheck of the immutable source",
                    f"hash {planned['content_hash'][:16]}", f"hash {now['content_hash'][:16]}",
                )
        for value in values:
            conn.execute(*sqlbuild.delete_partition(target, spec.partition_key, value))
        checkpoint("deleted", labels)
        order = business_key_order(ctx.target_columns, spec.business_key)
        for value in values:
            conn.execute(*sqlbuild.insert_from_stage(target, stage, spec.columns, spec.partition_key, order, value))
        checkpoint("inserted", labels)
        for value, label in zip(values, labels):
            now = _readings(conn, ctx, target, value)
            if now != approved[label]:
                raise VerificationError(label, "verification before commit", _short(approved[label]), _short(now))
        checkpoint("before-commit", labels)
    checkpoint("committed", labels)
    return "verified"


@contextlib.contextmanager
def partition_locks(conn: psycopg.Connection, ctx: Context, labels: list[str]) -> Iterator[None]:
    """Session advisory locks on (target, partition), taken in one order by every run (no
    deadlock between groups), waiting at most ``lock_timeout``."""
    keys = [f"backfill_assets:target:{ctx.spec.target_ref}:{label}" for label in sorted(labels)]
    taken: list[str] = []
    try:
        with transient_errors(f"locking partition(s) {', '.join(labels)} of {ctx.spec.target_ref}"):
            for key in keys:
                with conn.transaction():
                    set_timeouts(conn, ctx.spec)
                    conn.execute(*sqlbuild.advisory_lock(key))
                taken.append(key)
        yield
    finally:
        if not conn.closed and not conn.broken:
            for key in taken:
                conn.execute(*sqlbuild.advisory_unlock(key))


def verify_committed(factory: ConnectionFactory, ctx: Context, stored: Plan, labels: list[str]) -> None:
    """Read the committed target on a fresh connection and compare with the approval.

    Raises:
        VerificationError: naming the partition and both readings.
    """
    with factory() as conn, repeatable_read(conn, read_only=True):
        for value, label in zip(_values(ctx, labels), labels):
            now = _readings(conn, ctx, ctx.spec.target_ref, value)
            if now != stored.approved(label):
                raise VerificationError(label, "verification after commit", _short(stored.approved(label)), _short(now))


def apply_plan(
    spec: Spec, plan_ref: str, factory: ConnectionFactory, *, run_id: str,
    only: list[str] | None = None, clock: Clock = utc_now, progress: Progress = quiet,
    checkpoint: Checkpoint = _no_checkpoint, on_result: Callable[[dict[str, Any]], None] | None = None,
) -> ApplyResult:
    """Replace the partitions of an approved plan, in order, verifying each.

    Args:
        run_id: a new id for this run (the ledger's key with the partition).
        only: apply only these partitions of the plan (with the partitions a moved key
            links them to, which are replaced in the same transaction).
        checkpoint: called at each step of each replace (see ``STEPS``); for tests.
        on_result: called with each partition's result as soon as it is final.

    Raises:
        ApprovalError: unknown, refused, unapproved or outdated plan; nothing written.
        ApprovalOutdatedError: the approval no longer covers a chosen partition (its target
            changed since the approval): before the first write, nothing written; or, for a
            change that slipped in during the run, under that partition's lock (that partition
            rolled back, the following ones not attempted).
        VerificationError: a recheck or verification failed; that partition rolled back,
            the following ones not attempted.
        TransientDatabaseError, ConcurrentRunError: safe to retry with the same plan.
    """
    with factory() as conn, spec_lock(conn, spec):
        stored = find_plan(conn, spec, plan_ref)
        approval = latest_approval(conn, spec, stored.plan_id)
        if approval is None:
            raise ApprovalError(
                f"plan {stored.plan_id[:16]} has not been approved; run approve and review it first"
            )
        ctx = check_spec_unchanged(conn, factory, spec, stored)
        result = ApplyResult(run_id, stored.plan_id, approval.approval_id)
        doc = stored.document
        groups = [list(g) for g in doc.replace_groups]
        if only is not None:
            missing = sorted(set(only) - set(stored.labels))
            if missing:
                raise ApprovalError(
                    f"partition(s) {', '.join(missing)} are not in plan {stored.plan_id[:16]}; "
                    "plan and approve them first"
                )
            groups = [g for g in groups if set(g) & set(only)]
        chosen = {label for g in groups for label in g}
        # Refuse a changed stage (or immutable source), and a target the approval no longer
        # covers, before the first write; each replace checks its own partitions again under
        # the lock.
        in_order = [label for label in stored.labels if label in chosen]
        now = check_data_unchanged(conn, ctx, stored, in_order)
        require_coverage(conn, ctx, stored, approval, in_order, now)
        progress(ProgressEvent("apply", f"replacing {len(in_order)} partition(s)", done=0, total=len(in_order),
                               status="started"))
        control.ledger_start(
            conn, spec.control_schema, run_id=run_id, plan_id=stored.plan_id, approval_id=approval.approval_id,
            snapshot_id=doc.snapshot.id, target_table=doc.target,
            transform_version=doc.transform_version, run_started_at=clock(),
            partitions=[{"partition": label, **stored.approved(label)} for label in in_order],
        )
        for n, labels in enumerate(groups):
            control.ledger_mark(conn, spec.control_schema, run_id, labels, "started", clock())
            try:
                with partition_locks(conn, ctx, labels):
                    status = replace_group(conn, ctx, stored, approval, labels, checkpoint)
                    if status == "verified":
                        verify_committed(factory, ctx, stored, labels)
                        checkpoint("verified", labels)
                    # Recorded before the partition is released: the next run to lock it
                    # judges its approval against a ledger that names this run.
                    control.ledger_mark(conn, spec.control_schema, run_id, labels, status, clock())
            except (BackfillError, psycopg.Error) as err:
                # Our errors and the driver's carry no credential (see db.connect).
                message = " ".join(str(err).split()) or err.__class__.__name__
                control.ledger_mark(conn, spec.control_schema, run_id, labels, "failed", clock(), message)
                rest = [label for group in groups[n + 1:] for label in group]
                if rest:
                    control.ledger_mark(conn, spec.control_schema, run_id, rest, "not-attempted", clock(),
                                        f"stopped after partition(s) {', '.join(labels)} failed")
                raise
            for label in labels:
                entry = {"partition": label, "status": status, **stored.approved(label)}
                result.partitions.append(entry)
                if on_result is not None:
                    on_result(entry)
                progress(_replaced(label, status, stored.approved(label), len(result.partitions), len(in_order)))
        return result


def approved_plan_for(conn: psycopg.Connection, spec: Spec, labels: list[str]) -> str:
    """The newest approved plan that includes every one of ``labels``.

    Raises:
        ApprovalError: some partition has no approved plan, or they are in different ones.
    """
    if not control.control_ready(conn, spec.control_schema):
        raise ApprovalError(f"no plan has been approved for spec {spec.name}; plan and approve first")
    found = {label: control.newest_approved_plan_with(conn, spec.control_schema, spec.name, label) for label in labels}
    missing = [label for label, plan_id in found.items() if plan_id is None]
    if missing:
        raise ApprovalError(
            f"partition(s) {', '.join(missing)} of {spec.target_ref} have no approved plan; "
            "plan them and approve that plan before the target is materialized"
        )
    plans = sorted(set(found.values()))  # type: ignore[arg-type]
    if len(plans) > 1:
        raise ApprovalError(
            f"partitions {', '.join(labels)} are covered by different approved plans "
            f"({', '.join(p[:16] for p in plans)}); materialize them separately"
        )
    return plans[0]  # type: ignore[return-value]
