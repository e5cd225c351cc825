"""The ``diff`` step: which keys and columns a plan's replacement changes, per partition, the
approved stage (stage A) against the target or against stage B, as the spec's build engine
compares them (exactly, on the canonical text forms the fingerprint hashes: docs/fingerprint.md).
Read-only on the tables."""

from __future__ import annotations

from backfill_assets.core.build import open_build_engine, refuse_unless_supported
from backfill_assets.core.differences import DEFAULT_LIMIT, Against, DiffResult
from backfill_assets.core.errors import SpecError
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest


def diff_plan(spec: Spec, plan_ref: str, factory: ConnectionFactory, *, against: Against = "target",
              request: PartitionRequest | None = None, limit: int = DEFAULT_LIMIT) -> DiffResult:
    """The plan's approved stage (stage A) against the target, or against stage B, per partition.

    Raises:
        SpecError: a partition not in the plan; a negative limit.
        ApprovalError: no such plan, or stage A no longer holds the plan's rows (plan again).
    """
    refuse_unless_supported(spec, "diff")
    if limit < 0:
        raise SpecError("--limit must be 0 or more")
    with factory() as conn:
        with factory.control(conn) as control:
            stored = find_plan(control, spec, plan_ref)
        with open_build_engine(conn, factory, spec) as engine:
            ctx = engine.resolve(stored.labels)
            wanted = stored.labels if request is None else ctx.labels_of(request)
            missing = [label for label in wanted if label not in stored.labels]
            if missing:
                raise SpecError(f"partition(s) {', '.join(missing)} are not in plan {stored.plan_id[:16]}")
            parts = engine.diff(ctx, stored, wanted, against, limit)
    return DiffResult(stored.plan_id, against, parts)
