"""The ``audit`` step: is each partition the ledger says was verified still what was verified?

A verified partition is true at the moment of its re-read. Afterwards a hand fix, an ETL job
appending to an old day, a compaction or a retention job may change it. For each partition of
a spec's target the audit compares the target now with the newest verified ledger row
(row count, total, content hash) and says ``holds``, ``drifted`` or ``never verified``.

Cheap first, exact when needed (docs/reliability.md, "Watching a target after the backfill"):

1. **The signal**: the target says, from metadata only, what each partition is made of
   (core.context.Signals: a lake's data files in its log or manifests, a folder's file
   listing, PostgreSQL's write counters of the table). A partition whose signal equals its
   baseline holds without a row being read. The baseline is the signal a previous audit
   recorded when it found the partition holding against the same verified run, or, for a
   lake that keeps versions, the signal at the version the run verified. Equal signals mean
   the same rows only where the signal is sound; a target without one (``None``) is never
   said to hold by it.
2. **The fingerprint** (format 3, the readings apply verified), for every partition the
   signal did not clear, and for all of them with ``full``. The signals are read before the
   rows (a lake's rows at exactly the version its signals were read at), so what is recorded
   is never newer than what was checked: a change that lands meanwhile differs at the next
   audit.

A drifted partition says what changed: rows added, removed and changed since the
verification, with the first differing keys and the columns that differ (keys and column
names only, as ``diff``), when the approved stage still holds the verified rows; otherwise the
row counts and totals. And since when it may have changed: the last audit that found it
holding (or its verification), and for a lake that keeps versions the commits after the
verified one that touched the partition's files.

Every audit is recorded in the control store (core.store.audits), partition by partition.
Read-only on the target and the stages.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

import psycopg

from backfill_assets.core.build import BuildEngine, open_build_engine
from backfill_assets.core.context import Clock, Signals, Target, utc_now
from backfill_assets.core.differences import DEFAULT_LIMIT, FirstKey, PartitionDiff
from backfill_assets.core.errors import BackfillError, SpecError
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.progress import Progress, ProgressEvent, quiet
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import audits as store
from backfill_assets.core.store.audits import AuditReading, AuditRecord, Drift, DriftCounts, LatestAudit, VerifiedRow
from backfill_assets.core.store.control import control_ready
from backfill_assets.core.store.ledger import partition_order
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest

Result = Literal["holds", "drifted", "never verified"]
FINGERPRINT = "fingerprint"  # the signal name of a partition whose rows were read


class Verified(AuditReading):
    """The verification a partition is compared with: its run, plan, readings, when, and the
    lake version it was verified at (absent for PostgreSQL)."""

    run_id: str
    plan_id: str
    verified_at: dt.datetime
    target_version: NotRequired[str]


class Since(TypedDict, total=False):
    """Since when a partition may have changed: the last audit that found it holding, its
    verification, and a lake's commits after it that touched its files."""

    last_seen_holding: dt.datetime
    verified_at: dt.datetime
    commits_since_verified: list[str]


