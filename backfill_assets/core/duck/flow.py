"""The whole process on DuckDB, for a spec with ``engine: {type: duckdb}``: the lake source
pinned to its own version (core.duck.source), both builds in DuckDB, and the lake target
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
import dataclasses
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import psycopg
import pyarrow as pa

from backfill_assets.core.build import SourceMoves, StagesNow
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.duck import statements
from backfill_assets.core.duck.database import cursor, database
from backfill_assets.core.duck.inspect import described, inspect, resolve, source_types
from backfill_assets.core.duck.source import SOURCE_ROWS, LakeSource, lake_source
from backfill_assets.core.duck.watch import lake_changes
from backfill_assets.core.errors import ApprovalError, SourceDataError, SpecError, StageError, VerificationError
from backfill_assets.core.fingerprint import duck, rows
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.moves import close_scope_with
from backfill_assets.core.pg.catalog import ColumnInfo, Inspection
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned import (
    LakeSnapshot,
    Pin,
    keys_detail,
    load_snapshot,
    record_builds,
    record_plan,
    record_snapshot,
    require_pin,
    require_plan_pin,
)
from backfill_assets.core.planning import assemble, compare_readings, require_ready, spec_document_drift
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.targets.lake import LakeEngine, StagedLakeTarget, refuse_keys_in_several_partitions
from backfill_assets.core.vocabulary import PartitionRequest, PartitionValue, partition_label

TARGET_KEYS = "target_keys"  # the lake target's keys, registered for the moved keys' homes


def stage_name(spec: Spec, variant: str) -> str:
    """A stage's table in the spec's DuckDB database."""
    return f"{spec.name}__stage_{variant}"


def builds_table(spec: Spec) -> str:
    """The builds' records (readings and seals) in the spec's DuckDB database."""
    return f"{spec.name}__builds"


def _fields(columns: Sequence[ColumnInfo]) -> list[tuple[str, str]]:
    return [(c.name, rows.kind_of(c)) for c in columns]


def _float_keys(columns: Sequence[ColumnInfo], business_key: Sequence[str]) -> list[str]:
    return [c.name for c in columns if c.name in business_key and rows.kind_of(c) == "double"]


def readings_of(con: Any, relation: str, columns: Sequence[ColumnInfo], partition_key: str,
                business_key: Sequence[str], total: str | None, values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of each of ``values`` of a relation on ``con``, in that order, from one
    grouped aggregate (format 3, equal to PostgreSQL's for the same rows)."""
    query = duck.partition_digest_sql(relation, _fields(columns), business_key, partition_key, total,
                                      _float_keys(columns, business_key))
    found = {partition_label(r[0]): r for r in con.execute(query, {"partitions": list(values)}).fetchall()}
    out = []
    for value in values:
        row = found.get(partition_label(value))
        if row is None:
            out.append(empty(columns, total))
            continue
        _, count, null_keys, duplicates, *sums, total_value = row
        n = int(count)
        out.append(Fingerprint(n, int(null_keys), int(duplicates), None if total is None else rows.total_text(total_value),
                               rows.content_hash(columns, n, [int(s or 0) for s in sums])))
    return out


def _input(ctx: Context, source_names: Sequence[str]) -> Any:
    return statements.input_relation(source_names, ctx.spec.input_columns, ctx.transform)


