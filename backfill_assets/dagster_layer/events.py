"""What the core's results look like in Dagster: materializations and check evaluations.

The asset bodies call the core; these functions map what it returns onto per-partition
events, so the UI shows per-partition metadata, plots and checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg

from backfill_assets.core.errors import ApprovalOutdatedError, BackfillError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.plan import differing_keys_prefix
from backfill_assets.core.spec import ParallelSpec
from backfill_assets.core.store.plan_document import PartitionEntry, Plan
from backfill_assets.dagster_layer.names import Keys
from backfill_assets.render import plan_markdown

KEY_CHECK = "business_key_unique_and_not_null"
MATCH_CHECK = "stages_match"
TARGET_CHECK = "target_matches_approved_plan"


def readings_metadata(fp: dict[str, Any] | Fingerprint) -> dict[str, Any]:
    r = fp.as_dict() if isinstance(fp, Fingerprint) else fp
    return {
        "dagster/row_count": r["row_count"],
        "null_key_count": r["null_key_count"],
        "duplicate_key_count": r["duplicate_key_count"],
        # A float to plot across partitions; the exact decimal as text.
        "total": float(r["total"]) if r["total"] is not None else None,
        "total_exact": r["total"],
        "content_hash": r["content_hash"],
    }


def table_schema(columns: Iterable[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, type_name) for name, type_name in columns])


def key_check(key: dg.AssetKey, partition: str, fp: Fingerprint, **context: str) -> dg.AssetCheckEvaluation:
    """The key check of one stage partition; ``context`` names the plan, so the dashboard
    leads to the approval."""
    ok = fp.null_key_count == 0 and fp.duplicate_key_count == 0
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name=KEY_CHECK, passed=ok, partition=partition,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"null_key_count": fp.null_key_count, "duplicate_key_count": fp.duplicate_key_count, **context},
    )


def _side_by_side(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = ["| reading | stage A | stage B |", "|---|---|---|"]
    for k in a:
        mark = "" if a[k] == b[k] else " **differs**"
        rows.append(f"| {k} | `{a[k]}` | `{b[k]}`{mark} |")
    return "\n".join(rows)


def stages_match(keys: Keys, partition: str, passed: bool, a: dict[str, Any], b: dict[str, Any],
                 **metadata: Any) -> dg.AssetCheckEvaluation:
    """The blocking check of one partition: stages A and B agree on every reading."""
    return dg.AssetCheckEvaluation(
        asset_key=keys.stage_b, check_name=MATCH_CHECK, passed=passed, partition=partition,
        severity=dg.AssetCheckSeverity.ERROR, blocking=True,
        metadata={**metadata, "readings": dg.MetadataValue.md(_side_by_side(a, b))},
    )


def snapshot_events(keys: Keys, parts: dg.PartitionsDefinition, snap: Any) -> Iterator[Any]:
    """The step's result (the whole snapshot), then one materialization per partition."""
    yield dg.MaterializeResult(asset_key=keys.snapshot, metadata={
        "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
        "partitions": ", ".join(snap.partitions)})
    for label, readings in snap.partitions.items():
        if parts.has_partition_key(label):
            yield dg.AssetMaterialization(keys.snapshot, partition=label, metadata={
                "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
                "mode": snap.mode, "source_rows": readings["row_count"],
                "source_hash": readings["content_hash"],
                "requested": label in snap.requested,
            })


def _entries(parts: dg.PartitionsDefinition, plan: Plan) -> list[PartitionEntry]:
    return [e for e in plan.document.partitions if parts.has_partition_key(e.partition)]


def stage_checks(keys: Keys, parts: dg.PartitionsDefinition, plan: Plan,
                 built_a: dict[str, Fingerprint], built_b: dict[str, Fingerprint],
                 parallel: ParallelSpec | None = None) -> list[dg.AssetCheckEvaluation]:
    """Per partition: the key checks of both stages and the blocking stages_match."""
    table = dg.MetadataValue.md(plan_markdown(plan.document, plan.plan_id, parallel))
    return [
        evaluation for entry in _entries(parts, plan) for evaluation in (
            key_check(keys.stage_a, entry.partition, built_a[entry.partition], plan_id=plan.plan_id),
            key_check(keys.stage_b, entry.partition, built_b[entry.partition], plan_id=plan.plan_id),
            stages_match(keys, entry.partition, entry.match, entry.stage_a.as_dict(), entry.stage_b.as_dict(),
                         plan_id=plan.plan_id, plan=table, **_differing_keys(plan, entry.partition)),
        )
    ]