@dataclass(frozen=True)
class PartitionAudit:
    """One partition's answer: ``result``; ``signal``: what said so (a metadata signal's name,
    ``fingerprint`` when its rows were read, ``none`` for a partition never verified);
    ``verified``: the ledger row compared with; ``now``: the readings now (when read);
    ``changes``: for a drifted partition, what changed; ``since``: since when it may have."""

    partition: str
    result: Result
    signal: str
    verified: Verified | None = None
    now: AuditReading | None = None
    changes: Drift | None = None
    since: Since | None = None
    note: str = ""
    signal_value: str | None = field(default=None, compare=False)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"partition": self.partition, "result": self.result, "signal": self.signal}
        for name in ("verified", "now", "changes", "since"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _jsonable(value)
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class AuditResult:
    audit_id: str
    spec_name: str
    target: str
    audited_at: Any
    partitions: list[PartitionAudit]

    @property
    def drifted(self) -> list[PartitionAudit]:
        return [p for p in self.partitions if p.result == "drifted"]

    def counts(self) -> dict[str, int]:
        out = {"holds": 0, "drifted": 0, "never verified": 0}
        for p in self.partitions:
            out[p.result] += 1
        return out

    def as_json(self) -> dict[str, Any]:
        return {"audit_id": self.audit_id, "spec": self.spec_name, "target": self.target,
                "audited_at": self.audited_at.isoformat(), "counts": self.counts(),
                "partitions": [p.as_json() for p in self.partitions]}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value.isoformat() if hasattr(value, "isoformat") else value


def _readings(of: VerifiedRow | Reading) -> AuditReading:
    """What an audit compares of a verified ledger row or of a partition's readings now."""
    return AuditReading(row_count=of["row_count"], total=of["total"], content_hash=of["content_hash"])


def audit_spec(spec: Spec, factory: ConnectionFactory, *, request: PartitionRequest | None = None,
               among: Collection[str] | None = None, full: bool = False, limit: int = DEFAULT_LIMIT,
               clock: Clock = utc_now, progress: Progress = quiet) -> AuditResult:
    """Audit the partitions of the spec's target that the ledger says were verified (with
    ``request``: those partitions, a never verified one said so; with ``among``: the verified
    ones among these labels), record the audit and return it.

    Raises:
        SpecError: a negative limit; a spec that does not match the catalog.
    """
    if limit < 0:
        raise SpecError("--limit must be 0 or more")
    schema, audit_id, at = spec.control_schema, uuid.uuid4().hex, clock()
    with factory() as conn, factory.control(conn) as control:
        verified = store.verified_partitions(control, schema, spec.target_name)
        previous = store.latest_audits(control, schema, spec.target_name)
        with open_build_engine(conn, factory, spec, control) as engine:
            if request is not None:
                wanted = engine.resolve(request).labels
            else:
                wanted = sorted((label for label in verified if among is None or label in among), key=partition_order)
            checked = [label for label in wanted if label in verified]
            progress(ProgressEvent("audit", f"{len(checked)} verified partition(s) of {spec.target_name}",
                                   done=0, total=len(checked), status="started"))
            found = _audit(engine, conn, control, factory, checked, verified, previous, full, limit,
                           progress) if checked else {}
        results = [found.get(label) or PartitionAudit(label, "never verified", "none",
                                                     since=_since(None, previous.get(label)))
                   for label in wanted]
        if results and control_ready(control, schema):
            store.record_audit(control, schema, audit_id=audit_id, spec_name=spec.name, target_table=spec.target_name,
                               audited_at=at, rows=[_record(p) for p in results])
    progress(ProgressEvent("audit", f"{len(results)} partition(s) audited", done=len(checked), total=len(checked),
                           status="finished"))
    return AuditResult(audit_id, spec.name, spec.target_name, at, results)


def _record(p: PartitionAudit) -> AuditRecord:
    return AuditRecord(partition=p.partition, result=p.result, signal=p.signal, signal_value=p.signal_value,
                       verified_run_id=None if p.verified is None else p.verified["run_id"],
                       readings=None if p.now is None else _jsonable(p.now),
                       changes=None if p.changes is None else _jsonable(p.changes))


def _since(row: VerifiedRow | None, last: LatestAudit | None) -> Since:
    """Since when a partition may have changed: the last audit that found it holding, else its
    verification."""
    out = Since()
    holding = None if last is None else last.get("last_holding_at")
    if holding is not None:
        out["last_seen_holding"] = holding
    if row is not None:
        out["verified_at"] = row["verified_at"]
    return out


def _baselines(target: Target, labels: list[str], verified: dict[str, VerifiedRow],
               previous: dict[str, LatestAudit], signals: Signals) -> dict[str, str | None]:
    """Each partition's baseline signal: what the previous audit recorded when it found the
    partition holding against the same verified run, else the signal at the verified version
    (a lake that keeps versions), else None."""
    out: dict[str, str | None] = {}
    by_version: dict[str, list[str]] = {}
    for label in labels:
        last, row = previous.get(label), verified[label]
        if (last is not None and last["result"] == "holds" and last["verified_run_id"] == row["run_id"]
                and last["signal"] in (signals.kind, FINGERPRINT) and last["signal_value"] is not None):
            out[label] = last["signal_value"]
        elif row["target_version"] is not None:
            by_version.setdefault(row["target_version"], []).append(label)
    for version, some in by_version.items():
        at = target.signals_at(version, some)
        for label in some:
            out[label] = None if at is None else at.get(label)
    return out


def _audit(engine: BuildEngine, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory,
           labels: list[str], verified: dict[str, VerifiedRow], previous: dict[str, LatestAudit], full: bool,
           limit: int, progress: Progress) -> dict[str, PartitionAudit]:
    ctx = engine.resolve(labels)
    target = engine.open_target(conn, control, factory, ctx)
    out: dict[str, PartitionAudit] = {}
    try:
        signals = target.signals(labels)  # first: what is recorded is never newer than what is checked
        baselines = {} if full else _baselines(target, labels, verified, previous, signals)
        to_read = []
        for label in labels:
            signal, base = signals.values.get(label), baselines.get(label)
            if signal is not None and base is not None and signal == base:
                out[label] = PartitionAudit(label, "holds", signals.kind, verified=_verified_of(verified[label]),
                                            since=_since(verified[label], previous.get(label)), signal_value=signal)
            else:
                to_read.append(label)
        readings = target.readings_at(signals, to_read) if to_read else {}
        now_of = {label: _readings(readings[label]) for label in to_read}
        drifted = [label for label in to_read if now_of[label] != _readings(verified[label])]
        touched = _commits_touching(target, drifted, verified)
    finally:
        target.close()
    for label in to_read:
        row, now, value = verified[label], now_of[label], signals.values.get(label)
        since = _since(row, previous.get(label))
        if label not in drifted:
            out[label] = PartitionAudit(label, "holds", FINGERPRINT, verified=_verified_of(row), now=now,
                                        since=since, signal_value=value)
            continue
        if label in touched:
            since["commits_since_verified"] = touched[label]
        out[label] = PartitionAudit(label, "drifted", FINGERPRINT, verified=_verified_of(row), now=now,
                                    since=since, signal_value=value, note=_later_run_note(row))
    for label, changes in _changes(engine, control, drifted, verified, limit).items():
        p = out[label]
        out[label] = PartitionAudit(p.partition, p.result, p.signal, p.verified, p.now, changes, p.since, p.note,
                                    p.signal_value)
    progress(ProgressEvent("audit", f"{len(labels) - len(to_read)} held by {signals.kind}, {len(to_read)} "
                           f"fingerprinted, {len(drifted)} drifted", done=len(labels), total=len(labels)))
    return out


def _commits_touching(target: Target, labels: list[str], verified: dict[str, VerifiedRow]) -> dict[str, list[str]]:
    """For the drifted partitions of a lake that keeps versions: the versions (snapshot ids)
    after the verified one whose files of the partition changed."""
    by_version: dict[str, list[str]] = {}
    for label in labels:
        version = verified[label]["target_version"]
        if version is not None:
            by_version.setdefault(version, []).append(label)
    out: dict[str, list[str]] = {}
    for version, some in by_version.items():
        out.update(target.versions_touching(version, some) or {})
    return out


def _verified_of(row: VerifiedRow) -> Verified:
    out = Verified(run_id=row["run_id"], plan_id=row["plan_id"], row_count=row["row_count"], total=row["total"],
                   content_hash=row["content_hash"], verified_at=row["verified_at"])
    if row["target_version"] is not None:
        out["target_version"] = row["target_version"]
    return out


def _later_run_note(row: VerifiedRow) -> str:
    later = row.get("later_run")
    if not later:
        return ""
    run_id, _, status = later.partition(" ")
    return f"run {run_id} {status} on this partition after the verification; it may have written it"


def _changes(engine: BuildEngine, control: psycopg.Connection, labels: list[str], verified: dict[str, VerifiedRow],
             limit: int) -> dict[str, Drift]:
    """What changed in each drifted partition since its verification: keys, from the approved
    stage where it still holds the verified rows (``diff``), else the readings' differences."""
    out: dict[str, Drift] = {}
    by_plan: dict[str, list[str]] = {}
    for label in labels:
        by_plan.setdefault(verified[label]["plan_id"], []).append(label)
    for plan_id, some in by_plan.items():
        parts: dict[str, PartitionDiff] = {}
        why = ""
        if "diff" in type(engine).REFUSES:
            why = "the engine cannot compare keys"
        else:
            try:
                stored = find_plan(control, engine.spec, plan_id)
                ctx = engine.resolve(stored.labels)
                parts = {d.partition: d for d in engine.diff(ctx, stored, some, "target", limit)}
            except BackfillError as err:
                why = f"the keys cannot be named: {err}"
        for label in some:
            out[label] = _drift_of(parts[label]) if label in parts else Drift(keys=None, why=why)
    return out


def _drift_of(d: PartitionDiff) -> Drift:
    """A diff of the approved stage (the verified rows) against the target, turned round: what
    the target gained (rows added), lost (removed) and changed since the verification."""
    kinds = {"added": "removed", "removed": "added", "changed": "changed"}
    return Drift(keys=DriftCounts(added=d.removed, removed=d.added, changed=d.changed, unchanged=d.unchanged),
                 first=[FirstKey(key=e.key, kind=kinds[e.kind], columns=e.columns) for e in d.examples])
