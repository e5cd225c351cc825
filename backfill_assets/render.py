"""Text and markdown views of plans, profiles, runs and the ledger (shared by the CLI and
the Dagster layer)."""

from __future__ import annotations

from typing import Any

from backfill_assets.core.apply import ApplyResult
from backfill_assets.core.approve import Review
from backfill_assets.core.audit import AuditResult
from backfill_assets.core.coverage import OpenApproval, short_list, utc_text
from backfill_assets.core.differences import DiffResult
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.profile.propose import Profile
from backfill_assets.core.spec import ParallelSpec
from backfill_assets.core.store.plan_document import InputPin, Plan, PlanDocument


def _readings_cells(fp: Fingerprint) -> str:
    return f"{fp.row_count:>7} {fp.total if fp.total is not None else '-':>14}  {fp.content_hash[:16]}.."


def parallel_note(parallel: ParallelSpec) -> str:
    """What a spec's ``parallel`` means for this plan, said wherever a plan is shown."""
    return (
        f"multi-run: a Dagster backfill runs as runs of at most {parallel.max_partitions_per_run} "
        f"partition(s), up to {parallel.max_concurrent_builds} building the stages at once, and the "
        "target's runs one at a time. Apply stops launching new partitions after the first failure: "
        "a run of an approval refuses to start while a partition an earlier run of it failed is "
        "not verified since."
    )


def _read_of(pin: InputPin) -> str:
    """What a plan read of an input: all of it, or its partitions' rows by its own column."""
    copied = "" if pin.copied_to is None else f", copied to {pin.copied_to}"
    if pin.partition_key is None:
        return f"read whole{copied}"
    wider = "".join(f", {name} {value}" for name, value in (("before", pin.before), ("after", pin.after)) if value)
    return f"the plan's partitions by {pin.partition_key}{wider}{copied}"


def render_plan(plan: Plan, parallel: ParallelSpec | None = None) -> str:
    """The plan as text; with the spec's ``parallel``, what multi-run means for applying it."""
    w = _width(plan.document.labels)
    doc, snap = plan.document, plan.document.snapshot
    lines = [
        f"plan {plan.plan_id}",
        f"  status:            {plan.status}",
        f"  target:            {doc.target} (plan does not write to it){_creates(doc)}",
        f"  source:            {doc.source}",
        f"  snapshot:          {snap.id} ({snap.mode}, "
        + ("" if snap.version is None else f"version {snap.version[:16]}, ")
        + f"fingerprint {snap.fingerprint[:16]}...)",
        *[f"  input {i.name + ':':<12} {i.table}, {_read_of(i)}: {i.row_count} rows, hash {i.content_hash[:16]}"
          for i in snap.inputs or ()],
        f"  transform version: {doc.transform_version}",
        "",
        f"  {'partition':<{w}} {'A=B':<4} {'rows':>7} {'total':>14}  {'content hash':<18} "
        f"{'read':>6} {'null key':>8} {'collapsed':>9}",
    ]
    for p in doc.partitions:
        src = p.source
        lines.append(
            f"  {p.partition:<{w}} {'yes' if p.match else 'NO':<4} {_readings_cells(p.stage_a)} "
            f"{src.rows_read:>6} {src.null_key_rows_dropped:>8} {src.duplicates_collapsed:>9}"
        )
        if not p.match:
            lines.append(f"  {'  stage B':<{w}} {'':<4} {_readings_cells(p.stage_b)}")
    for added in doc.added_partitions:
        lines.append(f"  added {added.partition}: " + "; ".join(added.reasons))
    for group in doc.replace_groups:
        if len(group) > 1:
            lines.append(f"  replaced together (a key moves between them): {', '.join(group)}")
    if plan.problems:
        lines += ["", "  problems:"] + [f"    - {p}" for p in plan.problems]
    if parallel is not None:
        lines += ["", f"  {parallel_note(parallel)}"]
    return "\n".join(lines)