def check_source(con: Any, ctx: Context) -> dict[str, tuple[int, int]]:
    """Refuse source data newest-wins cannot rebuild exactly, as the PostgreSQL engine does
    (core.engines.postgres.snapshot.check_source); return each partition's (rows read, rows with a NULL key).

    Raises:
        SourceDataError: NULLs in an ordering column without declared NULL placement, ties on
            every ordering column between rows that differ, a partition whose every row has a
            NULL key, rows a transform moves outside the declared partitions.
    """
    spec = ctx.spec
    relation = _input(ctx, [name for name, _ in source_types(con)])
    params = {"partitions": list(ctx.partitions)}
    outside = con.execute(statements.outside_partitions(relation, spec.partition_key), params).fetchall()
    if outside:
        raise SourceDataError(
            "the input has rows outside the declared partitions (the transform moves them, or they have a "
            "NULL partition key)", "Keep the partition key as the source has it in transform_sql",
            [f"partition {value}: {n} row(s)" for value, n in outside],
        )
    ordering = [o.column for o in spec.ordering]
    counts = con.execute(statements.ordering_nulls(relation, spec.business_key, ordering)).fetchall()[0]
    undeclared = [f"{o.column}: {n} row(s)" for o, n in zip(spec.ordering, counts) if n and o.nulls is None]
    if undeclared:
        raise SourceDataError(
            "ordering columns have NULL values and no declared NULL placement",
            "Declare where NULLs sort with `nulls: first` or `nulls: last` on that ordering column, or fix the source",
            undeclared,
        )
    reports = {partition_label(p): (int(n), int(nulls))
               for p, n, nulls in con.execute(statements.input_report(relation, spec.partition_key, spec.business_key)).fetchall()}
    keyless = [f"partition {label}: {n} row(s)" for label, (n, nulls) in reports.items() if n and nulls == n]
    if keyless:
        raise SourceDataError(
            "every source row of some partitions has a NULL business key "
            f"({', '.join(spec.business_key)}), so the rebuild would empty them",
            "Check business_key against the source (run `backfill-assets profile`)", keyless[:3],
        )
    fields = _fields(ctx.target_columns)  # the output rows decide whether tied rows differ
    # A key that can move has one newest version across partitions, so ties are per key.
    scope_key = None if spec.records_can_move else spec.partition_key
    tied = con.execute(statements.tied_groups(relation, scope_key, spec.business_key, ordering, fields)).fetchall()
    if tied:
        raise SourceDataError(
            f"rows tie on every ordering column ({', '.join(ordering)}) within a key but differ, so newest-wins would "
            "pick one of them by chance", "Add a final tiebreak column to ordering (an ingest sequence, a unique id)",
            [", ".join(f"{k}={v}" for k, v in zip([*([scope_key] if scope_key else []), *spec.business_key], row[:-1]))
             + f" ({row[-1]} different rows)" for row in tied],
        )
    return reports


def _target_keys(con: Any, control: psycopg.Connection, ctx: Context) -> str:
    """The lake target's distinct (partition key, business key) pairs at its current version,
    registered on ``con`` (records_can_move: where a key lives now).

    Raises:
        SourceDataError: a business key lies in more than one partition of the target.
    """
    spec, engine = ctx.spec, ctx.engine
    assert isinstance(engine, LakeEngine)
    names = [spec.partition_key, *spec.business_key]
    table = engine.table(control)
    try:
        handle = table.open()
        data = lake_schema(ctx.target_columns).empty_table().select(names) if handle is None \
            else table.read_columns(handle, names)
    finally:
        table.close()
    con.register(TARGET_KEYS, data.group_by(names).aggregate([]).select(names))
    refuse_keys_in_several_partitions(
        spec, con.execute(statements.keys_in_several_partitions(TARGET_KEYS, spec.business_key)).fetchall())
    return TARGET_KEYS


def _moved_scope(control: psycopg.Connection, ctx: Context, source: LakeSource, db: Any, pin: Pin,
                 progress: Progress) -> Context:
    """records_can_move: the context with every partition a moved key leaves or enters added,
    to a fixed point, read at ``pin`` (every partition of it) and the target as it is now."""
    spec = ctx.spec
    with contextlib.closing(cursor(db)) as con:
        source.attach_all(con, pin)
        keys = _target_keys(con, control, ctx)
        query = statements.key_homes(keys, spec.partition_key, spec.business_key, spec.ordering)

        def homes(partitions: list[PartitionValue]) -> list[tuple]:
            return [tuple(r) for r in con.execute(query, {"partitions": partitions}).fetchall()]

        scope = close_scope_with(spec, ctx.kind, ctx.partitions, homes)
    ctx.engine.check_partitions(scope.partitions)
    if scope.added:
        progress(ProgressEvent("snapshot", f"moved records add partition(s) {', '.join(scope.added)}"))
    return dataclasses.replace(ctx, partitions=scope.partitions, scope=scope)


