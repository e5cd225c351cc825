"""The plan's rules that every build engine shares: what a plan records of the spec and the
catalog, how two builds are compared into a plan, and what refuses a stored plan or a reading.

The steps (core.plan, core.approve, core.stages) and the engines (core.engines) both stand on
this module; it imports neither, so no engine reaches back into a step.
"""

from __future__ import annotations

from typing import Any

import psycopg

from backfill_assets.core.context import Context
from backfill_assets.core.errors import ApprovalError, VerificationError
from backfill_assets.core.fingerprint.identity import PLAN_FORMAT, sha256_hex
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.store.plan_document import (
    AddedPartition,
    PartitionEntry,
    Plan,
    PlanDocument,
    SnapshotRef,
    SourceReport,
)

# How many differing keys a refused plan names per partition.
DIFFERING_KEYS = 3


def differing_keys_prefix(label: str) -> str:
    """The start of the problem that names a partition's first differing keys."""
    return f"partition {label}: first differing key(s)"


def spec_document(ctx: Context) -> dict[str, Any]:
    """The parts of a plan that come from the spec and the target's catalog.

    approve and apply recompute them from the current spec and catalog: any difference
    (another transform version, a target column added or retyped) refuses the plan.
    """
    spec = ctx.spec
    return {
        # Every column of the target, so that one added to it since the plan is drift too
        # (and whatever else names the table: an Iceberg table's catalog).
        **ctx.engine.plan_fields(ctx),
        "format": PLAN_FORMAT,
        "fingerprint_format": FINGERPRINT_FORMAT,
        "spec": spec.name,
        "target": spec.target_name,
        "source": spec.source_name,
        "partition_key": spec.partition_key,
        "business_key": list(spec.business_key),
        "ordering": [o.model_dump() for o in spec.ordering],
        "columns": [[c.name, c.type_name] for c in ctx.target_columns],
        "total": spec.total,
        "records_can_move": spec.records_can_move,
        "transform_version": spec.transform_version,
        "transform_sql_sha256": None if ctx.transform is None else sha256_hex(ctx.transform.encode("utf-8")),
    }


def assemble(ctx: Context, snapshot: Any, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
             reports: dict[str, tuple[int, int]], requested: list[str], found: list[str] | None = None) -> Plan:
    """Compare the stages on every reading and build the plan document and id; ``found``:
    problems found before, listed after the comparison's (differing keys, values a lake target
    could not hold). ``snapshot``: the engine's snapshot (its ``partitions`` and ``as_dict``)."""
    problems: list[str] = []
    partitions: list[PartitionEntry] = []
    for label in ctx.labels:
        fa, fb = a[label], b[label]
        diffs = fa.differences(fb)
        if diffs:
            problems.append(f"partition {label}: stages A and B differ on {', '.join(diffs)}")
        for side, fp in (("A", fa), ("B", fb)):
            if fp.null_key_count or fp.duplicate_key_count:
                problems.append(
                    f"partition {label}: stage {side} has {fp.null_key_count} NULL and "
                    f"{fp.duplicate_key_count} duplicate business key(s)"
                )
        rows_read, null_keys = reports.get(label, (0, 0))
        partitions.append(PartitionEntry(
            partition=label, match=not diffs, stage_a=fa, stage_b=fb,
            source=SourceReport(
                rows_read=rows_read, null_key_rows_dropped=null_keys,
                duplicates_collapsed=rows_read - null_keys - fa.row_count,
                snapshot_rows=snapshot.partitions[label]["row_count"],
                snapshot_hash=snapshot.partitions[label]["content_hash"],
            ),
        ))
    scope = ctx.scope
    document = PlanDocument(
        **spec_document(ctx),
        snapshot=SnapshotRef(**snapshot.as_dict()),
        requested_partitions=requested,
        added_partitions=[AddedPartition(partition=label, reasons=reasons)
                          for label, reasons in (scope.added.items() if scope else [])],
        # Partitions that moved keys link are replaced together, in one transaction.
        replace_groups=scope.groups() if scope else [[label] for label in ctx.labels],
        partitions=partitions,
        # A table that does not exist yet is created by apply: the approval covers that.
        creates_target=ctx.engine.creates_target(ctx),
    )
    return Plan.of(document, problems + list(found or []))


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


def short_readings(fp: dict[str, Any]) -> str:
    """A fingerprint in one short phrase: rows, total and the start of the hash."""
    return f"{fp['row_count']} rows, total {fp['total']}, hash {fp['content_hash'][:16]}"


def compare_readings(expected: dict[str, dict[str, Any]], actual: dict[str, dict[str, Any]], step: str) -> None:
    """Every partition of ``actual`` carries the ``expected`` readings (VerificationError naming
    the first that does not, with both readings)."""
    for label, want in expected.items():
        if actual[label] != want:
            raise VerificationError(label, step, short_readings(want), short_readings(actual[label]))


def target_readings(conn: psycopg.Connection, ctx: Context, labels: list[str]) -> dict[str, dict[str, Any]]:
    """The target's readings of partitions ``labels`` of the context, in the caller's
    transaction (the same readings a plan records for its stages)."""
    target = ctx.engine.open(conn, conn, None, ctx)  # read only: no lock, no control store
    try:
        return target.readings(labels)
    finally:
        target.close()  # a lake target's catalog connections