def render_profile(profile: Profile) -> str:
    lines = [
        f"profile of {profile.table}: {profile.row_count} row(s) in {len(profile.partitions)} partition(s)",
        f"  {'column':<24} {'type':<28} {'nulls':>7} {'distinct/partition':>19}",
    ]
    for c in profile.columns:
        lines.append(f"  {c.name:<24} {c.type_name:<28} {c.null_count:>7} {c.distinct_per_partition:>19}")
    lines += ["", f"  business key: {profile.business_key or 'none proposed'}", f"    {profile.key_reason}"]
    shown = profile.notable_candidates()
    if shown:
        sample = (f", measured on the first {profile.key_partitions} partition(s), {profile.key_rows} row(s)"
                  if profile.key_partitions < len(profile.partitions) else "")
        lines.append(f"  key candidates (groups per partition{sample}; versions: groups whose rows differ "
                     "beyond row ids):")
    for cand in shown:
        label = "PROPOSED" if list(cand.columns) == profile.business_key else "safe" if cand.safe else "unsafe"
        nulls = f", {cand.null_key_rows} NULL-key row(s)" if cand.null_key_rows else ""
        lines.append(f"    {label:<8} [{', '.join(cand.columns)}]: {cand.groups} group(s), {cand.version_groups} "
                     f"with versions, {cand.multi_row_groups - cand.version_groups} with copies only{nulls}")
        lines += [f"      + {e}" for e in cand.evidence_for] + [f"      - {e}" for e in cand.evidence_against]
    if len(profile.key_candidates) > len(shown):
        lines.append(f"    ({len(profile.key_candidates) - len(shown)} more candidate(s) in profile --json)")
    if profile.orderings:
        lines.append("  orderings tried (newest first):")
        for t in profile.orderings:
            verdict = "total" if t.total else f"{t.tied_keys} tied key(s), {t.null_count} NULL(s)"
            lines.append(f"    {', '.join(t.columns):<40} {verdict}")
    lines.append(f"  ordering: {profile.ordering_reason}")
    if profile.business_key and profile.ordering:
        lines += ["", "  proposed spec lines:", f"    business_key: [{', '.join(profile.business_key)}]", "    ordering:"]
        lines += [f"      - {{column: {c}, direction: desc}}" for c in profile.ordering]
    return "\n".join(lines)


def _creates(doc: PlanDocument) -> str:
    if not doc.creates_target:
        return ""
    schema = ", ".join(f"{name} {kind}" for name, kind in doc.target_table_columns)
    return f"\n  creates the table: it does not exist; apply creates it, {_partitioned(doc)}: {schema}"


def _partitioned(doc: PlanDocument) -> str:
    """How a lake table apply creates is partitioned, in words."""
    if doc.target_partitioned_by is None:
        return f"partitioned by {doc.partition_key}"
    if not doc.target_partitioned_by:
        return f"not partitioned (each window is a range of {doc.partition_key})"
    return f"partitioned by {', '.join(doc.target_partitioned_by)}"


def render_replacement(doc: PlanDocument) -> str:
    labels = doc.labels
    created = f"Approving will CREATE {doc.target} (empty, {_partitioned(doc)}), then " \
        if doc.creates_target else "Approving will "
    entries = doc.partitions
    spans = ""
    if doc.partition_window is not None and entries:  # the instants the labels name
        first, last = entries[0], entries[-1]
        cron = doc.partition_window.get("cron")
        starting = f" (cron {cron})" if cron else ""
        spans = (f" They are {doc.partition_window['every']} windows{starting} of {doc.partition_key} in "
                 f"{doc.partition_window['time_zone']}, from {first.start} to {last.end} (UTC, the end excluded)"
                 f"{', with gaps' if len(entries) > 1 and any(a.end != b.start for a, b in zip(entries, entries[1:])) else ''}.")
    return (
        f"{created}{'REPLACE' if not doc.creates_target else 'fill'} {len(labels)} partition(s) of {doc.target} "
        f"({', '.join(labels)}) with the stage rows fingerprinted above: every existing row of "
        f"those partitions is deleted. No other partition is touched.{spans}"
    )


def render_apply(result: ApplyResult) -> str:
    w = _width([p["partition"] for p in result.partitions])
    lines = [f"run {result.run_id} of plan {result.plan_id[:16]} (approval {result.approval_id})"]
    for p in result.partitions:
        lines.append(f"  {p['partition']:<{w}} {p['status']:<26} {p['row_count']:>7} "
                     f"{p['total'] if p['total'] is not None else '-':>14}  {p['content_hash'][:16]}..")
    return "\n".join(lines)


