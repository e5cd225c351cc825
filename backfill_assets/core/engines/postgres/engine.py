"""The PostgreSQL build engine: the source is a table of the spec's database, read in one
exported snapshot held for the plan (or copied, or pinned by its fingerprint, in one
REPEATABLE READ transaction), and both stages are built there, on two connections at once
(core.build.BuildEngine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from backfill_assets.core.build import SourceMoves, StagesNow, stage_b_as_built, unwritten_b
from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Clock, Target, no_checkpoint
from backfill_assets.core.differences import Against, Change, PartitionDiff, equal_by_fingerprint
from backfill_assets.core.engines.postgres import exported, planned, review, snapshot, stages
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.diff import diff_against, rows_per_partition
from backfill_assets.core.engines.postgres.guard.transform import GUARD
from backfill_assets.core.engines.postgres.profiling import PostgresProfiler
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.staged import staged, staged_target
from backfill_assets.core.engines.postgres.watch import WatchState, watch_tick
from backfill_assets.core.errors import ApprovalError, StageError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.pg.catalog import table_kind
from backfill_assets.core.pg.db import ConnectionFactory, repeatable_read, transient_errors
from backfill_assets.core.progress import Progress
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest


class PostgresBuildEngine:
    """The snapshot and both stages in the spec's PostgreSQL database (``conn``); plans,
    approvals and the ledger in the control store (``control``: ``conn`` itself, or a database
    of its own)."""

    REFUSES: dict[str, str] = {}

    @staticmethod
    def snapshot_with_builds(spec: Spec) -> bool:
        return spec.source.snapshot == "exported"

    @staticmethod
    def reads_without_postgres(spec: Spec) -> bool:
        return False  # its source and its stages are tables of the spec's database

    def __init__(self, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
                 factory: ConnectionFactory, spec: Spec, held: contextlib.ExitStack) -> None:
        self.conn, self._control_store, self.factory, self.spec = conn, control_store, factory, spec
        self._held = held  # an exported snapshot's transaction, from take_snapshot to the builds' end

    @classmethod
    @contextlib.contextmanager
    def opened(cls, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
               factory: ConnectionFactory, spec: Spec) -> Iterator[PostgresBuildEngine]:
        """The engine for one step: beyond the step's connections it opens only the one that
        holds an exported snapshot, closed once the builds have read it (or with the step)."""
        with contextlib.ExitStack() as held:
            yield cls(conn, control_store, factory, spec, held)

    @property
    def control(self) -> psycopg.Connection:
        """The control store's connection (only the plan's commit asks for it)."""
        return self._control_store()

    # -- the plan side ----------------------------------------------------------------------
    def inspect(self) -> Inspection:
        return staged_target(self.spec).inspect(self.conn, None, GUARD)

    def resolve(self, request: PartitionRequest | list[str]) -> PostgresContext:
        return resolve(self.conn, self.spec, request)

    def take_snapshot(self, ctx: PostgresContext, clock: Clock, progress: Progress) -> tuple[snapshot.Snapshot, PostgresContext]:
        if self.snapshot_with_builds(self.spec):
            return self._held.enter_context(exported.exported(self.conn, self.factory, ctx, progress)), ctx
        return snapshot.take_snapshot(self.conn, ctx, clock, progress)

    def load_snapshot(self, snapshot_id: str) -> tuple[snapshot.Snapshot, PostgresContext]:
        return snapshot.load_snapshot(self.conn, self.spec, snapshot_id)

    def build_both(self, ctx: PostgresContext, snap: snapshot.Snapshot, clock: Clock,
                   progress: Progress) -> tuple[snapshot.Snapshot, dict[str, Fingerprint], dict[str, Fingerprint]]:
        try:
            if self.spec.parallel is not None:  # several builds of the spec may start at once
                planned.stage_tables_ready(self.conn, ctx)
            return stages.build_both(ctx, snap, self.factory, clock, progress)
        finally:
            self._held.close()  # an exported snapshot is read: let the server forget it

    def finish_plan(self, ctx: PostgresContext, snap: snapshot.Snapshot, a: dict[str, Fingerprint],
                    b: dict[str, Fingerprint], clock: Clock, progress: Progress) -> Plan:
        return planned.finish_plan(self.conn, self.control, ctx, snap, a, b, clock, progress)

    def stages_now(self, labels: list[str]) -> StagesNow:
        conn, spec = self.conn, self.spec
        if not store.control_ready(conn, spec.control_schema):
            raise StageError(f"the stages of spec {spec.name} have never been built; materialize both stages first")
        ctx = resolve(conn, spec, labels)
        with transient_errors("reading the stages"), repeatable_read(conn, read_only=True):
            for variant in ("a", "b"):
                if table_kind(conn, ctx.stage(variant)) is None:
                    raise StageError(f"stage {ctx.stage(variant)} has never been built; materialize both stages first")
            built = {v: store.builds(conn, spec.control_schema, spec.name, v, ctx.labels) for v in ("a", "b")}
            now = {v: dict(zip(ctx.labels, ctx.readings_of(conn, ctx.stage(v), ctx.partitions))) for v in ("a", "b")}
            stage_b_as_built(conn, spec, now["b"])
        return StagesNow(ctx, now, built)

    def source_moves(self, state: Any, budget_s: float | None) -> SourceMoves:
        tick = watch_tick(self.conn, self.spec, WatchState.from_json(state), budget_s=budget_s)
        return SourceMoves(tick.changed, tick.state.as_json(), tick.summary(), list(tick.notes))

    def profiler(self) -> PostgresProfiler:
        return PostgresProfiler(self.conn, self.spec)

    def diff(self, ctx: PostgresContext, stored: Plan, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        """Stage A's partitions ``labels`` against the target or stage B, in one snapshot,
        after checking that stage A still holds the plan's rows (its seal, or a fingerprint)."""
        conn = self.conn
        # A target partition may be loaded into a temporary table (TargetEngine.compared).
        with repeatable_read(conn, read_only=against != "target" or staged(ctx).compares_read_only):
            changed = stages.stage_partitions_changed(conn, ctx, "a", {label: stored.approved(label) for label in labels})
            if changed:
                raise ApprovalError(
                    f"stage {ctx.stage('a')} no longer holds plan {stored.plan_id[:16]}'s rows in partition(s) "
                    f"{', '.join(changed)}; plan again", plan_id=stored.plan_id,
                )
            unkept = (unwritten_b(conn, ctx.spec, rows_per_partition(conn, ctx, ctx.stage("b"), labels))
                      if against == "stage_b" else {})
            return [equal_by_fingerprint(label, stored.approved(label)) if unkept.get(label) == stored.approved(label)
                    else diff_against(conn, ctx, label, against, limit) for label in labels]

    # -- approval and apply ---------------------------------------------------------------
    def unchanged_spec(self, stored: Plan) -> PostgresContext:
        return review.check_spec_unchanged(self.conn, self.spec, stored)

    def unchanged_data(self, ctx: PostgresContext, stored: Plan, partitions: list[str] | None = None) -> dict[str, Reading]:
        return review.check_data_unchanged(self.conn, ctx, stored, partitions)

    def changes(self, ctx: PostgresContext, stored: Plan, first: int = 0) -> dict[str, Change]:
        return review.changes_of(self.conn, ctx, stored, first)

    def recheck_stage(self, ctx: PostgresContext, stored: Plan, labels: list[str]) -> None:
        stages.recheck_stage(self.conn, ctx, stored, labels)

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: PostgresContext, checkpoint: Checkpoint = no_checkpoint) -> Target:
        return staged(ctx).open(conn, control, factory, ctx, checkpoint)

    def explain(self, ctx: PostgresContext, err: VerificationError, version: str | None) -> VerificationError:
        return review.naming_keys(self.conn, ctx, err, version)