def take_snapshot(control: psycopg.Connection, ctx: Context, source: LakeSource, db: Any, clock: Clock,
                  progress: Progress) -> tuple[LakeSnapshot, Context]:
    """Pin the source's newest version, count and check the declared partitions at it (with
    records_can_move, the partitions moved keys add too), and record the snapshot in the
    control store. Returns the snapshot and the context, widened by moved keys."""
    spec = ctx.spec
    requested = list(ctx.labels)
    pin = source.latest(spec.partition_key, ctx.partitions)
    progress(ProgressEvent("snapshot", f"pinned {spec.source_name} at version {pin.version[:16]}"))
    if spec.records_can_move:
        ctx = _moved_scope(control, ctx, source, db, pin, progress)
    with contextlib.closing(cursor(db)) as con:
        source.attach(con, pin, spec.partition_key, ctx.partitions)
        names = set([name for name, _ in source_types(con)])
        columns = [c for c in ctx.inspection.source_columns if c.name in names]
        counts = {partition_label(p): int(n) for p, n in con.execute(
            statements.partition_counts(SOURCE_ROWS, spec.partition_key), {"partitions": list(ctx.partitions)}).fetchall()}
        reports = check_source(con, ctx)
    # The pinned version cannot change, so its files name each partition's rows: their digest
    # is the partition's hash here (the rows themselves are fingerprinted in the stages).
    files = source.signature_at(pin, spec.partition_key, ctx.partitions)
    parts = {label: {"row_count": counts.get(label, 0), "content_hash": files[label]} for label in ctx.labels}
    return record_snapshot(control, ctx, pin, columns, parts, requested, reports, clock), ctx


def _ensure_stage(con: Any, ctx: Context, variant: str, types: list[tuple[str, str]]) -> str:
    """The stage table with the input's DuckDB types, (re)created when its columns differ."""
    stage = stage_name(ctx.spec, variant)
    wanted = [(n, t) for n, t in types if n in ctx.spec.columns]
    wanted.sort(key=lambda c: ctx.spec.columns.index(c[0]))
    if [tuple(r) for r in con.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall()] != wanted:
        con.execute(statements.create_stage(stage, wanted))
    return stage


def build_stage(db: Any, ctx: Context, snapshot: LakeSnapshot, source: LakeSource, variant: Literal["a", "b"],
                progress: Progress) -> dict[str, Fingerprint]:
    """Build every partition of one stage on a connection of its own, reading the pinned
    source on its own; the partitions are replaced and fingerprinted in one transaction."""
    spec = ctx.spec
    out: dict[str, Fingerprint] = {}
    step, total = f"stage {variant}", len(ctx.partitions)
    with contextlib.closing(cursor(db)) as con:
        source.attach(con, snapshot.pin, spec.partition_key, ctx.partitions)
        names = [name for name, _ in source_types(con)]
        relation = statements.input_relation(names, spec.input_columns, ctx.transform)
        stage = _ensure_stage(con, ctx, variant, described(con, relation, spec.input_columns))
        insert = statements.build_stage(variant, stage, relation, spec.columns, spec.partition_key, spec.business_key,
                                        spec.ordering, moving=spec.records_can_move)
        progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
        # Every partition in one transaction and three statements: DuckDB parallelises each one
        # over all the partitions, where a statement per partition would pay its start each time.
        params = {"partitions": list(ctx.partitions)}
        con.begin()
        try:
            con.execute(statements.delete_partitions(stage, spec.partition_key), params)
            con.execute(insert, params)
            found = readings_of(con, stage, ctx.target_columns, spec.partition_key, spec.business_key, spec.total,
                                ctx.partitions)
            record_seals(con, ctx, variant, snapshot.snapshot_id, dict(zip(ctx.labels, found)))
            con.commit()
        except BaseException:
            con.rollback()
            raise
        for n, (label, fp) in enumerate(zip(ctx.labels, found), 1):
            out[label] = fp
            progress(ProgressEvent(step, f"{fp.row_count} row(s)", partition=label, done=n, total=total,
                                   rows=fp.row_count, status="built"))
    return out


