"""The whole process on Apache Spark, for a spec with ``engine: {type: spark}``: the source
pinned (a Parquet folder's files, or a JDBC table's one copy; core.spark.source), both builds
in Spark, and a Parquet folder target replaced one partition at a time by an atomic directory
swap (core.targets.parquet) through the same apply protocol as every other target.

- Snapshot (:func:`take_snapshot`): the declared partitions are pinned, counted and checked
  in Spark (rows outside the partitions, NULL ordering values, ties, keyless partitions), and
  named by the digest of their files at the pin. The record goes to the control store.
- Stages (:func:`build_both`): stage A keeps each key's newest row by a window
  (``row_number``); stage B by an aggregate: the greatest struct of the ordering values
  turned newest-first (NULL placement as a flag, ascending values negated) and the row
  (where an ascending column is text, per ordering column the newest value joined back). Each is written as Parquet under the staging folder (``stage_a/``, ``stage_b/``),
  read back and fingerprinted in Spark (format 3, equal to PostgreSQL's and DuckDB's for the
  same rows), and sealed: the readings and the digest of each partition's files (sizes and
  SHA-256) go to ``seals_<stage>.json``.
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
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import psycopg
import pyarrow as pa
import pyarrow.dataset as pads

from backfill_assets.core.build import SourceMoves, StagesNow
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.duck import statements
from backfill_assets.core.duck.source import files_digest, sha256_file
from backfill_assets.core.duck.watch import lake_changes
from backfill_assets.core.errors import ApprovalError, SourceDataError, SpecError, StageError, VerificationError
from backfill_assets.core.fingerprint import rows
from backfill_assets.core.fingerprint import spark as spark_fp
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg.catalog import ColumnInfo, Inspection, ServerInfo
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.pinned import (
    LakeSnapshot,
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
from backfill_assets.core.spark.session import column_info, schema_ddl, session_for, staging_dir, unsupported
from backfill_assets.core.spark.source import SparkSource, spark_source
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.targets import engine_for
from backfill_assets.core.targets.lake import LakeEngine, StagedLakeTarget
from backfill_assets.core.targets.parquet import partition_dir
from backfill_assets.core.vocabulary import PartitionRequest, PartitionValue, parse_labels, partition_label

SOURCE_VIEW = "source"  # what transform_sql reads, in the step's own session


def _F() -> Any:  # noqa: N802 - pyspark.sql.functions, imported where Spark is used
    from pyspark.sql import functions
    return functions


def _fields(columns: Sequence[ColumnInfo]) -> list[tuple[str, str]]:
    return [(c.name, rows.kind_of(c)) for c in columns]


# -- inspection ---------------------------------------------------------------------------

def _types(frame: Any) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]


def _input(session: Any, frame: Any, spec: Spec, transform: str | None) -> Any:
    """The input of newest-wins: the source (``frame``) through the transform, as the spec's
    input columns."""
    if transform is None:
        return frame.select(*spec.input_columns)
    frame.createOrReplaceTempView(SOURCE_VIEW)
    return session.sql(transform).select(*spec.input_columns)


def inspect(conn: psycopg.Connection | None, spec: Spec, source: SparkSource, session: Any) -> tuple[Inspection, str | None]:
    """Inspect the source (its newest columns, no row read) and the Parquet target, collecting
    every problem; return the inspection and the validated transform.

    Raises:
        SpecError, TransformError: the source cannot be read, or the transform is refused.
    """
    import pyspark
    frame = source.schema_frame(session)
    types = _types(frame)
    inspection = Inspection(ServerInfo("spark", pyspark.__version__, 0, "UTF8"),
                            [c for c in (column_info(n, t) for n, t in types) if c is not None], [], [], None, [], None)
    problems = inspection.problems
    transform = None
    if spec.transform_sql is not None:
        from backfill_assets.core.guard.spark import check_spark_transform
        transform = check_spark_transform(spec.transform_sql, types)
    else:
        missing = [c for c in spec.input_columns if c not in dict(types)]
        if missing:
            problems.append(f"source {spec.source_name} has no column(s) {', '.join(missing)}; check columns and "
                            "ordering against the source")
            return inspection, transform
    try:
        found = _types(_input(session, frame, spec, transform))
    except Exception as err:  # noqa: BLE001 - Spark's analysis errors, reported as the spec's
        raise SpecError(f"the input of spec {spec.name} cannot be read in Spark: "
                        f"{' '.join(str(err).split())[:300]}") from None
    by_name: dict[str, ColumnInfo] = {}
    for name, spark_type in found:
        info = column_info(name, spark_type)
        if info is None:
            problems.append(unsupported(name, spark_type))
        else:
            by_name[name] = info
    if problems:
        return inspection, transform
    engine = engine_for(spec)
    assert isinstance(engine, LakeEngine)
    engine.inspect_table(conn, inspection, by_name)  # type: ignore[arg-type]
    return inspection, transform


def resolve(conn: psycopg.Connection | None, spec: Spec, request: PartitionRequest | list[str], source: SparkSource,
            session: Any) -> Context:
    """Inspect read-only and validate everything about a Spark spec before any write."""
    inspection, transform = inspect(conn, spec, source, session)
    kind = inspection.require_plannable()
    partitions = request.resolve(kind) if isinstance(request, PartitionRequest) else parse_labels(request, kind)
    engine = engine_for(spec)
    engine.check_partitions(partitions)
    return Context(spec, engine, inspection, partitions, transform)


# -- the snapshot --------------------------------------------------------------------------

def _keyed(spec: Spec, partitions: Sequence[PartitionValue]) -> Any:
    F = _F()  # noqa: N806
    cond = F.col(spec.partition_key).isin(list(partitions))
    for k in spec.business_key:
        cond = cond & F.col(k).isNotNull()
    return cond


def check_source(inp: Any, ctx: Context) -> dict[str, tuple[int, int]]:
    """Refuse source data newest-wins cannot rebuild exactly, as the other engines do; return
    each partition's (rows read, rows with a NULL key).

    Raises:
        SourceDataError: rows outside the declared partitions, NULLs in an ordering column
            without declared NULL placement, ties on every ordering column between rows that
            differ, a partition whose every row has a NULL key.
    """
    F = _F()  # noqa: N806
    spec = ctx.spec
    pk = F.col(spec.partition_key)
    null_key = F.lit(False)
    for k in spec.business_key:
        null_key = null_key | F.col(k).isNull()
    # One aggregate over the input: per partition value, its rows, those with a NULL key, and
    # those with a NULL in each ordering column; values outside the declared ones are refused.
    everything = inp.groupBy(pk.alias("p")).agg(
        F.count(F.lit(1)), F.sum(null_key.cast("long")),
        *[F.sum((F.col(o.column).isNull() & ~null_key).cast("long")) for o in spec.ordering]).collect()
    declared = set(ctx.labels)
    outside = sorted(((("NULL" if r[0] is None else partition_label(r[0])), int(r[1])) for r in everything
                      if r[0] is None or partition_label(r[0]) not in declared), key=lambda o: (-o[1], o[0]))[:3]
    if outside:
        raise SourceDataError(
            "the input has rows outside the declared partitions (the transform moves them, or they have a "
            "NULL partition key)", "Keep the partition key as the source has it in transform_sql",
            [f"partition {label}: {n} row(s)" for label, n in outside],
        )
    found = everything
    reports = {partition_label(r[0]): (int(r[1]), int(r[2] or 0)) for r in found}
    nulls = [sum(int(r[3 + i] or 0) for r in found) for i in range(len(spec.ordering))]
    undeclared = [f"{o.column}: {n} row(s)" for o, n in zip(spec.ordering, nulls) if n and o.nulls is None]
    if undeclared:
        raise SourceDataError(
            "ordering columns have NULL values and no declared NULL placement",
            "Declare where NULLs sort with `nulls: first` or `nulls: last` on that ordering column, or fix the source",
            undeclared,
        )
    keyless = [f"partition {label}: {n} row(s)" for label, (n, k) in reports.items() if n and k == n]
    if keyless:
        raise SourceDataError(
            "every source row of some partitions has a NULL business key "
            f"({', '.join(spec.business_key)}), so the rebuild would empty them",
            "Check business_key against the source (run `backfill-assets profile`)", keyless[:3],
        )
    ordering = [o.column for o in spec.ordering]
    group = [spec.partition_key, *spec.business_key, *ordering]
    keyed = inp.where(_keyed(spec, ctx.partitions))
    # Groups of one row (nearly all) are found by a plain GROUP BY; only the rows of the others
    # are rendered and compared, by their canonical text (the output rows decide).
    several = keyed.groupBy(*group).count().where(F.col("count") > 1).drop("count")
    left, right = keyed.alias("l"), several.alias("r")
    same = None
    for c in group:
        cond = F.col(f"l.`{c}`").eqNullSafe(F.col(f"r.`{c}`"))
        same = cond if same is None else same & cond
    text = spark_fp.row_text(_fields(ctx.target_columns))
    tied = (left.join(right, same, "left_semi").groupBy(*[F.col(c) for c in [spec.partition_key, *spec.business_key]])
            .agg(F.count_distinct(text).alias("n")).where(F.col("n") > 1).limit(3).collect())
    if tied:
        raise SourceDataError(
            f"rows tie on every ordering column ({', '.join(ordering)}) within a key but differ, so newest-wins would "
            "pick one of them by chance", "Add a final tiebreak column to ordering (an ingest sequence, a unique id)",
            [", ".join(f"{k}={v}" for k, v in zip([spec.partition_key, *spec.business_key], r[:-1]))
             + f" ({r[-1]} different rows)" for r in tied],
        )
    return reports


def take_snapshot(control: psycopg.Connection, ctx: Context, source: SparkSource, session: Any, clock: Clock,
                  progress: Progress) -> tuple[LakeSnapshot, Context]:
    """Pin the declared partitions, count and check them, and record the snapshot in the
    control store."""
    spec = ctx.spec
    requested = list(ctx.labels)
    pin = source.latest(session, spec.partition_key, ctx.partitions)
    progress(ProgressEvent("snapshot", f"pinned {spec.source_name} at {pin.version[:16]}"))
    frame = source.frame(session, pin)
    names = {n for n, _ in _types(frame)}
    columns = [c for c in ctx.inspection.source_columns if c.name in names]
    reports = check_source(_input(session, frame, spec, ctx.transform), ctx)
    counts = ({label: n for label, (n, _) in reports.items()} if ctx.transform is None  # the input is the source
              else {partition_label(r[0]): int(r[1]) for r in frame.groupBy(spec.partition_key).count().collect()})
    files = source.signature_at(pin, spec.partition_key, ctx.partitions)
    parts = {label: {"row_count": counts.get(label, 0), "content_hash": files[label]} for label in ctx.labels}
    return record_snapshot(control, ctx, pin, columns, parts, requested, reports, clock), ctx


# -- the stages ------------------------------------------------------------------------------

def stage_dir(spec: Spec, variant: str) -> Path:
    return staging_dir(spec) / f"stage_{variant}"


def _seals_path(spec: Spec, variant: str) -> Path:
    return staging_dir(spec) / f"seals_{variant}.json"


def newest(inp: Any, spec: Spec, variant: Literal["a", "b"], partitions: Sequence[PartitionValue]) -> Any:
    """Each key's newest row of the partitions: stage A by a window, stage B by aggregates."""
    from pyspark.sql import Window
    F = _F()  # noqa: N806
    grain = [spec.partition_key, *spec.business_key]
    keyed = inp.where(_keyed(spec, partitions))
    if variant == "a":
        order = [getattr(F.col(o.column), f"{o.direction}_nulls_{o.nulls or 'last'}")() for o in spec.ordering]
        ranked = keyed.withColumn("__backfill_rank", F.row_number().over(Window.partitionBy(*grain).orderBy(*order)))
        return ranked.where(F.col("__backfill_rank") == 1).select(*spec.columns)
    types = {f.name: f.dataType.simpleString() for f in keyed.schema.fields}
    rest = [c for c in spec.columns if c not in grain]
    newest_first = [_newest_first(F, o, types[o.column]) for o in spec.ordering]
    if all(key is not None for key in newest_first):
        # One aggregate: the greatest struct of (ordering keys turned newest-first, then the
        # row). What ties on every key was found equal by the tie check.
        fields = [part.alias(f"__backfill_o{i}_{j}") for i, key in enumerate(newest_first) for j, part in enumerate(key)]
        best = F.max(F.struct(*fields, *[F.col(c).alias(c) for c in rest])).alias("__backfill_best")
        return keyed.groupBy(*grain).agg(best).select(
            *[F.col(c) if c in grain else F.col(f"__backfill_best.`{c}`").alias(c) for c in spec.columns])
    # A text, binary, boolean or double column ordered ascending has no newest-first form: per ordering
    # column in turn, each key's newest value is joined back to its rows.
    found = keyed
    for o in spec.ordering:
        c = F.col(o.column)
        value = F.max(c) if o.direction == "desc" else F.min(c)
        if o.nulls == "first":  # a NULL sorts first: it is the newest wherever the key has one
            value = F.when(F.max(c.isNull().cast("int")) == 1, F.lit(None)).otherwise(value)
        winners = found.groupBy(*grain).agg(value.alias("__backfill_best"))
        found = (found.join(winners, on=grain).where(c.eqNullSafe(F.col("__backfill_best")))
                 .drop("__backfill_best"))
    return found.groupBy(*grain).agg(*[F.max(c).alias(c) for c in rest]).select(*spec.columns)