def render_status(rows: list[dict[str, Any]]) -> str:
    w = _width([r["partition"] for r in rows])
    if not rows:
        return "no runs recorded yet"
    lines = [f"  {'partition':<{w}} {'status':<26} {'rows':>7} {'total':>14}  {'hash':<18} run"]
    for r in rows:
        lines.append(
            f"  {r['partition']:<{w}} {r['status']:<26} {r['row_count'] if r['row_count'] is not None else '-':>7} "
            f"{r['total'] if r['total'] is not None else '-':>14}  {(r['content_hash'] or '')[:16]}.. {r['run_id'][:12]}"
        )
        if r["error"]:
            lines.append(f"  {'':<{w}} error: {r['error']}")
        if r.get("audit"):
            seen = r.get("last_seen_holding")
            lines.append(f"  {'':<{w}} audit {_when(r['audited_at'])}: {r['audit']}"
                         + (f"; last seen holding {_when(seen)}" if seen and r["audit"] != "holds" else ""))
    return "\n".join(lines)


def render_target_now(doc: PlanDocument, target: dict[str, dict[str, Any]],
                      changes: dict[str, dict[str, int]] | None = None) -> str:
    """The target as it is now, which an approval records it is given against, and (where
    known) what replacing each partition changes: keys added, removed, changed, unchanged."""
    w = _width(doc.labels)
    lines = [
        "The target now (the approval records this; apply refuses a partition whose target "
        "changes before it is replaced)" + (", and what the replacement changes in it:" if changes else ":"),
        f"  {'partition':<{w}} {'rows':>7} {'total':>14}  {'content hash':<18} "
        + (f"{'added':>7} {'removed':>7} {'changed':>7} {'unchanged':>9}" if changes else ""),
    ]
    for p in doc.partitions:
        now = Fingerprint(**target[p.partition])
        same = "  (already as planned)" if now == p.stage_a else ""
        counts = ""
        if changes:
            c = changes[p.partition]
            counts = f" {c['added']:>7} {c['removed']:>7} {c['changed']:>7} {c['unchanged']:>9}"
        lines.append(f"  {p.partition:<{w}} {_readings_cells(now)}{counts}{same}")
    return "\n".join(lines)


def render_approvals(approvals: list[OpenApproval]) -> str:
    """Open approvals and, per partition, whether each still covers it and why not; then the
    expired ones, with what their runs verified."""
    w = _width([c.partition for a in approvals for c in a.partitions])
    opened = [a for a in approvals if not a.expired]
    expired = [a for a in approvals if a.expired]
    lines = ["open approvals (not yet verified in every partition by a run of that approval):"
             if opened else "no open approvals"]
    for a in opened:
        ap = a.approval
        lines.append(f"  approval {ap.approval_id} of plan {ap.plan_id[:16]} by {ap.approved_by} "
                     f"at {ap.approved_at.isoformat(timespec='seconds')}"
                     + ("" if a.expires_at is None else f", expires at {utc_text(a.expires_at)}"))
        if a.problem is not None:
            lines.append(f"    covers nothing: {a.problem}")
            continue
        for c in a.partitions:
            verdict = {"unchanged": "covered", "applied": "done"}.get(c.state, "NOT covered")
            lines.append(f"    {c.partition:<{w}} {verdict:<{w}} {c.reason}")
    if expired:
        lines += ["", "expired approvals (older than approval_expires_after; apply refuses them: review the plan "
                      "and approve the plan again):"]
    for a in expired:
        ap = a.approval
        done = list(a.verified)
        assert a.expires_at is not None
        lines.append(f"  approval {ap.approval_id} of plan {ap.plan_id[:16]} by {ap.approved_by} "
                     f"at {ap.approved_at.isoformat(timespec='seconds')}: expired at {utc_text(a.expires_at)}")
        lines.append(f"    its runs verified {len(done)} of {len(a.partitions)} partition(s)"
                     + (f": {short_list(done)}" if done else ""))
    return "\n".join(lines)


