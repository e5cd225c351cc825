"""What the core's results look like in Dagster: materializations and check evaluations.

The asset bodies call the core; these functions map what it returns onto per-partition
events, so the UI shows per-partition metadata, plots and checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import dagster as dg

from backfill_assets.core.audit import AuditResult, PartitionAudit
from backfill_assets.core.coverage import utc_text
from backfill_assets.core.errors import ApprovalOutdatedError, BackfillError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.planning import differing_keys_prefix
from backfill_assets.core.preview import Preview, Waiting
from backfill_assets.core.spec import ParallelSpec
from backfill_assets.core.store.plan_document import PartitionEntry, Plan
from backfill_assets.dagster_layer.names import Keys, approve_link, checks_link, partition_link
from backfill_assets.render import plan_markdown

KEY_CHECK = "business_key_unique_and_not_null"
MATCH_CHECK = "stages_match"
TARGET_CHECK = "target_matches_approved_plan"
PREVIEW_CHECK = "target_change_preview"
AUDIT_CHECK = "target_still_verified"


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
    """The step's result (the whole snapshot), then one materialization per partition; each
    names the pins of the spec's other inputs, where it has some."""
    pins = getattr(snap, "inputs", None)
    inputs = {} if not pins else {"inputs": dg.MetadataValue.json(
        {p["name"]: {k: v for k, v in p.items() if k != "name" and v is not None} for p in pins})}
    yield dg.MaterializeResult(asset_key=keys.snapshot, metadata={
        "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
        "partitions": ", ".join(snap.partitions), **inputs})
    for label, readings in snap.partitions.items():
        if parts.has_partition_key(label):
            yield dg.AssetMaterialization(keys.snapshot, partition=label, metadata={
                "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
                "mode": snap.mode, "source_rows": readings["row_count"],
                "source_hash": readings["content_hash"],
                "requested": label in snap.requested, **inputs,
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


def _first_keys(first: list[dict[str, Any]]) -> str:
    """The first differing keys, one line: each key, its change and the columns that differ
    (no values)."""
    if not first:
        return "none: replacing this partition changes no row"
    out = []
    for e in first:
        key = ", ".join(f"{k}={'NULL' if v is None else v}" for k, v in e["key"].items())
        columns = f" in {', '.join(e['columns'])}" if e["columns"] else ""
        out.append(f"{_printable(key)}: {e['kind']}{columns}")
    return "; ".join(out)


def _printable(text: str) -> str:
    """Text with control characters shown as ``?``, at most 200 characters."""
    return "".join(c if c.isprintable() else "?" for c in text)[:200]


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return (_printable(text).replace("|", "\\|").replace("`", "'")
            .replace("[", "\\[").replace("]", "\\]"))


def preview_checks(keys: Keys, parts: dg.PartitionsDefinition, preview: Preview) -> Iterator[dg.AssetCheckEvaluation]:
    """The change preview of each partition of a ready plan: what replacing the target with
    stage A changes, the first differing keys, and the link that approves exactly this preview
    (every partition of the plan, named where some lie outside the Dagster partitions)."""
    checked = preview.checked
    link = approve_link(checked.spec.name, checked.plan_id, preview.review_id)
    outside = [label for label in checked.stored.labels if not parts.has_partition_key(label)]
    for label in checked.stored.labels:
        if not parts.has_partition_key(label):
            continue
        changes = (checked.changes or {}).get(label)
        counts = ({k: changes[k] for k in ("added", "removed", "changed", "unchanged")} if changes
                  else {"changes": "not read (the comparison timed out); the approval still records the target"})
        since = ({"target_changed_since": f"the target changed since the previous preview "
                                          f"({utc_text(preview.previous_at)}); this one shows it as it is now"}
                 if label in preview.changed_since and preview.previous_at else {})
        yield dg.AssetCheckEvaluation(
            asset_key=keys.stage_a, check_name=PREVIEW_CHECK, passed=True, partition=label,
            severity=dg.AssetCheckSeverity.WARN, blocking=False,
            metadata={
                **counts,
                "first_keys": _first_keys(changes.get("first", [])) if changes else "not read",
                "approve": dg.MetadataValue.url(link),
                "plan_id": checked.plan_id, "review_id": preview.review_id,
                "plan_partitions": len(checked.stored.labels),
                **({"also_outside_these_partitions": ", ".join(outside)} if outside else {}),
                "previewed_at": utc_text(preview.made_at), "target_content_hash": checked.target[label]["content_hash"],
                **since,
            },
        )


def no_preview(keys: Keys, labels: Iterable[str], reason: str, **context: str) -> Iterator[dg.AssetCheckEvaluation]:
    """A failed (warning) preview where none could be made: the plan cannot be approved now."""
    for label in labels:
        yield dg.AssetCheckEvaluation(
            asset_key=keys.stage_a, check_name=PREVIEW_CHECK, passed=False, partition=label,
            severity=dg.AssetCheckSeverity.WARN, blocking=False, metadata={"reason": reason, **context},
        )


def stale_preview(keys: Keys, label: str, plan_id: str, review_id: str, previewed_at: Any) -> dg.AssetCheckEvaluation:
    """The preview of ``label`` is out of date: a run replaced the target partition after it."""
    return dg.AssetCheckEvaluation(
        asset_key=keys.stage_a, check_name=PREVIEW_CHECK, passed=False, partition=label,
        severity=dg.AssetCheckSeverity.WARN, blocking=False,
        metadata={"stale": True, "plan_id": plan_id, "review_id": review_id, "previewed_at": utc_text(previewed_at),
                  "reason": "a run replaced this target partition after the preview was made: it is no longer "
                            "what approving would change, and its approve link is refused. Evaluate this check "
                            "again (or build the stages again) for a current preview"},
    )


def _age(now: Any, then: Any) -> str:
    minutes = max(0, int((now - then).total_seconds() // 60))
    days, rest = divmod(minutes, 1440)
    hours, mins = divmod(rest, 60)
    return f"{days} d {hours} h" if days else f"{hours} h {mins} min" if hours else f"{mins} min"


def board_markdown(keys: Keys, found: Waiting, now: Any) -> str:
    """The plans waiting for an approval and the approvals not yet applied, with their age."""
    spec_checks = checks_link(keys.stage_a)
    out = [f"#### Plans ready, not approved ({len(found.plans)})"]
    if found.plans:
        out += ["| plan | partitions | waiting | preview | |", "|---|---|---|---|---|"]
        for p in found.plans:
            if p.review_id is None:
                preview, action = "none yet", f"[preview]({spec_checks})"
            elif p.stale:
                preview = f"**stale** in {_cell(', '.join(p.stale[:3]))}{' …' if len(p.stale) > 3 else ''}"
                action = f"[look again]({spec_checks})"
            else:
                totals = {k: sum(c[k] for c in (p.changes or {}).values()) for k in ("added", "removed", "changed")}
                preview = (f"+{totals['added']} −{totals['removed']} ~{totals['changed']} keys, "
                           f"made {_age(now, p.previewed_at)} ago")
                action = f"[approve]({approve_link(keys.stage_a.path[0], p.plan_id, p.review_id)})"
            parts = _cell(p.partitions[0] if len(p.partitions) == 1
                          else f"{p.partitions[0]} to {p.partitions[-1]} ({len(p.partitions)})")
            out.append(f"| `{p.plan_id[:12]}` | {parts} | {_age(now, p.created_at)} | {preview} | {action} |")
    out.append(f"\n#### Approved, not yet applied ({len(found.approvals)})")
    if found.approvals:
        out += ["| approval | plan | by | waiting | verified | |", "|---|---|---|---|---|---|"]
        for a in found.approvals:
            state = "expired: approve again" if a.expired else "waiting for its runs"
            out.append(f"| {a.approval_id} | `{a.plan_id[:12]}` | {_cell(a.approved_by)} | {_age(now, a.approved_at)} "
                       f"| {len(a.verified)} of {len(a.partitions)} | {state} |")
    return "\n".join(out)


def _drift_markdown(p: PartitionAudit) -> str:
    keys = (p.changes or {}).get("keys")
    if not keys:
        return (p.changes or {}).get("why") or "the keys cannot be named"
    lines = [f"{keys['added']} row(s) added, {keys['removed']} removed, {keys['changed']} changed since the "
             "verification", "", "| key | what | columns |", "|---|---|---|"]
    for e in (p.changes or {}).get("first", []):
        key = ", ".join(f"{k}={v}" for k, v in e["key"].items())
        lines.append(f"| {_cell(key)} | {e['kind']} | {_cell(', '.join(e['columns']) if e['kind'] == 'changed' else '')} |")
    return "\n".join(lines)


def audit_events(keys: Keys, parts: dg.PartitionsDefinition, result: AuditResult) -> Iterator[Any]:
    """The audit of some partitions: per partition, the ``target_still_verified`` check (a
    drifted partition fails it with what changed, since when, and the link that plans it again;
    one never verified is a warning); then one observation of the target with the audit's
    counts, which the asset's plots show over time."""
    for p in result.partitions:
        if not parts.has_partition_key(p.partition):
            continue
        metadata: dict[str, Any] = {"result": p.result, "seen_by": p.signal, "audit_id": result.audit_id,
                                    "audited_at": utc_text(result.audited_at)}
        if p.verified is not None:
            metadata.update({"verified_run": p.verified["run_id"], "plan_id": p.verified["plan_id"],
                             "rows_verified": p.verified["row_count"], "verified_hash": p.verified["content_hash"]})
        if p.now is not None:
            metadata.update({"rows_now": p.now["row_count"], "hash_now": p.now["content_hash"]})
        since = p.since or {}
        if since.get("last_seen_holding") is not None:
            metadata["last_seen_holding"] = utc_text(since["last_seen_holding"])
        if p.result == "drifted":
            metadata.update({"changes": dg.MetadataValue.md(_drift_markdown(p)),
                             "plan_again": dg.MetadataValue.url(partition_link(keys.stage_a, p.partition))})
            if p.note:
                metadata["note"] = p.note
        yield dg.AssetCheckEvaluation(
            asset_key=keys.target, check_name=AUDIT_CHECK, passed=p.result == "holds", partition=p.partition,
            severity=dg.AssetCheckSeverity.ERROR if p.result == "drifted" else dg.AssetCheckSeverity.WARN,
            metadata=metadata,
        )
    counts = result.counts()
    yield dg.AssetObservation(keys.target, metadata={
        "audit/holds": counts["holds"], "audit/drifted": counts["drifted"],
        "audit/never_verified": counts["never verified"],
        "audit/fingerprinted": sum(1 for p in result.partitions if p.signal == "fingerprint"),
        "audit_id": result.audit_id, "audited_at": utc_text(result.audited_at)})


def drifted_markdown(keys: Keys, drifted: list[dict[str, Any]]) -> str:
    """The board's list of the partitions the newest audit of each found drifted."""
    out = [f"\n#### Drifted since verified ({len(drifted)})"]
    if drifted:
        out += ["| partition | audited | |", "|---|---|---|"]
        for d in drifted:
            out.append(f"| {_cell(d['partition'])} | {utc_text(d['audited_at'])} "
                       f"| [plan again]({partition_link(keys.stage_a, d['partition'])}) |")
    return "\n".join(out)


def just_verified(keys: Keys, parts: dg.PartitionsDefinition, results: list[dict[str, Any]],
                  plan_id: str | None) -> Iterator[dg.AssetCheckEvaluation]:
    """The audit check of the partitions a run of the target just verified: they hold what
    their verification read back (no audit is recorded; the next audit reads them)."""
    for r in results:
        if r["status"] in ("verified", "skipped-already-verified") and parts.has_partition_key(r["partition"]):
            yield dg.AssetCheckEvaluation(
                asset_key=keys.target, check_name=AUDIT_CHECK, passed=True, partition=r["partition"],
                metadata={"result": "holds", "seen_by": "apply's verification", "plan_id": plan_id or "none",
                          "rows_verified": r["row_count"], "verified_hash": r["content_hash"]})

