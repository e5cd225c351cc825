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

import contextlib
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint, utc_now
from backfill_assets.core.diff import (
    PartitionDiff,
    diff_against,
    diff_counts,
    example_text,
    first_added,
    rows_per_partition,
)
from backfill_assets.core.errors import ApprovalError, BackfillError, VerificationError
from backfill_assets.core.pg.db import ConnectionFactory, repeatable_read
from backfill_assets.core.plan import DIFFERING_KEYS, spec_document
from backfill_assets.core.resolve import resolve
from backfill_assets.core.snapshot import copy_problem, immutable_source_changes
from backfill_assets.core.spec import Spec
from backfill_assets.core.stages import recheck_stage, stage_partitions_changed
from backfill_assets.core.store import control, ledger
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import parse_table_name


def check_spec_unchanged(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, stored: Plan
) -> Context:
    """Resolve the current spec against the catalog and require the plan's spec-derived
    fields to be unchanged (target, keys, ordering, column types, transform).

    Raises:
        ApprovalError: the plan was refused, or the spec or target changed since.
        SpecError: the spec no longer matches the catalog.
    """
    require_ready(stored)
    ctx = resolve(conn, spec, stored.labels)
    spec_document_drift(ctx, stored)
    return ctx


def require_ready(stored: Plan) -> None:
    """Refuse a refused plan (ApprovalError naming its problems)."""
    if stored.status != "ready":
        problems = "; ".join(stored.problems) or "its stages did not match"
        raise ApprovalError(
            f"plan {stored.plan_id[:16]} was refused ({problems}); it cannot be approved or applied"
        )


def spec_document_drift(ctx: Context, stored: Plan) -> None:
    """Refuse a plan whose spec-derived fields differ from the spec and catalog now.

    Raises:
        ApprovalError: naming the fields that differ.
    """
    now = spec_document(ctx)
    planned = stored.document.spec_fields()
    changed = [k for k, v in now.items() if planned.get(k) != v]
    if changed:
        raise ApprovalError(
            f"the spec or the target changed since plan {stored.plan_id[:16]} was made "
            f"({', '.join(changed)} differ); plan again"
        )


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
    target = ctx.engine.open(conn, conn, None, ctx)  # read only: no lock, no control store
    try:
        return target.readings(labels)
    finally:
        target.close()  # a lake target's catalog connections


class Builds(Protocol):
    """Where a spec's source snapshot and stages live, by ``engine.type``: what approval and
    apply ask of them. The PostgreSQL engine's are below; the DuckDB engine's are core.duck's.
    Open one with :func:`builds_for`."""

    def unchanged_spec(self, stored: Plan) -> Context:
        """The context resolved now, refusing a plan whose spec-derived fields changed
        (:func:`check_spec_unchanged`)."""
        ...

    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, dict[str, Any]]:
        """Refuse a plan whose snapshot or stage A changed; return the target's readings
        (:func:`check_data_unchanged`)."""
        ...

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, dict[str, Any]]:
        """Per partition, the keys replacing the target adds, removes, changes and keeps; with
        ``first``, also (``"first"``) up to that many differing keys, each with its kind and
        the columns that differ (no values)."""
        ...

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        """Under apply's write, before the replace: stage A (and an immutable source) still
        carry what was approved (VerificationError)."""
        ...

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        """The target apply writes through."""
        ...

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        """The failure, naming the first keys where the committed partition differs."""
        ...


class PostgresBuilds:
    """The snapshot and stages in the spec's PostgreSQL database (``conn``)."""

    def __init__(self, conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec) -> None:
        self.conn, self.factory, self.spec = conn, factory, spec

    def unchanged_spec(self, stored: Plan) -> Context:
        return check_spec_unchanged(self.conn, self.factory, self.spec, stored)

    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, dict[str, Any]]:
        return check_data_unchanged(self.conn, ctx, stored, partitions)

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, dict[str, Any]]:
        return changes_of(self.conn, ctx, stored, first)

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        recheck_stage(self.conn, ctx, stored, labels)

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        return ctx.engine.open(conn, control, factory, ctx, checkpoint)

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        return naming_keys(self.conn, ctx, err, version)


@contextlib.contextmanager
def builds_for(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec,
               control: psycopg.Connection | None = None) -> Iterator[Builds]:
    """The spec's :class:`Builds`, open for the block (``conn``: the spec's database;
    ``control``: the caller's connection to the control store, if it holds one)."""
    if spec.on_spark:
        from backfill_assets.core.spark.flow import SparkBuilds  # pyspark: only when used
        with SparkBuilds.opened(conn, factory, spec, control) as spark_builds:
            yield spark_builds
    elif spec.on_duckdb:
        from backfill_assets.core.duck.flow import DuckBuilds  # DuckDB and the lake libraries: only when used
        with DuckBuilds.opened(conn, factory, spec, control) as builds:
            yield builds
    else:
        yield PostgresBuilds(conn, factory, spec)


