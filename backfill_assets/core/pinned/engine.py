"""What the DuckDB and Spark build engines share (core.build.BuildEngine): a source pinned at
a version (core.pinned.pins), so a recorded snapshot holds only while its pin can still be read
exactly, the sensor asks the lake's metadata which partitions moved (core.pinned.watch), and
both stages and the builds' records are read without building anything. Each engine adds its
own reading of a stage (``stage_now``) and everything that runs in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from backfill_assets.core.build import SourceMoves, StagesNow, stage_b_as_built, unwritten_b
from backfill_assets.core.context import Context
from backfill_assets.core.differences import Against, PartitionDiff, equal_by_fingerprint
from backfill_assets.core.errors import ApprovalError, StageError
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned.pins import LakeSnapshot, PinnedSource, load_snapshot, require_pin
from backfill_assets.core.pinned.watch import lake_changes
from backfill_assets.core.planning import require_ready, spec_document_drift
from backfill_assets.core.spec import IcebergSourceSpec, IcebergTargetSpec, Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest


class PinnedBuildEngine:
    """The part of a build engine over a pinned source that does not depend on where the
    builds run; plans, approvals and the ledger are in the control store (``control``)."""

    REFUSES: dict[str, str] = {}

    @staticmethod
    def snapshot_with_builds(spec: Spec) -> bool:
        return False  # a pinned table version is read again by id in any later step

    @staticmethod
    def reads_without_postgres(spec: Spec) -> bool:
        """A pinned source and a lake target are read without PostgreSQL, but for an Iceberg
        source (core.pinned.iceberg opens its catalog through the control store's connection,
        named or not) and an Iceberg target whose catalog is in the spec's database (no
        ``uri_env``)."""
        if isinstance(spec.source, IcebergSourceSpec):
            return False
        return not isinstance(spec.target, IcebergTargetSpec) or spec.target.catalog.uri_env is not None

    def __init__(self, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
                 factory: ConnectionFactory, spec: Spec) -> None:
        self.conn, self._control_store, self.factory, self.spec = conn, control_store, factory, spec

    @property
    def control(self) -> psycopg.Connection:
        """The control store's connection, opened when first asked for."""
        return self._control_store()

    @property
    def source(self) -> PinnedSource:
        """The pinned source, opened when first asked for."""
        raise NotImplementedError

    def resolve(self, request: PartitionRequest | list[str]) -> Context:
        raise NotImplementedError

    def stage_now(self, ctx: Context, variant: str) -> list[Fingerprint]:
        """One stage's readings of the context's partitions as they are now (StageError: the
        stage was never built)."""
        raise NotImplementedError

    def load_snapshot(self, snapshot_id: str) -> tuple[LakeSnapshot, Context]:
        snapshot, ctx = load_snapshot(self.control, self.resolve, self.spec, snapshot_id)
        require_pin(self.source, self.spec, snapshot, ctx)
        return snapshot, ctx

    def stages_now(self, labels: list[str]) -> StagesNow:
        spec = self.spec
        if not store.control_ready(self.control, spec.control_schema):
            raise StageError(f"the stages of spec {spec.name} have never been built; materialize both stages first")
        ctx = self.resolve(labels)
        now = {v: dict(zip(ctx.labels, self.stage_now(ctx, v))) for v in ("a", "b")}
        stage_b_as_built(self.control, spec, now["b"])
        built = {v: store.builds(self.control, spec.control_schema, spec.name, v, ctx.labels) for v in ("a", "b")}
        return StagesNow(ctx, now, built)

    def source_moves(self, state: Any, budget_s: float | None) -> SourceMoves:
        """The partitions whose source changed since their snapshot and that no earlier tick
        requested with the same signature (``state``: label -> the signature requested; a
        partition snapshotted again leaves it, so its next change is requested again)."""
        changed, notes = self.source_changes()
        requested = state if isinstance(state, dict) else {}
        new = {label: digest for label, digest in changed.items() if requested.get(label) != digest}
        return SourceMoves(new, dict(changed), f"{len(changed)} partition(s) changed since their snapshot, "
                                               f"{len(new)} of them not requested before", notes)

    def source_changes(self) -> tuple[dict[str, str], list[str]]:
        """The snapshotted partitions whose source changed since their snapshot (label -> its
        signature now; core.pinned.watch), and what the sensor should say about what it cannot
        watch."""
        return lake_changes(self.control, self.spec), []

    def stage_changed(self, ctx: Context, expected: dict[str, Reading]) -> list[str]:
        """The partitions of stage A that no longer carry ``expected`` (label -> readings), by
        their seals or fingerprinted again."""
        raise NotImplementedError

    def rows_in_b(self, ctx: Context, labels: list[str]) -> dict[str, int]:
        """How many rows stage B holds now in each of ``labels`` (0 where it holds none)."""
        raise NotImplementedError

    def diff_partitions(self, ctx: Context, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        """Stage A's partitions ``labels`` against the target or stage B (core.comparison.diff)."""
        raise NotImplementedError

    def diff(self, ctx: Context, stored: Plan, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        """Stage A's partitions ``labels`` against the target or stage B, after checking that
        stage A still holds the plan's rows; a stage B partition hashed as it was built and not
        written (it equalled stage A) is equal to stage A's."""
        changed = self.stage_changed(ctx, {label: stored.approved(label) for label in labels})
        if changed:
            raise ApprovalError(f"stage A of spec {self.spec.name} no longer holds plan {stored.plan_id[:16]}'s rows "
                                f"in partition(s) {', '.join(changed)}; plan again", plan_id=stored.plan_id)
        unkept = unwritten_b(self.control, self.spec, self.rows_in_b(ctx, labels)) if against == "stage_b" else {}
        equal = [label for label in labels if unkept.get(label) == stored.approved(label)]
        rest = [label for label in labels if label not in equal]
        found = dict(zip(rest, self.diff_partitions(ctx, rest, against, limit)))
        return [equal_by_fingerprint(label, stored.approved(label)) if label in equal else found[label]
                for label in labels]

    def unchanged_spec(self, stored: Plan) -> Context:
        require_ready(stored)
        ctx = self.resolve(stored.labels)
        spec_document_drift(ctx, stored)
        return ctx
