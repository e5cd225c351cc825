"""The whole process on Apache Spark, for a spec with ``engine: {type: spark}``: the source
pinned (a Parquet folder's files, or a JDBC table's one copy; core.engines.spark.source), both builds
in Spark, and a Parquet folder target replaced one partition at a time by an atomic directory
swap (core.engines.spark.parquet) through the same apply protocol as every other target.

- Snapshot (:func:`take_snapshot`): the declared partitions are pinned, counted and checked
  in Spark (rows outside the partitions, NULL ordering values, ties, keyless partitions), and
  named by the digest of their files at the pin. The record goes to the control store.
- Stages (:func:`build_both`): stage A keeps each key's newest row by a window
  (``row_number``); stage B by an aggregate: the greatest struct of the ordering values
  turned newest-first (NULL placement as a flag, ascending values negated) and the row
  (where an ascending column is text, per ordering column the newest value joined back). Each is written as Parquet under the staging folder (``stage_a/``, ``stage_b/``),
  read back and fingerprinted in Spark (format 3, equal to PostgreSQL's and DuckDB's for the
  same rows), and sealed: the readings and the digest of each partition's files (sizes and
  SHA-256) go to ``seals_<stage>/<partition>.json``.
- Approval and apply (:class:`SparkBuildEngine`, core.build.BuildEngine): the pin must still hold its
  files; stage A must carry the approved readings, by its seals or fingerprinted again in
  Spark. Under each partition's lock apply reads stage A's partition into Arrow and
  fingerprints it (the recheck), writes exactly those rows beside the target partition and
  swaps them in, and reads the committed partition back to verify it
  (:class:`SparkTarget`).

Plans, approvals, the ledger and the locks stay in the control store (PostgreSQL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.differences import Against, PartitionDiff
from backfill_assets.core.engines.spark.inspect import fields_of, inspect, resolve
from backfill_assets.core.engines.spark.profiling import SparkProfiler
from backfill_assets.core.engines.spark.session import session_for, staging_dir
from backfill_assets.core.engines.spark.snapshot import input_reports, take_snapshot
from backfill_assets.core.engines.spark.source import SparkSource, spark_source
from backfill_assets.core.engines.spark.stages import (
    arrow_stage,
    build_both,
    compared,
    differing_keys,
    finish_plan,
    seals_hold,
    stage_dir,
    stage_readings,
)
from backfill_assets.core.engines.spark.watch import signatures_for
from backfill_assets.core.errors import ApprovalError, StageError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.lake import compare
from backfill_assets.core.lake.diff import diff_partition
from backfill_assets.core.lake.engine import lake_engine_for
from backfill_assets.core.lake.pinned_engine import PinnedBuildEngine
from backfill_assets.core.lake.target import StagedLakeTarget
from backfill_assets.core.lake.watch import pinned_changes
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned import LakeSnapshot, keys_detail, require_plan_pin
from backfill_assets.core.planning import compare_readings
from backfill_assets.core.progress import Progress
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest


class SparkTarget(StagedLakeTarget):
    """A Spark spec's target (a Parquet folder or a catalog table), whose approved rows come
    from stage A's files (core.lake.target.StagedLakeTarget)."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        super().__init__(conn, control, ctx, lake_engine_for(ctx.spec).table(control), checkpoint)

    def read_stage(self, label: str) -> pa.Table:
        return arrow_stage(self.ctx, "a", label)


