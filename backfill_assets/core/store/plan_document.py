"""The plan document: one typed, frozen model of what an approver approves.

A plan's id is the SHA-256 of this document's canonical JSON (core.fingerprint.identity), so the model
serialises to exactly the JSON earlier versions stored: the same keys, lists for tuples, the
readings of core.fingerprint.partition. The ids of stored plans are pinned by literal values in
backfill_assets_tests/core/fingerprint/test_identity_pins.py. Plans are stored (control.plans) as
:meth:`Plan.as_json`, which adds the plan id, status and problems, and read back with
:meth:`Plan.from_json`.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from backfill_assets.core.errors import DeterminismError, StageDifference
from backfill_assets.core.fingerprint.identity import plan_id_of
from backfill_assets.core.fingerprint.rows import Digest, Fingerprint, Reading
from backfill_assets.core.spec import OrderingColumn


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceReport(_Frozen):
    """What the build read from the snapshot for one partition, and the snapshot's pin."""

    rows_read: int
    null_key_rows_dropped: int
    duplicates_collapsed: int  # rows read that became no target row for another reason
    snapshot_rows: int
    snapshot_hash: str

    @property
    def pinned(self) -> Digest:
        """The snapshot's fingerprint of the source partition."""
        return Digest(row_count=self.snapshot_rows, content_hash=self.snapshot_hash)


class PartitionEntry(_Frozen):
    """One partition of a plan: both stages' readings, and what the build read."""

    partition: str
    match: bool
    stage_a: Fingerprint  # what apply writes, and must read back
    stage_b: Fingerprint
    source: SourceReport
    # A time window's first instant and the first instant after it (ISO 8601, UTC): what its
    # label names, in the plan the approval binds to. Absent from the JSON of a value partition.
    start: str | None = None
    end: str | None = None

    def difference(self) -> StageDifference | None:
        """The readings on which the two stages differ, or None."""
        a, b = self.stage_a, self.stage_b
        differing = {name: (getattr(a, name), getattr(b, name)) for name in a.differences(b)}
        return StageDifference(self.partition, differing) if differing else None


class InputPin(_Frozen):
    """One of the spec's other inputs as the snapshot read it (core.spec_inputs): its name, its
    table, what of it was read (``partition_key``: the rows of the plan's partitions through
    that column, widened by ``before`` and ``after``; else every row) and the digest of those
    rows, which the snapshot's id covers."""

    name: str
    table: str
    partition_key: str | None
    before: str | None
    after: str | None
    row_count: int
    content_hash: str
    copied_to: str | None = None  # snapshot: copy: the table it was copied into


class SnapshotRef(_Frozen):
    id: str
    # lake: a lake source's own version, read by the DuckDB engine (core.engines.duckdb)
    mode: Literal["exported", "copy", "immutable", "lake"]
    fingerprint: str
    version: str | None = None  # lake: the Delta version, Iceberg snapshot id or Parquet file-list digest
    inputs: tuple[InputPin, ...] | None = None  # the spec's other inputs, pinned with the source


class AddedPartition(_Frozen):
    """A partition that moved records added to the requested ones, and why."""

    partition: str
    reasons: tuple[str, ...]


