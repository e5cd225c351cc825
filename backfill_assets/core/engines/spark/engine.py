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
  Spark. Under each partition's lock Spark writes stage A's partition beside the target
  partition, fingerprints the written files, the table switches them in, and Spark
  fingerprints the committed partition (core.engines.spark.apply: the driver moves file lists
  and readings, never rows).
- The change preview, ``diff`` and the first differing keys a refused plan names are Spark
  jobs (core.engines.spark.compare): only the rows of a few keys reach the driver.

Plans, approvals, the ledger and the locks stay in the control store (PostgreSQL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.differences import Against, Change, PartitionDiff
from backfill_assets.core.engines.spark import compare as spark_compare
from backfill_assets.core.engines.spark.apply import SparkTarget
from backfill_assets.core.engines.spark.catalog_source import CatalogSource
from backfill_assets.core.engines.spark.inspect import inspect, resolve
from backfill_assets.core.engines.spark.profiling import SparkProfiler
from backfill_assets.core.engines.spark.session import release, session_for, staging_dir
from backfill_assets.core.engines.spark.snapshot import input_reports, take_snapshot
from backfill_assets.core.engines.spark.source import JdbcSource, ParquetFolderSource, SparkSource
from backfill_assets.core.engines.spark.stages import (
    build_both,
    finish_plan,
    seals_hold,
    stage_dir,
    stage_files,
    stage_readings,
    stage_rows,
)
from backfill_assets.core.engines.spark.watch import signatures_for
from backfill_assets.core.errors import ApprovalError, StageError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned.engine import PinnedBuildEngine
from backfill_assets.core.pinned.pins import LakeSnapshot, keys_detail, require_plan_pin
from backfill_assets.core.pinned.watch import pinned_changes
from backfill_assets.core.planning import compare_readings
from backfill_assets.core.progress import Progress
from backfill_assets.core.spec import ParquetSourceSpec, SparkTableSpec, Spec
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest


def spark_source(spec: Spec) -> SparkSource:
    """The spec's source."""
    if isinstance(spec.source, ParquetSourceSpec):
        return ParquetFolderSource(spec.source, windowed=spec.partition_window is not None)
    if isinstance(spec.source, SparkTableSpec):
        return CatalogSource(spec)
    return JdbcSource(spec)


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
            source.use_session(lambda: engine.session)
            try:
                yield engine
            finally:
                for profiler in engine._profilers:  # what they cached on the executors
                    profiler.close()
                release(engine._session)
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
    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, Reading]:
        spec = self.spec
        wanted = stored.labels if partitions is None else partitions
        require_plan_pin(self.control, self.source, spec, stored, ctx)
        if not stage_dir(spec, "a").is_dir():
            raise ApprovalError(f"stage A of spec {spec.name} does not exist in {staging_dir(spec)}; plan again")
        changed = seals_hold(lambda: self.session, ctx, "a", {label: stored.approved(label) for label in stored.labels})
        if changed:
            raise ApprovalError(f"stage A of spec {spec.name} no longer has the planned fingerprint in partition(s) "
                                f"{', '.join(changed)}; plan again")
        target = SparkTarget(self.control, self.control, ctx, lambda: self.session)
        try:
            return target.readings(wanted)
        finally:
            target.close()

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, Change]:
        """The change preview, as Spark jobs over stage A's and the target's files
        (core.engines.spark.compare)."""
        return spark_compare.changes(self.session, ctx, stage_files(ctx, "a", stored.labels),
                                     self._target_files(ctx, stored.labels), first)

    def _target_files(self, ctx: Context, labels: list[str]) -> dict[str, list[str]]:
        """Each partition's data files in the target now (full paths)."""
        target = SparkTarget(self.control, self.control, ctx, lambda: self.session)
        try:
            return target.files(target.table.open(), labels)
        finally:
            target.close()

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

    def stage_changed(self, ctx: Context, expected: dict[str, Reading]) -> list[str]:
        if not stage_dir(self.spec, "a").is_dir():
            raise ApprovalError(f"stage A of spec {self.spec.name} does not exist in {staging_dir(self.spec)}; plan again")
        return seals_hold(lambda: self.session, ctx, "a", expected)

    def rows_in_b(self, ctx: Context, labels: list[str]) -> dict[str, int]:
        return stage_rows(ctx, "b", labels)

    def diff_partitions(self, ctx: Context, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        """``diff`` as Spark jobs over the files of stage A and of the target or stage B
        (core.engines.spark.compare)."""
        right = self._target_files(ctx, labels) if against == "target" else stage_files(ctx, "b", labels)
        found = spark_compare.diffs(self.session, ctx, stage_files(ctx, "a", labels), right, limit)
        return [found[label] for label in labels]

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        """Stage A by its seals: the sealed files unchanged (or, where not, the stage
        fingerprinted again by Spark) still carry the approved readings."""
        approved = {label: stored.approved(label) for label in labels}
        changed = seals_hold(lambda: self.session, ctx, "a", approved)
        if changed:
            now = stage_readings(self.session, ctx, "a", [ctx.value_of(label) for label in changed])
            compare_readings({label: approved[label] for label in changed},
                             {label: fp.as_dict() for label, fp in zip(changed, now)}, "recheck of the approved stage")

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        self._target = SparkTarget(conn, control, ctx, lambda: self.session, checkpoint)
        return self._target

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        """The failure, naming the first keys where the committed partition differs from stage A."""
        spec = self.spec
        if self._target is None:
            return err
        try:
            label = err.partition
            now = self._target.files(self._target.table.open(), [label])
            keys = spark_compare.differing_keys(self.session, ctx, stage_files(ctx, "a", [label]), now)[label]
        except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
            return err
        if not keys:
            return err
        detail = "first differing key(s), approved stage against the target: " + keys_detail(spec.business_key, keys)
        return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
