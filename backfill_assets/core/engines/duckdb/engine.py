"""The whole process on DuckDB, for a spec with ``engine: {type: duckdb}``: the lake source
pinned to its own version (core.pinned.source), both builds in DuckDB, and the lake target
written through the same writers and the same apply protocol as for a PostgreSQL source.

- Snapshot (:func:`take_snapshot`): the newest version of the source is pinned; the declared
  partitions are counted and checked at it (NULL ordering values, ties, keyless partitions,
  rows a transform moves out) and named by the digest of their files at the pin (the version
  cannot change; the rows are fingerprinted in the stages). The record goes to the control
  store with the pin, like a PostgreSQL snapshot.
- Stages (:func:`build_both`): stage A by ``DISTINCT ON``, stage B by ``row_number()``, each on
  its own connection of the spec's DuckDB database, each reading the pinned version itself.
  A stage's partitions are replaced and fingerprinted (format 3) in one DuckDB transaction,
  which also records each partition's readings and seal (:func:`seals_hold`) in the same
  database; the readings are recorded as the build in the control store too.
- Approval and apply (:class:`DuckBuildEngine`, core.build.BuildEngine): the pin must still be
  readable (a vacuumed Delta version, an expired Iceberg snapshot, a changed Parquet file:
  "plan again"), and stage A must carry the approved readings, by its seals or fingerprinted
  again. Under each partition's lock apply reads stage A's rows into Arrow and fingerprints
  them (the recheck), writes exactly those rows, and the lake target fingerprints the
  committed version again (:class:`DuckLakeTarget`).

Plans, approvals, the ledger and the locks stay in the control store (PostgreSQL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import psycopg

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.comparison import compare
from backfill_assets.core.comparison.diff import diff_relations
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.differences import Against, Change, PartitionDiff
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.engines.duckdb.database import cursor, database
from backfill_assets.core.engines.duckdb.inspect import inspect, resolve
from backfill_assets.core.engines.duckdb.profiling import DuckProfiler
from backfill_assets.core.engines.duckdb.snapshot import input_reports, take_snapshot
from backfill_assets.core.engines.duckdb.stages import (
    as_stage,
    build_both,
    fields_of,
    finish_plan,
    partition_column,
    readings_of,
    seals_hold,
    stage_name,
)
from backfill_assets.core.engines.duckdb.target import DuckLakeTarget
from backfill_assets.core.errors import ApprovalError, StageError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.lake.target import part_of
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned.by_format import lake_source
from backfill_assets.core.pinned.engine import PinnedBuildEngine
from backfill_assets.core.pinned.pins import LakeSnapshot, keys_detail, require_plan_pin
from backfill_assets.core.pinned.source import LakeSource
from backfill_assets.core.planning import compare_readings
from backfill_assets.core.progress import Progress
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


class DuckBuildEngine(PinnedBuildEngine):
    """The DuckDB build engine (core.build.BuildEngine): the lake source pinned at its version,
    both stages in the spec's DuckDB database; plans, approvals and the ledger in the control
    store (``control``)."""

    def __init__(self, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
                 factory: ConnectionFactory, spec: Spec, stack: contextlib.ExitStack) -> None:
        super().__init__(conn, control_store, factory, spec)
        self._stack = stack
        self._source: LakeSource | None = None
        self._db: DuckDBPyConnection | None = None
        self._target: DuckLakeTarget | None = None  # the target apply opened (its recheck reads the stage)

    @classmethod
    @contextlib.contextmanager
    def opened(cls, conn: psycopg.Connection, control_store: Callable[[], psycopg.Connection],
               factory: ConnectionFactory, spec: Spec) -> Iterator[DuckBuildEngine]:
        """The engine for the block; its lake source and DuckDB database are opened when first
        asked for (the sensor's question needs neither) and closed with the block."""
        with contextlib.ExitStack() as stack:
            yield cls(conn, control_store, factory, spec, stack)

    @property
    def source(self) -> LakeSource:
        if self._source is None:
            self._source = lake_source(self.spec, self.control)
            self._stack.callback(self._source.close)
        return self._source

    @property
    def db(self) -> DuckDBPyConnection:
        """The spec's DuckDB database (one process at a time may hold it)."""
        if self._db is None:
            self._db = self._stack.enter_context(database(self.spec))
        return self._db

    # -- the plan side ----------------------------------------------------------------------
    def inspect(self) -> Inspection:
        with contextlib.closing(cursor(self.db)) as duck:
            return inspect(self.control, self.spec, self.source, duck)[0]

    def resolve(self, request: PartitionRequest | list[str]) -> Context:
        with contextlib.closing(cursor(self.db)) as duck:
            return resolve(self.control, self.spec, request, self.source, duck)

    def take_snapshot(self, ctx: Context, clock: Clock, progress: Progress) -> tuple[LakeSnapshot, Context]:
        return take_snapshot(self.control, ctx, self.source, self.db, clock, progress)

    def stage_now(self, ctx: Context, variant: str) -> list[Fingerprint]:
        spec, stage = self.spec, stage_name(self.spec, variant)
        with contextlib.closing(cursor(self.db)) as duck:
            if not duck.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall():
                raise StageError(f"stage {stage} has never been built; materialize both stages first")
            return readings_of(duck, stage, ctx.target_columns, partition_column(ctx), spec.business_key, spec.total,
                               ctx.partitions)

    def build_both(self, ctx: Context, snapshot: LakeSnapshot, clock: Clock,
                   progress: Progress) -> tuple[LakeSnapshot, dict[str, Fingerprint], dict[str, Fingerprint]]:
        return (snapshot, *build_both(self.control, ctx, snapshot, self.source, self.db, clock, progress))

    def finish_plan(self, ctx: Context, snapshot: LakeSnapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                    clock: Clock, progress: Progress) -> Plan:
        reports = snapshot.reports if snapshot.reports is not None else input_reports(self.db, ctx, snapshot, self.source)
        return finish_plan(self.control, ctx, snapshot, self.db, reports, a, b, clock, progress)

    # -- approval and apply ---------------------------------------------------------------
    def profiler(self) -> DuckProfiler:
        profiler = DuckProfiler(self.spec, self.source)
        self._stack.callback(profiler.close)
        return profiler

    def stage_changed(self, ctx: Context, expected: dict[str, Reading]) -> list[str]:
        """The partitions of stage A that no longer carry ``expected`` (by their seals, or
        fingerprinted in full where a seal does not hold: :func:`seals_hold`)."""
        spec = self.spec
        with contextlib.closing(cursor(self.db)) as duck:
            if not duck.execute(statements.TABLE_COLUMNS, {'table': stage_name(spec, "a")}).fetchall():
                raise ApprovalError(f"stage {stage_name(spec, 'a')} of spec {spec.name} does not exist in "
                                    f"{spec.engine.database or 'its DuckDB database'}; plan again")
            return seals_hold(duck, ctx, "a", expected)

    def _stage_now(self, ctx: Context, labels: list[str]) -> dict[str, Reading]:
        spec = self.spec
        stage = stage_name(spec, "a")
        with contextlib.closing(cursor(self.db)) as duck:
            if not duck.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall():
                raise StageError(f"stage {stage} of spec {spec.name} does not exist in {spec.engine.database or 'its DuckDB database'}; plan again")
            found = readings_of(duck, stage, ctx.target_columns, partition_column(ctx), spec.business_key, spec.total,
                                [ctx.value_of(label) for label in labels])
        return {label: fp.as_dict() for label, fp in zip(labels, found)}

    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, Reading]:
        spec = self.spec
        wanted = stored.labels if partitions is None else partitions
        require_plan_pin(self.control, self.source, spec, stored, ctx)
        changed = self.stage_changed(ctx, {label: stored.approved(label) for label in stored.labels})
        if changed:
            raise ApprovalError(f"stage {stage_name(spec, 'a')} no longer has the planned fingerprint in partition(s) "
                                f"{', '.join(changed)}; plan again")
        target = DuckLakeTarget(self.control, self.control, ctx, self.db)
        try:
            return target.readings(wanted)
        finally:
            target.close()

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, Change]:
        spec = self.spec
        target = DuckLakeTarget(self.control, self.control, ctx, self.db)
        out: dict[str, Change] = {}
        fields = fields_of(ctx.target_columns)
        try:
            handle = target.table.open()
            with contextlib.closing(cursor(self.db)) as duck:
                built = {label: stored.approved(label)["row_count"] for label in stored.labels}
                for label in stored.labels:
                    value = ctx.value_of(label)
                    rows_now = (target.schema.empty_table() if handle is None
                                else target.table.read(handle, spec.partition_key, [part_of(ctx, label)]))
                    duck.register("target_rows", as_stage(ctx, rows_now, label))
                    if rows_now.num_rows == 0:  # an empty (or new) partition: every approved key is added
                        out[label] = Change(added=built[label], removed=0, changed=0, unchanged=0)
                    else:
                        query = compare.change_counts(stage_name(spec, "a"), "target_rows", partition_column(ctx),
                                                         spec.business_key, fields)
                        added, removed, changed, unchanged = duck.execute(query, {"partition": value}).fetchall()[0]
                        out[label] = Change(added=int(added), removed=int(removed), changed=int(changed),
                                            unchanged=int(unchanged))
                    if first:
                        rows = duck.execute(compare.first_changes(
                            stage_name(spec, "a"), "target_rows", partition_column(ctx), spec.business_key, fields, first),
                            {"partition": value}).fetchall()
                        out[label]["first"] = compare.first_changes_json(rows, spec.business_key)
        finally:
            target.close()
        return out

    def rows_in_b(self, ctx: Context, labels: list[str]) -> dict[str, int]:
        spec = self.spec
        with contextlib.closing(cursor(self.db)) as duck:
            if not duck.execute(statements.TABLE_COLUMNS, {'table': stage_name(spec, "b")}).fetchall():
                return dict.fromkeys(labels, 0)
            counted = dict(duck.execute(statements.partition_counts(stage_name(spec, "b"), partition_column(ctx)),
                                        {"partitions": [ctx.value_of(label) for label in labels]}).fetchall())
        return {label: int(counted.get(ctx.value_of(label), 0)) for label in labels}

    def diff_partitions(self, ctx: Context, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        spec = self.spec
        target = DuckLakeTarget(self.control, self.control, ctx, self.db) if against == "target" else None
        out = []
        try:
            handle = target.table.open() if target is not None else None
            with contextlib.closing(cursor(self.db)) as duck:
                for label in labels:
                    other = stage_name(spec, "b")
                    if target is not None:
                        now = (target.schema.empty_table() if handle is None
                               else target.table.read(handle, spec.partition_key, [part_of(ctx, label)]))
                        duck.register("target_rows", as_stage(ctx, now, label))
                        other = "target_rows"
                    out.append(diff_relations(duck, stage_name(spec, "a"), other, ctx.target_columns,
                                              partition_column(ctx), spec.business_key, label, ctx.value_of(label),
                                              limit))
        finally:
            if target is not None:
                target.close()
        return out

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        """Stage A under the partition lock: by its seals where the write goes by files (what is
        written from it is fingerprinted in full before the commit), otherwise from the rows
        read into Arrow to be written; a partition found changed is fingerprinted in full for
        the error."""
        approved = {label: stored.approved(label) for label in labels}
        target = self._target
        if target is not None and target.writes_files:
            changed = self.stage_changed(ctx, approved)
            now = {**approved, **self._stage_now(ctx, changed)} if changed else approved
        else:
            now = target.recheck(labels) if target is not None else self._stage_now(ctx, labels)
        compare_readings(approved, now, "recheck of the approved stage")

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        self._target = DuckLakeTarget(conn, control, ctx, self.db, checkpoint)
        return self._target

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        """The failure, naming the first keys where the committed version differs from stage A
        (compared in DuckDB by their canonical text); as it was if they cannot be read."""
        spec = self.spec
        if self._target is None or version is None:
            return err
        try:
            value = ctx.value_of(err.partition)
            data = self._target.table.read_version(version, spec.partition_key, [part_of(ctx, err.partition)])
            with contextlib.closing(cursor(self.db)) as duck:
                duck.register("committed_rows", as_stage(ctx, data, err.partition))
                keys = duck.execute(compare.differing_keys(
                    stage_name(spec, "a"), "committed_rows", partition_column(ctx), spec.business_key,
                    fields_of(ctx.target_columns)), {"partition": value}).fetchall()
        except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
            return err
        if not keys:
            return err
        detail = "first differing key(s), approved stage against the target: " + keys_detail(spec.business_key, keys)
        return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