class PlanDocument(_Frozen):
    """Everything an approver approves. The first fields come from the spec and the target's
    catalog (:data:`SPEC_FIELDS`; approve and apply recompute them and refuse any drift)."""

    format: str
    spec: str
    target: str
    source: str
    partition_key: str
    business_key: tuple[str, ...]
    ordering: tuple[OrderingColumn, ...]
    columns: tuple[tuple[str, str], ...]
    target_table_columns: tuple[tuple[str, str], ...]
    total: str | None
    records_can_move: bool
    transform_version: str
    transform_sql_sha256: str | None
    snapshot: SnapshotRef
    requested_partitions: tuple[str, ...]
    added_partitions: tuple[AddedPartition, ...]
    replace_groups: tuple[tuple[str, ...], ...]  # partitions moved keys link: one transaction each
    partitions: tuple[PartitionEntry, ...]
    # A lake target only: apply creates the table (it did not exist when planned). Not a spec
    # field: once apply has created it, the same plan still applies. Absent from the JSON of
    # a PostgreSQL plan, whose id is therefore what it always was.
    creates_target: bool | None = None
    # An Iceberg target's catalog, without its password (core.lake.iceberg_catalog.catalog_identity);
    # absent from other plans' JSON, like creates_target.
    target_catalog: str | None = None
    # The format of every content hash in the plan (core.fingerprint.rows.FORMAT); absent
    # from the JSON of plans made before format 3, which find_plan refuses ("plan again").
    fingerprint_format: int | None = None
    # Partitions that are time windows (Spec.partition_window, as JSON): absent from the JSON of
    # a plan of values, whose id is therefore what it always was.
    partition_window: dict[str, str | None] | None = None
    # A lake target of time windows: how the table is partitioned (core.lake.engine); absent
    # from other plans' JSON.
    target_partitioned_by: tuple[str, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        """The document as JSON values: what the plan id hashes."""
        out = self.model_dump(mode="json")
        for optional in ("creates_target", "target_catalog", "fingerprint_format", "partition_window",
                         "target_partitioned_by"):
            if out[optional] is None:
                del out[optional]
        for optional in ("version", "inputs"):  # absent where unused: those plans' ids unchanged
            if out["snapshot"][optional] is None:
                del out["snapshot"][optional]
        for pin in out["snapshot"].get("inputs", ()):
            if pin["copied_to"] is None:  # an input read in the exported snapshot, not copied
                del pin["copied_to"]
        for entry in out["partitions"]:
            if entry["start"] is None:  # absent for value partitions: their plan ids unchanged
                del entry["start"], entry["end"]
        return out

    def spec_fields(self) -> dict[str, Any]:
        """The spec- and catalog-derived fields, as JSON values."""
        return self.model_dump(mode="json", include=set(SPEC_FIELDS))

    @property
    def labels(self) -> list[str]:
        return [p.partition for p in self.partitions]

    def entry(self, label: str) -> PartitionEntry:
        return self._entries[label]

    @functools.cached_property
    def _entries(self) -> dict[str, PartitionEntry]:
        # Looked up per partition by approval and apply: a map, not a scan of every entry.
        return {p.partition: p for p in self.partitions}


SPEC_FIELDS = (
    "format", "spec", "target", "source", "partition_key", "business_key", "ordering", "columns",
    "target_table_columns", "total", "records_can_move", "transform_version", "transform_sql_sha256",
    "target_catalog", "fingerprint_format", "partition_window", "target_partitioned_by",
)


class Plan(_Frozen):
    """A fingerprinted plan: its document, the id that document hashes to, its status, and
    why it was refused (``problems``, empty for a ready plan)."""

    plan_id: str
    status: Literal["ready", "refused"]
    problems: tuple[str, ...]
    document: PlanDocument

    @classmethod
    def of(cls, document: PlanDocument, problems: list[str]) -> Plan:
        return cls(plan_id=plan_id_of(document.as_json()), status="refused" if problems else "ready",
                   problems=tuple(problems), document=document)

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> Plan:
        """A plan as stored (:meth:`as_json`).

        Raises:
            pydantic.ValidationError: the document is not a plan of this format.
            ValueError: the document does not hash to the stored plan id.
        """
        fields = {k: stored[k] for k in ("plan_id", "status", "problems")}
        document = PlanDocument.model_validate({k: v for k, v in stored.items() if k not in fields})
        if plan_id_of(document.as_json()) != fields["plan_id"]:
            # A stored row edited by hand: what would be reviewed is not what the id names.
            raise ValueError(f"the stored document of plan {fields['plan_id'][:16]} does not hash to its id")
        return cls(document=document, **fields)

    def as_json(self) -> dict[str, Any]:
        """The plan as printed by ``plan --json`` and stored: one object."""
        return {"plan_id": self.plan_id, "status": self.status, "problems": list(self.problems),
                **self.document.as_json()}

    @property
    def labels(self) -> list[str]:
        return self.document.labels

    def approved(self, label: str) -> Reading:
        """The approved readings (stage A's) of one partition."""
        return self.document.entry(label).stage_a.as_dict()

    def pinned_source(self, labels: list[str] | None = None) -> dict[str, Digest]:
        """The source fingerprints the plan's snapshot pinned, of ``labels`` (default all)."""
        return {p.partition: p.source.pinned for p in self.document.partitions if labels is None or p.partition in labels}

    def refusal(self) -> DeterminismError:
        """The error a refused plan raises: its problems, and the partitions whose stages
        differ with the readings that differ."""
        differences = [d for d in (p.difference() for p in self.document.partitions) if d is not None]
        return DeterminismError(self.plan_id, self.problems, differences)