def plan_markdown(doc: PlanDocument, plan_id: str, parallel: ParallelSpec | None = None) -> str:
    """A markdown table of a plan: what an approver approves (and, with the spec's
    ``parallel``, what multi-run means for applying it)."""
    snap = doc.snapshot
    lines = [
        f"**plan** `{plan_id}`  ",
        f"target `{doc.target}`{' (apply creates it)' if doc.creates_target else ''}, snapshot `{snap.id}`, "
        f"transform `{doc.transform_version}`",
        "",
        "| partition | A = B | rows | total | content hash |",
        "|---|---|---:|---:|---|",
    ]
    for p in doc.partitions:
        a = p.stage_a
        lines.append(
            f"| {p.partition} | {'yes' if p.match else '**no**'} | {a.row_count} | "
            f"{a.total if a.total is not None else '-'} | `{a.content_hash}` |"
        )
    for added in doc.added_partitions:
        lines.append(f"\nadded {added.partition}: " + "; ".join(added.reasons))
    if parallel is not None:
        lines.append(f"\n{parallel_note(parallel)}")
    return "\n".join(lines)


def render_review(checked: Review, parallel: ParallelSpec | None = None) -> str:
    """What a person approves: the plan, the target as it is now, and what will be replaced."""
    plan = checked.stored
    return "\n\n".join([
        render_plan(plan, parallel), render_target_now(plan.document, checked.target, checked.changes),
        render_replacement(plan.document),
    ])


def render_diff(result: DiffResult) -> str:
    """Per partition, what replacing it with the approved stage changes, and example keys."""
    w = _width([p.partition for p in result.partitions])
    other = "the target" if result.against == "target" else "stage B"
    lines = [f"plan {result.plan_id[:16]}: the approved stage (A) against {other}",
             f"  {'partition':<{w}} {'added':>8} {'removed':>8} {'changed':>8} {'unchanged':>10}"]
    for p in result.partitions:
        lines.append(f"  {p.partition:<{w}} {p.added:>8} {p.removed:>8} {p.changed:>8} {p.unchanged:>10}")
        for e in p.examples:
            key = ", ".join(f"{k}={v}" for k, v in e.key.items())
            lines.append(f"    {e.kind:<8} ({key})")
            if e.kind == "changed":
                lines += [f"      {c}: {e.values[c][0]!r} -> {e.values[c][1]!r}" for c in e.columns]
    return "\n".join(lines)


def _width(labels: list[str]) -> int:
    """The partition column's width: 12, or the longest label (an hour window's is 22)."""
    return max([12, *map(len, labels)])


def _when(value: object) -> str:
    return value.isoformat(timespec="seconds") if hasattr(value, "isoformat") else str(value)


def render_audit(result: AuditResult) -> str:
    """Per partition: holds, drifted or never verified, how it was seen, and for a drifted one
    what changed (keys and column names only) and since when it may have."""
    w = _width([p.partition for p in result.partitions])
    counts = result.counts()
    lines = [f"audit {result.audit_id[:16]} of {result.target}: {counts['holds']} hold, {counts['drifted']} drifted, "
             f"{counts['never verified']} never verified",
             f"  {'partition':<{w}} {'result':<15} {'seen by':<26} {'rows verified':>13} {'rows now':>9}"]
    for p in result.partitions:
        verified = "" if p.verified is None else str(p.verified["row_count"])
        now = "" if p.now is None else str(p.now["row_count"])
        lines.append(f"  {p.partition:<{w}} {p.result:<15} {p.signal:<26} {verified:>13} {now:>9}")
        if p.result != "drifted":
            continue
        keys = (p.changes or {}).get("keys")
        if keys:
            lines.append(f"    since the verification: {keys['added']} row(s) added, {keys['removed']} removed, "
                         f"{keys['changed']} changed")
            for e in (p.changes or {}).get("first", []):
                key = ", ".join(f"{k}={v}" for k, v in e["key"].items())
                what = f" in {', '.join(e['columns'])}" if e["columns"] else ""
                lines.append(f"      {e['kind']:<8} ({key}){what}")
        elif p.changes is not None:
            lines.append(f"    {p.changes.get('why') or 'the keys cannot be named'}")
        since = p.since or {}
        if since.get("commits_since_verified"):
            lines.append(f"    touched by version(s) {', '.join(since['commits_since_verified'])} since the verified one")
        if "last_seen_holding" in since:
            lines.append(f"    last seen holding {_when(since['last_seen_holding'])}")
        elif "verified_at" in since:
            lines.append(f"    verified {_when(since['verified_at'])}, not seen holding since")
        if p.note:
            lines.append(f"    {p.note}")
    if counts["drifted"]:
        lines.append("a drifted partition is planned again like any other: plan --partitions "
                     + ",".join(p.partition for p in result.drifted))
    return "\n".join(lines)