class SparkBuildEngine(PinnedBuildEngine):
    """The Spark build engine (core.build.BuildEngine): the source pinned, both stages built
    in Spark; plans, approvals and the ledger in the control store (``control``). For approval
    and apply, Spark is started only where a seal does not hold (the stage is then
    fingerprinted again)."""

    def __init__(self, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
                 factory: ConnectionFactory, spec: Spec, source: SparkSource) -> None:
        super().__init__(conn, control_store, factory, spec)
        self._source = source
        self._target: SparkTarget | None = None
        self._session: Any | None = None
        self._profilers: list[SparkProfiler] = []

    @classmethod
    @contextlib.contextmanager
    def opened(cls, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
               factory: ConnectionFactory, spec: Spec) -> Iterator[SparkBuildEngine]:
        """The spec's source, open for the block; the session is started when first asked for."""
        source = spark_source(spec)
        try:
            engine = cls(conn, control_store, factory, spec, source)
            try:
                yield engine
            finally:
                for profiler in engine._profilers:  # what they cached on the executors
                    profiler.close()
        finally:
            source.close()

    @property
    def source(self) -> SparkSource:
        return self._source

    @property
    def session(self) -> Any:
        if self._session is None:
            self._session = session_for(self.spec)
        return self._session

    # -- the plan side ----------------------------------------------------------------------
    def inspect(self) -> Inspection:
        return inspect(self.control, self.spec, self.source, self.session)[0]

    def resolve(self, request: PartitionRequest | list[str]) -> Context:
        return resolve(self.control, self.spec, request, self.source, self.session)

    def take_snapshot(self, ctx: Context, clock: Clock, progress: Progress) -> tuple[LakeSnapshot, Context]:
        return take_snapshot(self.control, ctx, self.source, self.session, clock, progress)

    def stage_now(self, ctx: Context, variant: str) -> list[Fingerprint]:
        if not stage_dir(self.spec, variant).is_dir():
            raise StageError(f"stage {variant.upper()} of spec {self.spec.name} has never been built; materialize "
                             "both stages first")
        return stage_readings(self.session, ctx, variant, ctx.partitions)

    def build_both(self, ctx: Context, snapshot: LakeSnapshot, clock: Clock,
                   progress: Progress) -> tuple[LakeSnapshot, dict[str, Fingerprint], dict[str, Fingerprint]]:
        return (snapshot, *build_both(self.control, ctx, snapshot, self.source, self.session, clock, progress))

    def finish_plan(self, ctx: Context, snapshot: LakeSnapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                    clock: Clock, progress: Progress) -> Plan:
        reports = snapshot.reports if snapshot.reports is not None else input_reports(self.session, ctx, snapshot, self.source)
        return finish_plan(self.control, ctx, snapshot, self.session, reports, a, b, clock, progress)

    # -- approval and apply ---------------------------------------------------------------
    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, dict[str, Any]]:
        spec = self.spec
        wanted = stored.labels if partitions is None else partitions
        require_plan_pin(self.control, self.source, spec, stored, ctx)
        if not stage_dir(spec, "a").is_dir():
            raise ApprovalError(f"stage A of spec {spec.name} does not exist in {staging_dir(spec)}; plan again")
        changed = seals_hold(self._session, ctx, "a", {label: stored.approved(label) for label in stored.labels})
        if changed:
            raise ApprovalError(f"stage A of spec {spec.name} no longer has the planned fingerprint in partition(s) "
                                f"{', '.join(changed)}; plan again")
        target = SparkTarget(self.control, self.control, ctx)
        try:
            return target.readings(wanted)
        finally:
            target.close()

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, dict[str, Any]]:
        spec = self.spec
        target = SparkTarget(self.control, self.control, ctx)
        out: dict[str, dict[str, Any]] = {}
        fields = fields_of(ctx.target_columns)
        try:
            handle = target.table.open()
            for label in stored.labels:
                value = ctx.value_of(label)
                now = target.table.read(handle, spec.partition_key, [value])
                with compared(ctx, arrow_stage(ctx, "a", label), now) as duck:
                    added, removed, changed, unchanged = duck.execute(compare.change_counts(
                        "stage_rows", "target_rows", spec.partition_key, spec.business_key, fields),
                        {"partition": value}).fetchall()[0]
                    out[label] = {"added": int(added), "removed": int(removed), "changed": int(changed),
                                  "unchanged": int(unchanged)}
                    if first:
                        rows = duck.execute(compare.first_changes(
                            "stage_rows", "target_rows", spec.partition_key, spec.business_key, fields, first),
                            {"partition": value}).fetchall()
                        out[label]["first"] = compare.first_changes_json(rows, spec.business_key)
        finally:
            target.close()
        return out

    def source_changes(self) -> tuple[dict[str, str], list[str]]:
        if self.spec.source.format == "parquet":
            return super().source_changes()
        signatures = signatures_for(self.spec, self.source, self.session)
        if signatures is None:
            return {}, [f"source {self.spec.source_name} is not watched: a JDBC source is watched by its "
                        "source.change_column (a column every write changes); declare one, or plan again to restage"]
        return pinned_changes(self.control, self.spec, signatures), []

    def profiler(self) -> SparkProfiler:
        profiler = SparkProfiler(self.spec, self.source, self.session)
        self._profilers.append(profiler)
        return profiler

    def stage_changed(self, ctx: Context, expected: dict[str, dict[str, Any]]) -> list[str]:
        if not stage_dir(self.spec, "a").is_dir():
            raise ApprovalError(f"stage A of spec {self.spec.name} does not exist in {staging_dir(self.spec)}; plan again")
        return seals_hold(self._session, ctx, "a", expected)

    def rows_in_b(self, ctx: Context, labels: list[str]) -> dict[str, int]:
        return {label: arrow_stage(ctx, "b", label).num_rows for label in labels}

    def diff_partitions(self, ctx: Context, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        spec = self.spec
        target = SparkTarget(self.control, self.control, ctx) if against == "target" else None
        out = []
        try:
            handle = target.table.open() if target is not None else None
            for label in labels:
                right = (arrow_stage(ctx, "b", label) if target is None
                         else target.table.read(handle, spec.partition_key, [ctx.value_of(label)]))
                with compared(ctx, arrow_stage(ctx, "a", label), right) as duck:
                    out.append(diff_partition(duck, ctx, "stage_rows", "target_rows", label, limit))
        finally:
            if target is not None:
                target.close()
        return out

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        if self._target is not None:
            now = self._target.recheck(labels)
        else:
            now = {label: self._stage_now(ctx, label) for label in labels}
        compare_readings({label: stored.approved(label) for label in labels}, now, "recheck of the approved stage")

    def _stage_now(self, ctx: Context, label: str) -> dict[str, Any]:
        target = SparkTarget(self.control, self.control, ctx)
        try:
            return target.readings_of(arrow_stage(ctx, "a", label))
        finally:
            target.close()

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        self._target = SparkTarget(conn, control, ctx, checkpoint)
        return self._target

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        """The failure, naming the first keys where the committed partition differs from stage A."""
        spec = self.spec
        if self._target is None:
            return err
        try:
            value = ctx.value_of(err.partition)
            now = self._target.table.read_version(version, spec.partition_key, [value])
            keys = differing_keys(ctx, err.partition, arrow_stage(ctx, "a", err.partition), now)
        except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
            return err
        if not keys:
            return err
        detail = "first differing key(s), approved stage against the target: " + keys_detail(spec.business_key, keys)
        return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