def _seals_now(con: Any, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> dict[str, tuple[int, str]]:
    spec = ctx.spec
    query = statements.seals(stage_name(spec, variant), spec.partition_key, _fields(ctx.target_columns))
    found = con.execute(query, {"partitions": list(values)}).fetchall()
    return {partition_label(value): (int(n), str(seal)) for value, n, seal in found}


def record_seals(con: Any, ctx: Context, variant: str, snapshot_id: str, built: dict[str, Fingerprint]) -> None:
    """Record, in the build's transaction, each partition's readings and seal (:func:`seals_hold`)."""
    table = builds_table(ctx.spec)
    seals = _seals_now(con, ctx, variant, [ctx.value_of(label) for label in built])
    con.execute(statements.delete_builds(table), {"variant": variant, "labels": list(built)})
    for label, fp in built.items():
        rows, seal = seals.get(label, (0, "0"))
        con.execute(statements.insert_build(table), {
            "variant": variant, "partition": label, "snapshot_id": snapshot_id,
            "readings": json.dumps(fp.as_dict(), sort_keys=True), "row_count": rows, "seal": seal,
        })


def seals_hold(con: Any, ctx: Context, variant: str, expected: dict[str, dict[str, Any]]) -> list[str]:
    """The partitions of ``expected`` (label -> readings) whose stage no longer carries them
    without being fingerprinted again: those whose build recorded exactly those readings
    and whose rows still give the build's seal (row count and the exact sum of DuckDB's 64-bit
    hash of every row) are unchanged; every other one is fingerprinted in full and compared.

    DuckDB keeps no row versions, so this seal is a hash, not PostgreSQL's writing
    transaction: a 64-bit sum that an accidental change leaves equal with probability about
    2^-64, not one that withstands a forged change. What apply copies into the target is
    fingerprinted in full (SHA-256) before the commit whatever the seal says."""
    spec = ctx.spec
    labels = list(expected)
    sealed = bool(con.execute(statements.TABLE_COLUMNS, {"table": builds_table(spec)}).fetchall())
    recorded = {row[0]: (json.loads(row[1]), int(row[2]), str(row[3])) for row in con.execute(
        statements.builds_of(builds_table(spec)), {"variant": variant, "labels": labels}).fetchall()} if sealed else {}
    now = _seals_now(con, ctx, variant, [ctx.value_of(label) for label in labels])
    doubtful = [label for label in labels
                if label not in recorded or recorded[label][0] != expected[label]
                or now.get(label, (0, "0")) != recorded[label][1:]]
    if not doubtful:
        return []
    found = readings_of(con, stage_name(spec, variant), ctx.target_columns, spec.partition_key, spec.business_key,
                        spec.total, [ctx.value_of(label) for label in doubtful])
    return [label for label, fp in zip(doubtful, found) if fp.as_dict() != expected[label]]


def build_both(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, source: LakeSource, db: Any,
               clock: Clock, progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B at once, each on its own DuckDB connection, and record each build
    in the control store."""
    with contextlib.closing(cursor(db)) as con:  # once, before the two builds record in it
        con.execute(statements.create_builds(builds_table(ctx.spec)))
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="stage") as pool:
        fa = pool.submit(build_stage, db, ctx, snapshot, source, "a", progress)
        fb = pool.submit(build_stage, db, ctx, snapshot, source, "b", progress)
        a, b = fa.result(), fb.result()
    record_builds(control, ctx.spec, snapshot.snapshot_id, {"a": a, "b": b}, clock)
    return a, b


def _unholdable(con: Any, ctx: Context) -> list[str]:
    """Stage A's dates and time stamps a lake column cannot hold (infinite, or outside the
    years 1 to 9999), per partition and column."""
    spec = ctx.spec
    checked = [c.name for c in ctx.target_columns if c.base_type in ("date", "timestamptz")]
    if not checked:
        return []
    query = statements.unholdable(stage_name(spec, "a"), spec.partition_key, checked)
    found = con.execute(query, {"partitions": list(ctx.partitions)}).fetchall()
    return [
        f"partition {partition_label(row[0])}: column {name} has {n} value(s) a {spec.target.format} column cannot hold "
        "(an infinite date or time stamp, or a year outside 1 to 9999); fix them in the source or transform"
        for row in found for name, n in zip(checked, row[1:]) if n
    ]


def _differing_keys(con: Any, ctx: Context, a: dict[str, Fingerprint], b: dict[str, Fingerprint]) -> list[str]:
    spec = ctx.spec
    out = []
    query = statements.differing_keys(stage_name(spec, "a"), stage_name(spec, "b"), spec.partition_key,
                                      spec.business_key, _fields(ctx.target_columns))
    for value, label in zip(ctx.partitions, ctx.labels):
        if a[label] == b[label]:
            continue
        keys = con.execute(query, {"partition": value}).fetchall()
        out.append(f"partition {label}: first differing key(s), stage A against stage B: "
                   + keys_detail(spec.business_key, keys))
    return out


def finish_plan(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, db: Any, reports: dict[str, tuple[int, int]],
                a: dict[str, Fingerprint], b: dict[str, Fingerprint], clock: Clock, progress: Progress) -> Plan:
    """Compare the stages, store the plan; a refused plan's differing stage partitions are
    deleted so that nothing can apply them."""
    spec = ctx.spec
    with contextlib.closing(cursor(db)) as con:
        problems = _unholdable(con, ctx) + _differing_keys(con, ctx, a, b)
        plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested, problems)  # type: ignore[arg-type]
        if plan.status == "refused":
            for entry in plan.document.partitions:
                if not entry.match:
                    for v in ("a", "b"):
                        con.execute(statements.delete_partition(stage_name(spec, v), spec.partition_key),
                                    {"partition": ctx.value_of(entry.partition)})
    return record_plan(control, spec, plan, snapshot.snapshot_id, clock, progress)


@contextlib.contextmanager
def opened(spec: Spec, control: psycopg.Connection) -> Iterator[tuple[LakeSource, Any]]:
    """The spec's lake source and DuckDB database, for the block."""
    source = lake_source(spec, control)
    try:
        with database(spec) as db:
            yield source, db
    finally:
        source.close()


def _reports(db: Any, ctx: Context, snapshot: LakeSnapshot, source: LakeSource) -> dict[str, tuple[int, int]]:
    with contextlib.closing(cursor(db)) as con:
        source.attach(con, snapshot.pin, ctx.spec.partition_key, ctx.partitions)
        relation = _input(ctx, [name for name, _ in source_types(con)])
        found = con.execute(statements.input_report(relation, ctx.spec.partition_key, ctx.spec.business_key)).fetchall()
    return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in found}