def naming_keys(conn: psycopg.Connection, ctx: Context, err: VerificationError,
                 version: str | None) -> VerificationError:
    """The same failure, naming the first keys and columns where the committed partition (a
    lake table's at the ``version`` committed) differs from the approved stage (core.diff).
    The failure is what matters: if the keys cannot be read, it is raised as it was."""
    try:
        with conn.transaction():  # a lake partition is loaded into a temporary table for it
            found = diff_against(conn, ctx, err.partition, "target", DIFFERING_KEYS, version=version)
    except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
        return err
    if not found.examples:
        return err
    detail = "first differing key(s), approved stage against the target: " + "; ".join(
        example_text(e) for e in found.examples)
    return VerificationError(err.partition, err.step, err.expected, err.actual, detail)


@dataclass(frozen=True)
class Review:
    """Everything a person must see before approving a plan, after every check passed: the
    plan (with its problems), and each partition's target as it is now, which the approval
    will record it was given against. Front-ends render it and ask; :func:`confirm` records."""

    spec: Spec
    stored: Plan
    target: dict[str, dict[str, Any]]
    # What replacing each partition changes in the target: keys added, removed, changed and
    # unchanged (core.diff), and with review(first=...) the first differing keys ("first");
    # None when that could not be read (a timeout): it only explains.
    changes: dict[str, dict[str, Any]] | None = None

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
        return {label: {k: c[k] for k in ("added", "removed", "changed", "unchanged")}
                for label, c in self.changes.items()}


def review_id(plan_id: str, target: dict[str, dict[str, Any]]) -> str:
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
        ApprovalError, SpecError: see :func:`find_plan`, :func:`check_spec_unchanged`,
            :func:`check_data_unchanged`.
    """
    if not isinstance(plan, Plan):
        with factory.control(conn) as control:
            plan = find_plan(control, spec, plan)
    stored = plan
    with builds_for(conn, factory, spec) as builds:
        ctx = builds.unchanged_spec(stored)
        target = builds.unchanged_data(ctx, stored)
        changes = None
        try:
            if diff:
                changes = builds.changes(ctx, stored, first)
        except (psycopg.Error, BackfillError):  # only an explanation failed: approval does not depend on it
            changes = None
    return Review(spec, stored, target, changes)


def changes_of(conn: psycopg.Connection, ctx: Context, stored: Plan, first: int = 0) -> dict[str, dict[str, Any]]:
    """Per partition, what replacing the target with stage A changes: the counts of keys added,
    removed, changed and unchanged (core.diff), read in one read-only snapshot; with ``first``,
    up to that many differing keys (``"first"``: key, kind and the columns that differ, no
    values)."""
    with repeatable_read(conn, read_only=ctx.engine.compares_read_only):
        if ctx.engine.relation is None:  # a lake partition is loaded into a temporary table, one at a time
            return {d.partition: _change(d, first) for d in
                    (diff_against(conn, ctx, label, "target", first) for label in stored.labels)}
        # The target is a table here. A partition it holds no row of is stage A's rows, all
        # added: counted, not joined. The others: one join over all of them for the counts, or,
        # with first keys asked for, one per partition, which gives both.
        target, stage = ctx.engine.relation, ctx.stage("a")
        in_target = rows_per_partition(conn, ctx, target, stored.labels)
        out = {}
        for label, n in rows_per_partition(conn, ctx, stage, [lb for lb in stored.labels if not in_target[lb]]).items():
            out[label] = _change(PartitionDiff(label, added=n), 0)
            if first:
                keys = first_added(conn, ctx, stage, label, first) if n else []
                out[label]["first"] = [{"key": key, "kind": "added", "columns": []} for key in keys]
        rest = [label for label in stored.labels if in_target[label]]
        if first:
            for label in rest:
                out[label] = _change(diff_against(conn, ctx, label, "target", first), first)
        else:
            for d in diff_counts(conn, ctx, stage, target, rest):
                out[d.partition] = _change(d, 0)
        return {label: out[label] for label in stored.labels}


def _change(d: PartitionDiff, first: int) -> dict[str, Any]:
    """One partition's entry of :func:`changes_of`."""
    return {"added": d.added, "removed": d.removed, "changed": d.changed, "unchanged": d.unchanged,
            **({"first": [{"key": e.key, "kind": e.kind, "columns": e.columns if e.kind == "changed" else []}
                          for e in d.examples]} if first else {})}


def confirm(control: psycopg.Connection, checked: Review, approved_by: str, *, clock: Clock = utc_now,
            previewed_at: Any = None) -> int:
    """Record the approval of a reviewed plan in the control store (``control``), against the
    target the review read, with the review the person was shown (its id and counts;
    ``previewed_at``: when it was made, if before this moment). Returns the approval id.
    apply checks the stage and the target again before it writes."""
    shown = {"review_id": checked.review_id, "changes": checked.counts(),
             "previewed_at": None if previewed_at is None else str(previewed_at)}
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
    target: dict[str, dict[str, Any]], clock: Clock = utc_now, review: dict[str, Any] | None = None,
) -> int:
    """Record, in the control store, an approval of a plan that the caller has just checked
    and shown (see :func:`review` and :func:`confirm`, which call this). Returns its id.

    Args:
        target: what :func:`check_data_unchanged` returned: every plan partition's target
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