_NEGATED = {"int": "decimal(38,0)", "bigint": "decimal(38,0)"}  # a double: NaN sorts last either way


def _newest_first(F: Any, o: Any, spark_type: str) -> tuple[Any, Any] | None:  # noqa: N803
    """(NULL placement flag, value), both greatest for the newest row, or None where the
    value cannot be turned (an ascending text, binary, boolean or double column)."""
    c = F.col(o.column)
    flag = c.isNull() if o.nulls == "first" else c.isNotNull()
    if o.direction == "desc":
        return flag, c
    if spark_type in _NEGATED:
        return flag, -c.cast(_NEGATED[spark_type])
    if spark_type.startswith("decimal("):
        return flag, -c
    if spark_type == "date":
        return flag, -F.unix_date(c)
    if spark_type == "timestamp":
        return flag, -F.unix_micros(c)
    return None


def _stage_frame(session: Any, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> Any | None:
    """The stage's partitions ``values`` as a DataFrame (None: none of them has rows)."""
    base = stage_dir(ctx.spec, variant)
    dirs = [base / partition_dir(ctx.spec.partition_key, v) for v in values]
    found = [str(d) for d in dirs if d.is_dir() and any(p.suffix == ".parquet" for p in d.iterdir())]
    if not found:
        return None
    return session.read.schema(schema_ddl(ctx.target_columns)).option("basePath", str(base)).parquet(*found)


def stage_readings(session: Any, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of the stage's partitions ``values``, in that order (format 3, in Spark)."""
    spec = ctx.spec
    frame = _stage_frame(session, ctx, variant, values)
    found = {} if frame is None else {partition_label(v): fp for v, fp in spark_fp.readings(
        frame, ctx.target_columns, spec.business_key, spec.partition_key, spec.total).items()}
    return [found.get(partition_label(v)) or empty(ctx.target_columns, spec.total) for v in values]


def _files_of(directory: Path) -> str:
    """The seal of a stage partition: the digest of its files' names, sizes and SHA-256."""
    if not directory.is_dir():
        return files_digest([])
    return files_digest([(p.name, str(p.stat().st_size), sha256_file(p))
                         for p in sorted(directory.iterdir()) if p.is_file() and not p.name.startswith(("_", "."))])


def _recorded(spec: Spec, variant: str) -> dict[str, Any]:
    path = _seals_path(spec, variant)
    return json.loads(path.read_text()) if path.is_file() else {}


def _record(spec: Spec, variant: str, seals: dict[str, Any]) -> None:
    path = _seals_path(spec, variant)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(seals, sort_keys=True))
    os.replace(tmp, path)


def build_stage(session: Any, ctx: Context, snapshot: LakeSnapshot, source: SparkSource,
                variant: Literal["a", "b"], progress: Progress) -> dict[str, Fingerprint]:
    """Build, write, fingerprint and seal every partition of one stage."""
    spec = ctx.spec
    step, total = f"stage {variant}", len(ctx.partitions)
    progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
    base = stage_dir(spec, variant)
    seals = _recorded(spec, variant)
    for label in ctx.labels:  # unsealed until rebuilt: a failed build leaves nothing that passes as built
        seals.pop(label, None)
    base.mkdir(parents=True, exist_ok=True)
    _record(spec, variant, seals)
    for value in ctx.partitions:
        shutil.rmtree(base / partition_dir(spec.partition_key, value), ignore_errors=True)
    shutil.rmtree(base / "_temporary", ignore_errors=True)  # a killed build's task output: never merged in
    inp = _input(session, source.frame(session, snapshot.pin), spec, ctx.transform)
    newest(inp, spec, variant, ctx.partitions).write.mode("append").partitionBy(spec.partition_key).parquet(str(base))
    found = stage_readings(session, ctx, variant, ctx.partitions)
    out = dict(zip(ctx.labels, found))
    for label, value in zip(ctx.labels, ctx.partitions):
        seals[label] = {"snapshot_id": snapshot.snapshot_id, "readings": out[label].as_dict(),
                        "files": _files_of(base / partition_dir(spec.partition_key, value))}
    _record(spec, variant, seals)
    for n, (label, fp) in enumerate(out.items(), 1):
        progress(ProgressEvent(step, f"{fp.row_count} row(s)", partition=label, done=n, total=total,
                               rows=fp.row_count, status="built"))
    return out


def seals_hold(session: Any | None, ctx: Context, variant: str, expected: dict[str, dict[str, Any]]) -> list[str]:
    """The partitions of ``expected`` (label -> readings) whose stage no longer carries them:
    those whose seal recorded exactly those readings and whose files still have the sealed
    names, sizes and SHA-256 are unchanged (Parquet files are immutable: a change is a new
    file or a rewritten one: changed, whatever it holds); one whose seal recorded other
    readings is fingerprinted again in Spark."""
    spec = ctx.spec
    recorded = _recorded(spec, variant)
    base = stage_dir(spec, variant)
    # A stage's files are written once: other bytes than the sealed ones are another stage.
    changed = [label for label in expected if label in recorded and recorded[label]["files"] != _files_of(
        base / partition_dir(spec.partition_key, ctx.value_of(label)))]
    doubtful = [label for label in expected
                if label not in changed and recorded.get(label, {}).get("readings") != expected[label]]
    if not doubtful:
        return changed
    if session is None:
        session = session_for(spec)
    found = stage_readings(session, ctx, variant, [ctx.value_of(label) for label in doubtful])
    return changed + [label for label, fp in zip(doubtful, found) if fp.as_dict() != expected[label]]


def build_both(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, source: SparkSource, session: Any,
               clock: Clock, progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B (one after the other: each is a Spark job over every executor),
    and record each build in the control store."""
    a = build_stage(session, ctx, snapshot, source, "a", progress)
    b = build_stage(session, ctx, snapshot, source, "b", progress)
    record_builds(control, ctx.spec, snapshot.snapshot_id, {"a": a, "b": b}, clock)
    return a, b


def _unholdable(session: Any, ctx: Context) -> list[str]:
    """Stage A's dates and time stamps outside the years 1 to 9999, per partition and column."""
    F = _F()  # noqa: N806
    spec = ctx.spec
    checked = [c.name for c in ctx.target_columns if c.base_type in ("date", "timestamptz")]
    frame = _stage_frame(session, ctx, "a", ctx.partitions) if checked else None
    if frame is None:
        return []
    found = frame.groupBy(spec.partition_key).agg(
        *[F.sum(((F.year(c) < 1) | (F.year(c) > 9999)).cast("long")) for c in checked]).collect()
    return [
        f"partition {partition_label(r[0])}: column {name} has {n} value(s) outside the years 1 to 9999; fix them "
        "in the source or transform"
        for r in found for name, n in zip(checked, r[1:]) if n
    ]


def _arrow_stage(ctx: Context, variant: str, label: str) -> pa.Table:
    """One stage partition's rows in Arrow, in the target's schema and business-key order."""
    spec = ctx.spec
    schema = lake_schema(ctx.target_columns)
    directory = stage_dir(spec, variant) / partition_dir(spec.partition_key, ctx.value_of(label))
    files = [str(p) for p in sorted(directory.glob("*.parquet"))] if directory.is_dir() else []
    if not files:
        return schema.empty_table()
    data = pads.dataset(files, format="parquet").to_table()
    value = ctx.value_of(label)
    data = data.append_column(spec.partition_key, pa.array([value] * data.num_rows, schema.field(spec.partition_key).type))
    return data.select(list(spec.columns)).cast(schema).sort_by([(k, "ascending") for k in spec.business_key])


@contextlib.contextmanager
def _compared(ctx: Context, left: pa.Table, right: pa.Table) -> Iterator[Any]:
    """An in-memory DuckDB connection with ``left`` as stage_rows and ``right`` as
    target_rows (core.duck.statements compares them by canonical text)."""
    import duckdb
    con = duckdb.connect()
    try:
        con.register("stage_rows", left.select(list(ctx.spec.columns)))
        con.register("target_rows", right.select(list(ctx.spec.columns)) if right.num_rows else
                     lake_schema(ctx.target_columns).empty_table())
        yield con
    finally:
        con.close()


def _differing_keys(ctx: Context, label: str, left: pa.Table, right: pa.Table) -> list[tuple]:
    spec = ctx.spec
    with _compared(ctx, left, right) as con:
        return con.execute(statements.differing_keys("stage_rows", "target_rows", spec.partition_key,
                                                     spec.business_key, _fields(ctx.target_columns)),
                           {"partition": ctx.value_of(label)}).fetchall()


def finish_plan(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, session: Any,
                reports: dict[str, tuple[int, int]], a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                clock: Clock, progress: Progress) -> Plan:
    """Compare the stages, store the plan; a refused plan's differing stage partitions are
    deleted so that nothing can apply them."""
    spec = ctx.spec
    problems = _unholdable(session, ctx)
    for label in ctx.labels:
        if a[label] != b[label]:
            keys = _differing_keys(ctx, label, _arrow_stage(ctx, "a", label), _arrow_stage(ctx, "b", label))
            problems.append(f"partition {label}: first differing key(s), stage A against stage B: "
                            + keys_detail(spec.business_key, keys))
    plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested, problems)  # type: ignore[arg-type]
    if plan.status == "refused":
        for entry in plan.document.partitions:
            if not entry.match:
                for v in ("a", "b"):
                    shutil.rmtree(stage_dir(spec, v) / partition_dir(spec.partition_key, ctx.value_of(entry.partition)),
                                  ignore_errors=True)
    return record_plan(control, spec, plan, snapshot.snapshot_id, clock, progress)


# -- the steps -------------------------------------------------------------------------------

def _reports(session: Any, ctx: Context, snapshot: LakeSnapshot, source: SparkSource) -> dict[str, tuple[int, int]]:
    F = _F()  # noqa: N806
    spec = ctx.spec
    inp = _input(session, source.frame(session, snapshot.pin), spec, ctx.transform)
    null_key = F.lit(False)
    for k in spec.business_key:
        null_key = null_key | F.col(k).isNull()
    found = inp.groupBy(spec.partition_key).agg(F.count(F.lit(1)), F.sum(null_key.cast("long"))).collect()
    return {partition_label(r[0]): (int(r[1]), int(r[2] or 0)) for r in found}


# -- approval and apply ----------------------------------------------------------------------

class SparkTarget(StagedLakeTarget):
    """A Spark spec's target (a Parquet folder or a catalog table), whose approved rows come
    from stage A's files (targets.lake.StagedLakeTarget)."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        engine = ctx.engine
        assert isinstance(engine, LakeEngine)
        super().__init__(conn, control, ctx, engine.table(control), checkpoint)

    def read_stage(self, label: str) -> pa.Table:
        return _arrow_stage(self.ctx, "a", label)


class SparkBuildEngine:
    """The Spark build engine (core.build.BuildEngine): the source pinned, both stages built
    in Spark; plans, approvals and the ledger in the control store (``control``). For approval
    and apply, Spark is started only where a seal does not hold (the stage is then
    fingerprinted again)."""

    REFUSES = {
        "diff": "`diff` reads a PostgreSQL source and stages; it does not support engine spark yet (plan, approve, "
                "apply, status and inspect do; approve shows each partition's changes)",
        "profile": "`profile` reads a PostgreSQL source and stages; it does not support engine spark yet (plan, "
                   "approve, apply, status and inspect do)",
    }

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory, spec: Spec,
                 source: SparkSource) -> None:
        self.conn, self.control, self.factory, self.spec, self.source = conn, control, factory, spec, source
        self._target: SparkTarget | None = None
        self._session: Any | None = None

    @classmethod
    @contextlib.contextmanager
    def opened(cls, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory,
               spec: Spec) -> Iterator[SparkBuildEngine]:
        """The spec's source, open for the block; the session is started when first asked for."""
        source = spark_source(spec)
        try:
            yield cls(conn, control, factory, spec, source)
        finally:
            source.close()

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

    def load_snapshot(self, snapshot_id: str) -> tuple[LakeSnapshot, Context]:
        snapshot, ctx = load_snapshot(self.control, self.resolve, self.spec, snapshot_id)
        require_pin(self.source, self.spec, snapshot, ctx)
        return snapshot, ctx

    def build_both(self, ctx: Context, snapshot: LakeSnapshot, clock: Clock,
                   progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
        return build_both(self.control, ctx, snapshot, self.source, self.session, clock, progress)

    def finish_plan(self, ctx: Context, snapshot: LakeSnapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                    clock: Clock, progress: Progress) -> Plan:
        reports = snapshot.reports if snapshot.reports is not None else _reports(self.session, ctx, snapshot, self.source)
        return finish_plan(self.control, ctx, snapshot, self.session, reports, a, b, clock, progress)

    def stages_now(self, labels: list[str]) -> StagesNow:
        spec = self.spec
        if not store.control_ready(self.control, spec.control_schema):
            raise StageError(f"the stages of spec {spec.name} have never been built; materialize both stages first")
        ctx = self.resolve(labels)
        now = {}
        for v in ("a", "b"):
            if not stage_dir(spec, v).is_dir():
                raise StageError(f"stage {v.upper()} of spec {spec.name} has never been built; materialize both "
                                 "stages first")
            now[v] = dict(zip(ctx.labels, stage_readings(self.session, ctx, v, ctx.partitions)))
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
        fields = _fields(ctx.target_columns)
        try:
            handle = target.table.open()
            for label in stored.labels:
                value = ctx.value_of(label)
                now = target.table.read(handle, spec.partition_key, [value])
                with _compared(ctx, _arrow_stage(ctx, "a", label), now) as con:
                    added, removed, changed, unchanged = con.execute(statements.change_counts(
                        "stage_rows", "target_rows", spec.partition_key, spec.business_key, fields),
                        {"partition": value}).fetchall()[0]
                    out[label] = {"added": int(added), "removed": int(removed), "changed": int(changed),
                                  "unchanged": int(unchanged)}
                    if first:
                        rows = con.execute(statements.first_changes(
                            "stage_rows", "target_rows", spec.partition_key, spec.business_key, fields, first),
                            {"partition": value}).fetchall()
                        out[label]["first"] = statements.first_changes_json(rows, spec.business_key)
        finally:
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
            return target.readings_of(_arrow_stage(ctx, "a", label))
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
            keys = _differing_keys(ctx, err.partition, _arrow_stage(ctx, "a", err.partition), now)
        except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
            return err
        if not keys:
            return err
        detail = "first differing key(s), approved stage against the target: " + keys_detail(spec.business_key, keys)
        return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
