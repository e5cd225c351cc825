"""A source pinned at one version that cannot change, as the DuckDB and Spark engines keep it
(core.engines.duckdb, core.engines.spark): the snapshot that names the pin, its record in the control store, the
check that the pin still holds exactly its files, and the records of the builds and the plan.

What a pinned source must answer (``PinnedSource``): why a pin can no longer be read, and
the digest of each partition's files at the pin. Plans, approvals and the ledger stay in the
control store, as for every engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.context import Clock, Context
from backfill_assets.core.errors import ApprovalError, SnapshotError
from backfill_assets.core.fingerprint.identity import (
    SNAPSHOT_FORMAT,
    PartitionDigest,
    PinDocument,
    ScopeDocument,
    SnapshotDocument,
    snapshot_identity,
)
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Digest, Fingerprint
from backfill_assets.core.lake.parts import Part
from backfill_assets.core.lake.target import parts_of
from backfill_assets.core.moves import Scope
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionValue


@dataclass(frozen=True)
class Pin:
    """One version of a source: ``version`` names it (a Delta version, an Iceberg snapshot id,
    the digest of a file list); ``files``: the pinned files, as (path, size, SHA-256)."""

    version: str
    files: tuple[tuple[str, int, str], ...] = dataclasses.field(default=())

    def as_dict(self) -> PinDocument:
        out = PinDocument(version=self.version)
        if self.files:
            out["files"] = [list(f) for f in self.files]
        return out

    @classmethod
    def of(cls, data: PinDocument) -> Pin:
        return cls(str(data["version"]), tuple((str(p), int(n), str(h)) for p, n, h in data.get("files", [])))


class PinnedSource(Protocol):
    name: str

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
        """Why the partitions ``values`` of ``pin`` can no longer be read exactly, or None."""
        ...

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> dict[str, str]:
        """Per partition label, the digest of its files at the pin."""
        ...


@dataclass(frozen=True)
class LakeSnapshot:
    """A source pinned at one version, with its declared partitions' fingerprints."""

    snapshot_id: str
    fingerprint: str
    pin: Pin
    partitions: dict[str, Digest]  # label -> row count and the digest of its files
    requested: list[str]
    mode: Literal["lake"] = "lake"
    # What the checks read of the input per partition (rows, rows with a NULL key), when the
    # snapshot was taken in this process (None when loaded from its record).
    reports: dict[str, tuple[int, int]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.snapshot_id, "mode": self.mode, "fingerprint": self.fingerprint, "version": self.pin.version}


def record_snapshot(control: psycopg.Connection, ctx: Context, pin: Pin, columns: Sequence[ColumnInfo],
                    parts: dict[str, Digest], requested: list[str], reports: dict[str, tuple[int, int]],
                    clock: Clock) -> LakeSnapshot:
    """Name the pinned partitions (``parts``: label -> row count and the digest of its files)
    and record the snapshot in the control store; moved keys' scope, if any, with it."""
    spec, moved = ctx.spec, ctx.scope
    scope = ScopeDocument(requested=requested, added=moved.added if moved else {},
                          moves=[list(m) for m in moved.moves] if moved else [], pin=pin.as_dict())
    entries: list[PartitionDigest] = [{"partition": k, **parts[k]} for k in ctx.labels]
    document: SnapshotDocument = {
        "format": SNAPSHOT_FORMAT, "source": spec.source_name, "version": pin.version,
        "partition_key": spec.partition_by, "columns": [[c.name, c.type_name] for c in columns],
        "partitions": entries,
    }
    snapshot_id, fingerprint = snapshot_identity(document, scope, "lake")
    with control.transaction():
        if not store.control_ready(control, spec.control_schema):
            store.ensure_control_schema(control, spec.control_schema)
        store.record_snapshot(
            control, spec.control_schema, snapshot_id=snapshot_id, source_table=spec.source_name, mode="lake",
            snapshot_table=None, partition_key=spec.partition_by, partitions=entries, fingerprint=fingerprint,
            scope=scope, created_at=clock(),
        )
    return LakeSnapshot(snapshot_id, fingerprint, pin, parts, requested, reports=reports)


def load_snapshot(control: psycopg.Connection, ctx_of: Callable[[list[str]], Context], spec: Spec,
                  snapshot_id: str) -> tuple[LakeSnapshot, Context]:
    """A recorded pinned snapshot and its context (``ctx_of(labels)`` resolves one)."""
    found = store.find_snapshot(control, spec.control_schema, snapshot_id) if store.control_ready(control, spec.control_schema) else None
    if found is None or found["mode"] != "lake":
        raise SnapshotError(f"snapshot {snapshot_id} does not exist for a lake source; take a snapshot first")
    if found["fingerprint_format"] != FINGERPRINT_FORMAT:
        raise SnapshotError(f"snapshot {snapshot_id} was taken with another fingerprint format; take a snapshot again")
    labels = [p["partition"] for p in found["partitions"]]
    scope = found["scope"] or ScopeDocument(requested=labels, added={}, moves=[])
    parts = {p["partition"]: Digest(row_count=p["row_count"], content_hash=p["content_hash"]) for p in found["partitions"]}
    ctx = ctx_of(labels)
    if spec.records_can_move:
        ctx = dataclasses.replace(ctx, scope=Scope(
            ctx.partitions, dict(scope.get("added", {})), [tuple(m) for m in scope.get("moves", [])]))
    return LakeSnapshot(snapshot_id, found["fingerprint"], Pin.of(scope["pin"]), parts,
                        list(scope.get("requested", labels))), ctx


