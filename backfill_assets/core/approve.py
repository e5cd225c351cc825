"""Approval: bound to one exact, stored plan, and only while it still describes the data.

An approval is a row in the control schema naming the plan id (a hash of everything the
approver saw). It is refused for an unknown or refused plan, a plan of another spec, a spec
or target that changed since the plan, a snapshot copy whose seal broke, an immutable source
or a stage that no longer carries the planned fingerprint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg

from backfill_assets.core import control
from backfill_assets.core.db import ConnectionFactory, repeatable_read
from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.plan import (
    Clock, Context, copy_problem, resolve, source_fingerprints, spec_document,
    stage_partitions_changed, utc_now,
)
from backfill_assets.core.spec import Spec, parse_table_name

MIN_PREFIX = 8


@dataclass(frozen=True)
class StoredPlan:
    plan_id: str
    status: str
    document: dict[str, Any]

    @property
    def labels(self) -> list[str]:
        return [p["partition"] for p in self.document["partitions"]]

    def approved(self, label: str) -> dict[str, Any]:
        """The approved readings (stage A's) of one partition."""
        return next(p["stage_a"] for p in self.document["partitions"] if p["partition"] == label)


def find_plan(conn: psycopg.Connection, spec: Spec, plan_ref: str) -> StoredPlan:
    """The stored plan with this id, or the only one starting with this prefix.

    Raises:
        ApprovalError: no such plan, an ambiguous prefix, or a plan of another spec.
    """
    ref = plan_ref.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{%d,64}" % MIN_PREFIX, ref):
        raise ApprovalError(
            f"--plan must be a plan id (at least {MIN_PREFIX} hex digits of it), as printed by plan"
        )
    if not control.control_ready(conn, spec.control_schema):
        raise ApprovalError(f"no plans exist in schema {spec.control_schema}; run plan first")
    found = control.plans_by_prefix(conn, spec.control_schema, ref)
    if not found:
        raise ApprovalError(f"there is no plan {ref}; run plan and use the plan_id it prints")
    if len(found) > 1:
        raise ApprovalError(f"plan prefix {ref} is ambiguous; give more of the plan id")
    plan_id, status, doc = found[0]
    if doc.get("spec") != spec.name:
        raise ApprovalError(f"plan {plan_id[:16]} belongs to spec {doc.get('spec')}, not {spec.name}")
    return StoredPlan(plan_id, status, doc)


def check_spec_unchanged(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, stored: StoredPlan
) -> Context:
    """Resolve the current spec against the catalog and require the plan's spec-derived
    fields to be unchanged (target, keys, ordering, column types, transform).

    Raises:
        ApprovalError: the plan was refused, or the spec or target changed since.
        SpecError: the spec no longer matches the catalog.
    """
    if stored.status != "ready":
        problems = "; ".join(stored.document.get("problems", [])) or "its stages did not match"
        raise ApprovalError(
            f"plan {stored.plan_id[:16]} was refused ({problems}); it cannot be approved or applied"
        )
    ctx = resolve(conn, factory, spec, stored.labels)
    now = spec_document(ctx)
    changed = [k for k, v in now.items() if stored.document.get(k) != v]
    if changed:
        raise ApprovalError(
            f"the spec or the target changed since plan {stored.plan_id[:16]} was made "
            f"({', '.join(changed)} differ); plan again"
        )
    return ctx


def check_data_unchanged(conn: psycopg.Connection, ctx: Context, stored: StoredPlan) -> None:
    """Require stage A, and an immutable source, to still carry the planned fingerprints.

    A copied snapshot is not hashed again: its seal is checked (one pass, no sort; see
    plan.copy_problem). It reaches the target only through the stage, which is checked here
    by its seal too, or hashed where the seal does not hold (plan.stage_partitions_changed),
    and hashed again under the lock before each replace.

    Raises:
        ApprovalError: naming the partitions that changed.
    """
    spec, doc = ctx.spec, stored.document
    snap = doc["snapshot"]
    immutable = snap["mode"] == "immutable"
    with repeatable_read(conn):
        found = control.find_snapshot(conn, spec.control_schema, snap["id"])
        if found is None or found["fingerprint"] != snap["fingerprint"]:
            raise ApprovalError(f"snapshot {snap['id']} of plan {stored.plan_id[:16]} is gone; plan again")
        copy = found["snapshot_table"]
        problem = None if copy is None else copy_problem(conn, ctx, parse_table_name(copy), snap["fingerprint"])
        if problem is not None:
            raise ApprovalError(f"the copy {copy} of snapshot {snap['id']} {problem}; plan again")
        current = source_fingerprints(conn, ctx, spec.source_ref) if immutable else {}
        source_changed = [
            p["partition"] for p in doc["partitions"]
            if immutable and current[p["partition"]] != {
                "row_count": p["source"]["snapshot_rows"], "content_hash": p["source"]["snapshot_hash"]
            }
        ]
        stage = ctx.stage("a")
        approved = {label: stored.approved(label) for label in ctx.labels}
        stage_changed = stage_partitions_changed(conn, ctx, "a", approved)
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


def approve_plan(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, stored: StoredPlan,
    approved_by: str, *, clock: Clock = utc_now,
) -> int:
    """Check that the plan still describes the data, then record the approval.

    Show the plan to the approver before calling this. Returns the approval id.

    Raises:
        ApprovalError, SpecError: see :func:`check_spec_unchanged`, :func:`check_data_unchanged`.
    """
    _approver(approved_by)
    ctx = check_spec_unchanged(conn, factory, spec, stored)
    check_data_unchanged(conn, ctx, stored)
    return record_approval(conn, spec, stored, approved_by, clock=clock)


def record_approval(
    conn: psycopg.Connection, spec: Spec, stored: StoredPlan, approved_by: str, *,
    clock: Clock = utc_now,
) -> int:
    """Record an approval of a plan that the caller has just checked (with
    :func:`check_spec_unchanged` and :func:`check_data_unchanged`) and shown. Returns its id.

    apply checks the stage again before it writes, so nothing approved here is trusted blindly.
    """
    with conn.transaction():
        return control.record_approval(
            conn, spec.control_schema, plan_id=stored.plan_id, spec_name=spec.name,
            target_table=stored.document["target"], partitions=stored.labels,
            approved_by=_approver(approved_by), approved_at=clock(),
        )


def _approver(name: str) -> str:
    if not name.strip():
        raise ApprovalError("an approval needs the approver's name (--by)")
    return name.strip()