class DuckLakeTarget(StagedLakeTarget):
    """A lake target whose approved rows come from stage A in DuckDB (targets.lake.StagedLakeTarget)."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, db: Any,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        engine = ctx.engine
        assert isinstance(engine, LakeEngine)
        super().__init__(conn, control, ctx, engine.table(control), checkpoint)
        self.db = db

    def read_stage(self, label: str) -> pa.Table:
        spec = self.ctx.spec
        query = statements.stage_rows(stage_name(spec, "a"), spec.columns, spec.partition_key, spec.business_key)
        with contextlib.closing(cursor(self.db)) as con:
            data = con.sql(query, params={"partition": self.ctx.value_of(label)}).to_arrow_table()
        return data.cast(lake_schema(self.ctx.target_columns))


class DuckBuildEngine:
    """The DuckDB build engine (core.build.BuildEngine): the lake source pinned at its version,
    both stages in the spec's DuckDB database; plans, approvals and the ledger in the control
    store (``control``)."""

    REFUSES = {
        "diff": "`diff` reads a PostgreSQL source and stages; it does not support engine duckdb yet (plan, approve, "
                "apply, status and inspect do; approve shows each partition's changes)",
        "profile": "`profile` reads a PostgreSQL source and stages; it does not support engine duckdb yet (plan, "
                   "approve, apply, status and inspect do)",
    }

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory, spec: Spec,
                 source: LakeSource, db: Any) -> None:
        self.conn, self.control, self.factory, self.spec, self.source, self.db = conn, control, factory, spec, source, db
        self._target: DuckLakeTarget | None = None  # the target apply opened (its recheck reads the stage)

    @classmethod
    @contextlib.contextmanager
    def opened(cls, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory,
               spec: Spec) -> Iterator[DuckBuildEngine]:
        """The spec's source and DuckDB database, open for the block."""
        with opened(spec, control) as (source, db):
            yield cls(conn, control, factory, spec, source, db)

    # -- the plan side ----------------------------------------------------------------------
    def inspect(self) -> Inspection:
        with contextlib.closing(cursor(self.db)) as con:
            return inspect(self.control, self.spec, self.source, con)[0]

    def resolve(self, request: PartitionRequest | list[str]) -> Context:
        with contextlib.closing(cursor(self.db)) as con:
            return resolve(self.control, self.spec, request, self.source, con)

    def take_snapshot(self, ctx: Context, clock: Clock, progress: Progress) -> tuple[LakeSnapshot, Context]:
        return take_snapshot(self.control, ctx, self.source, self.db, clock, progress)

    def load_snapshot(self, snapshot_id: str) -> tuple[LakeSnapshot, Context]:
        snapshot, ctx = load_snapshot(self.control, self.resolve, self.spec, snapshot_id)
        require_pin(self.source, self.spec, snapshot, ctx)
        return snapshot, ctx

    def build_both(self, ctx: Context, snapshot: LakeSnapshot, clock: Clock,
                   progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
        return build_both(self.control, ctx, snapshot, self.source, self.db, clock, progress)

    def finish_plan(self, ctx: Context, snapshot: LakeSnapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                    clock: Clock, progress: Progress) -> Plan:
        reports = snapshot.reports if snapshot.reports is not None else _reports(self.db, ctx, snapshot, self.source)
        return finish_plan(self.control, ctx, snapshot, self.db, reports, a, b, clock, progress)

    def stages_now(self, labels: list[str]) -> StagesNow:
        spec = self.spec
        if not store.control_ready(self.control, spec.control_schema):
            raise StageError(f"the stages of spec {spec.name} have never been built; materialize both stages first")
        ctx = self.resolve(labels)
        now = {}
        with contextlib.closing(cursor(self.db)) as con:
            for v in ("a", "b"):
                stage = stage_name(spec, v)
                if not con.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall():
                    raise StageError(f"stage {stage} has never been built; materialize both stages first")
                found = readings_of(con, stage, ctx.target_columns, spec.partition_key, spec.business_key, spec.total,
                                    ctx.partitions)
                now[v] = dict(zip(ctx.labels, found))
        built = {v: store.builds(self.control, spec.control_schema, spec.name, v, ctx.labels) for v in ("a", "b")}
        return StagesNow(ctx, now, built)

    def source_moves(self, state: Any, budget_s: float | None) -> SourceMoves:
        changed = lake_changes(self.control, self.spec)
        return SourceMoves(changed, None, f"{len(changed)} partition(s) changed since their snapshot")

    def diff(self, ctx: Context, stored: Plan, labels: list[str], against: Any, limit: int) -> list[Any]:
        raise SpecError(self.REFUSES["diff"])

    # -- approval and apply ---------------------------------------------------------------
    def unchanged_spec(self, stored: Plan) -> Context:
        require_ready(stored)
        ctx = self.resolve(stored.labels)
        spec_document_drift(ctx, stored)
        return ctx

    def _stage_changed(self, ctx: Context, expected: dict[str, dict[str, Any]]) -> list[str]:
        """The partitions of stage A that no longer carry ``expected`` (by their seals, or
        fingerprinted in full where a seal does not hold: :func:`seals_hold`)."""
        spec = self.spec
        with contextlib.closing(cursor(self.db)) as con:
            if not con.execute(statements.TABLE_COLUMNS, {'table': stage_name(spec, "a")}).fetchall():
                raise ApprovalError(f"stage {stage_name(spec, 'a')} of spec {spec.name} does not exist in "
                                    f"{spec.engine.database or 'its DuckDB database'}; plan again")
            return seals_hold(con, ctx, "a", expected)

    def _stage_now(self, ctx: Context, labels: list[str]) -> dict[str, dict[str, Any]]:
        spec = self.spec
        stage = stage_name(spec, "a")
        with contextlib.closing(cursor(self.db)) as con:
            if not con.execute(statements.TABLE_COLUMNS, {'table': stage}).fetchall():
                raise StageError(f"stage {stage} of spec {spec.name} does not exist in {spec.engine.database or 'its DuckDB database'}; plan again")
            found = readings_of(con, stage, ctx.target_columns, spec.partition_key, spec.business_key, spec.total,
                                [ctx.value_of(label) for label in labels])
        return {label: fp.as_dict() for label, fp in zip(labels, found)}

    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, dict[str, Any]]:
        spec = self.spec
        wanted = stored.labels if partitions is None else partitions
        require_plan_pin(self.control, self.source, spec, stored, ctx)
        changed = self._stage_changed(ctx, {label: stored.approved(label) for label in stored.labels})
        if changed:
            raise ApprovalError(f"stage {stage_name(spec, 'a')} no longer has the planned fingerprint in partition(s) "
                                f"{', '.join(changed)}; plan again")
        target = DuckLakeTarget(self.control, self.control, ctx, self.db)
        try:
            return target.readings(wanted)
        finally:
            target.close()

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, dict[str, Any]]:
        spec = self.spec
        target = DuckLakeTarget(self.control, self.control, ctx, self.db)
        out: dict[str, dict[str, Any]] = {}
        fields = _fields(ctx.target_columns)
        try:
            handle = target.table.open()
            with contextlib.closing(cursor(self.db)) as con:
                built = {label: stored.approved(label)["row_count"] for label in stored.labels}
                for label in stored.labels:
                    value = ctx.value_of(label)
                    rows_now = (target.schema.empty_table() if handle is None
                                else target.table.read(handle, spec.partition_key, [value]))
                    con.register("target_rows", rows_now.select(list(spec.columns)))
                    if rows_now.num_rows == 0:  # an empty (or new) partition: every approved key is added
                        out[label] = {"added": built[label], "removed": 0, "changed": 0, "unchanged": 0}
                    else:
                        query = statements.change_counts(stage_name(spec, "a"), "target_rows", spec.partition_key,
                                                         spec.business_key, fields)
                        added, removed, changed, unchanged = con.execute(query, {"partition": value}).fetchall()[0]
                        out[label] = {"added": int(added), "removed": int(removed), "changed": int(changed),
                                      "unchanged": int(unchanged)}
                    if first:
                        rows = con.execute(statements.first_changes(
                            stage_name(spec, "a"), "target_rows", spec.partition_key, spec.business_key, fields, first),
                            {"partition": value}).fetchall()
                        out[label]["first"] = statements.first_changes_json(rows, spec.business_key)
        finally:
            target.close()
        return out

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        now = self._target.recheck(labels) if self._target is not None else self._stage_now(ctx, labels)
        compare_readings({label: stored.approved(label) for label in labels}, now, "recheck of the approved stage")

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
            data = self._target.table.read_version(version, spec.partition_key, [value])
            with contextlib.closing(cursor(self.db)) as con:
                con.register("committed_rows", data.select(list(spec.columns)))
                keys = con.execute(statements.differing_keys(
                    stage_name(spec, "a"), "committed_rows", spec.partition_key, spec.business_key,
                    _fields(ctx.target_columns)), {"partition": value}).fetchall()
        except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
            return err
        if not keys:
            return err
        detail = "first differing key(s), approved stage against the target: " + keys_detail(spec.business_key, keys)
        return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