def _differing_keys(plan: Plan, partition: str) -> dict[str, str]:
    """The refused plan's problem naming the partition's first differing keys, if any."""
    prefix = differing_keys_prefix(partition)
    found = [p for p in plan.problems if p.startswith(prefix)]
    return {"differing_keys": found[0]} if found else {}


def stage_materializations(keys: Keys, parts: dg.PartitionsDefinition, snapshot_id: str,
                           columns: Iterable[tuple[str, str]], plan: Plan,
                           parallel: ParallelSpec | None = None) -> Iterator[Any]:
    """The step's results (the whole plan), then both stages' readings per partition."""
    table = dg.MetadataValue.md(plan_markdown(plan.document, plan.plan_id, parallel))
    schema = table_schema(columns)
    common = {"snapshot_id": snapshot_id, "plan_id": plan.plan_id, "plan_status": plan.status}
    yield dg.MaterializeResult(asset_key=keys.stage_a, metadata=common)
    yield dg.MaterializeResult(asset_key=keys.stage_b, metadata={**common, "plan": table})
    for entry in _entries(parts, plan):
        for key, readings in ((keys.stage_a, entry.stage_a), (keys.stage_b, entry.stage_b)):
            yield dg.AssetMaterialization(key, partition=entry.partition, metadata={
                **readings_metadata(readings), **common, "plan": table, "dagster/column_schema": schema,
            })


def stage_checks_as_they_are(keys: Keys, found: Iterable[Any], wanted: set[dg.AssetCheckKey]) -> Iterator[Any]:
    """The selected stage checks, evaluated on the stages as they are (core.plan.read_stages)."""
    for state in found:
        about = {"plan_id": state.plan_id or "none", "checked": "the stages as they are, without building"}
        for key, fp in ((keys.stage_a, state.a), (keys.stage_b, state.b)):
            if dg.AssetCheckKey(key, KEY_CHECK) in wanted:
                yield key_check(key, state.partition, fp, **about)
        if dg.AssetCheckKey(keys.stage_b, MATCH_CHECK) in wanted:
            yield stages_match(keys, state.partition, state.match, state.a.as_dict(), state.b.as_dict(),
                               **about, **({"problems": "; ".join(state.problems)} if state.problems else {}))


def target_events(keys: Keys, parts: dg.PartitionsDefinition, labels: list[str], results: list[dict[str, Any]],
                  plan_id: str | None, error: BackfillError | None = None) -> Iterator[Any]:
    """A materialization and a passing check per replaced partition; with ``error``, a failing
    check for each partition it stopped (an approval that no longer covers a partition says
    why, per partition)."""
    for r in results:
        if not parts.has_partition_key(r["partition"]):
            continue
        meta = {**readings_metadata(r), "status": r["status"], "plan_id": plan_id,
                # A lake table's version (Delta) or snapshot id (Iceberg) that was committed
                # and verified.
                **({"table_version": r["target_version"]} if r.get("target_version") else {})}
        yield dg.AssetMaterialization(keys.target, partition=r["partition"], metadata=meta)
        yield dg.AssetCheckEvaluation(
            asset_key=keys.target, check_name=TARGET_CHECK, passed=True,
            partition=r["partition"], metadata={"plan_id": plan_id, "status": r["status"]},
        )
    if error is None:
        return
    done = {r["partition"] for r in results}
    failed = [getattr(error, "partition", None)] if isinstance(error, VerificationError) else [
        label for label in labels if label not in done]
    reasons = error.reasons if isinstance(error, ApprovalOutdatedError) else {}
    for label in failed:
        reason = reasons.get(label)
        yield dg.AssetCheckEvaluation(
            asset_key=keys.target, check_name=TARGET_CHECK, passed=False,
            partition=label, severity=dg.AssetCheckSeverity.ERROR,
            metadata={"plan_id": plan_id or "none", "error": str(error),
                      **({"reason": reason} if reason else {})},
        )