def pin_problem(source: PinnedSource, pin: Pin, partition_key: str, values: Sequence[Part],
                recorded: dict[str, str]) -> str | None:
    """Why the partitions ``values`` of ``pin`` are not exactly what the snapshot recorded
    (``recorded``: label -> the digest of its files at the pin), or None: the version can no
    longer be read, or reads other files (a table deleted and written again at the same
    location has a version of the same number)."""
    why = source.unreadable(pin, partition_key, values)
    if why is not None:
        return why
    now = source.signature_at(pin, partition_key, values)
    moved = [label for label in recorded if now.get(label) != recorded[label]]
    if moved:
        return f"partition(s) {', '.join(moved)} are held by other files than when the snapshot was taken"
    return None


def require_pin(source: PinnedSource, spec: Spec, snapshot: LakeSnapshot, ctx: Context) -> None:
    """The stages step's check: the snapshot's pin still holds exactly its files.

    Raises:
        SnapshotError: it does not; take a snapshot again.
    """
    why = pin_problem(source, snapshot.pin, spec.partition_key, parts_of(ctx),
                      {label: p["content_hash"] for label, p in snapshot.partitions.items()})
    if why is not None:
        raise SnapshotError(f"the pinned version {snapshot.pin.version} of {spec.source_name} can no longer be read "
                            f"({why}); take a snapshot again (plan again)")


def require_plan_pin(control: psycopg.Connection, source: PinnedSource, spec: Spec, stored: Plan, ctx: Context) -> None:
    """Approval's and apply's check of a plan made from a pinned source: its snapshot is
    recorded as planned and its pin still holds exactly its files.

    Raises:
        ApprovalError: the plan was not made from a pinned source, its snapshot is gone, or
            the pin no longer holds; plan again.
    """
    snap = stored.document.snapshot
    if snap.mode != "lake" or snap.version is None:
        raise ApprovalError(f"plan {stored.plan_id[:16]} was not made from a lake source; plan again")
    found = store.find_snapshot(control, spec.control_schema, snap.id)
    if found is None or found["fingerprint"] != snap.fingerprint:
        raise ApprovalError(f"snapshot {snap.id} of plan {stored.plan_id[:16]} is gone; plan again")
    pin = Pin.of(found["scope"]["pin"])
    why = pin_problem(source, pin, spec.partition_key, parts_of(ctx),
                      {p["partition"]: p["content_hash"] for p in found["partitions"]})
    if why is not None:
        raise ApprovalError(f"the pinned version {pin.version[:16]} of {spec.source_name} can no longer be read "
                            f"({why}); plan again")


def record_builds(control: psycopg.Connection, spec: Spec, snapshot_id: str, built: dict[str, dict[str, Fingerprint]],
                  clock: Clock, unkept: dict[str, set[str]] | None = None) -> None:
    """Record each stage's readings per partition (``built``: stage -> label -> readings);
    ``unkept``: stage -> the partitions hashed as they were built and not written."""
    with control.transaction():
        for variant, partitions in built.items():
            for label, fp in partitions.items():
                store.record_build(control, spec.control_schema, spec_name=spec.name, variant=variant, partition=label,
                                   snapshot_id=snapshot_id, readings=fp.as_dict(), writer_xid=None, writer_txid=None,
                                   kept=label not in (unkept or {}).get(variant, ()), built_at=clock())


def record_builds_b_kept_where_it_differs(
    control: psycopg.Connection, ctx: Context, snapshot_id: str, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
    clock: Clock, rebuild: Callable[[list[PartitionValue]], dict[str, Fingerprint]],
) -> None:
    """Record both builds, stage B's hashed as it was built and not written. Where a partition
    of stage B differs from stage A, ``rebuild`` builds those partitions again from the same
    pin and writes them, so that the differing keys can be shown; with records_can_move a key's
    newest version is chosen across every partition of the scope, so the rebuild reads them
    all, as the first build did."""
    differ = [value for value, label in zip(ctx.partitions, ctx.labels) if a[label] != b[label]]
    again = list(ctx.partitions) if ctx.spec.records_can_move else differ
    rebuilt = rebuild(again) if differ else {}
    record_builds(control, ctx.spec, snapshot_id, {"a": a, "b": b}, clock,
                  unkept={"b": {label for label in ctx.labels if label not in rebuilt}})


def record_plan(control: psycopg.Connection, spec: Spec, plan: Plan, snapshot_id: str, clock: Clock,
                progress: Progress) -> Plan:
    """Store the plan in the control store and say so."""
    with control.transaction():
        store.record_plan(
            control, spec.control_schema, plan_id=plan.plan_id, spec_name=spec.name, target_table=spec.target_name,
            status=plan.status, snapshot_id=snapshot_id, plan=plan.as_json(), created_at=clock(),
        )
    progress(ProgressEvent("plan", f"{plan.plan_id[:16]}: {plan.status}", status=plan.status))
    return plan


def keys_detail(business_key: Sequence[str], keys: Sequence[Sequence[Any]]) -> str:
    """``k=v, ...; ...``: the first differing keys, as failures name them."""
    return "; ".join(", ".join(f"{k}={v}" for k, v in zip(business_key, key)) for key in keys)
