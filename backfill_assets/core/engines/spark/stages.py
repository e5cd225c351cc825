"""The Spark engine's two builds: stage A keeps each key's newest row by a window
(``row_number``), stage B by an aggregate. Stage A is written as Parquet under the staging
folder, read back and fingerprinted in Spark (format 3), and sealed by the digest of its
files; stage B is fingerprinted as Spark builds it and written only where it differs from
stage A; and the plan finished from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import psycopg
import pyarrow.parquet as pq

from backfill_assets.core.context import Clock, Context
from backfill_assets.core.engines.spark import fingerprint as spark_fp
from backfill_assets.core.engines.spark.files import sha256_files
from backfill_assets.core.engines.spark.inspect import functions, windowed_input
from backfill_assets.core.engines.spark.parquet import partition_dir
from backfill_assets.core.engines.spark.session import schema_ddl, spark_type, staging_dir
from backfill_assets.core.engines.spark.snapshot import in_scope
from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.engines.spark.windows import key_column, label_columns
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.lake.lake_files import Proven, files_digest
from backfill_assets.core.pinned.pins import (
    LakeSnapshot,
    keys_detail,
    record_builds_b_kept_where_it_differs,
    record_plan,
)
from backfill_assets.core.planning import assemble
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def stage_dir(spec: Spec, variant: str) -> Path:
    return staging_dir(spec) / f"stage_{variant}"


def _seals_dir(spec: Spec, variant: str) -> Path:
    """One seal file per partition, so that builds of other partitions (another run of a
    multi-run backfill) never write the same file."""
    return staging_dir(spec) / f"seals_{variant}"


def _seal_path(spec: Spec, variant: str, label: str) -> Path:
    return _seals_dir(spec, variant) / f"{urllib.parse.quote(label, safe='')}.json"


def newest(inp: DataFrame, spec: Spec, variant: Literal["a", "b"], partitions: Sequence[PartitionValue]) -> Any:
    """Each key's newest row of the partitions: stage A by a window, stage B by aggregates.
    With records_can_move a key's newest version is chosen across the partitions (a closed
    scope holds every version of its keys), so a key that moved lands in its newest partition."""
    from pyspark.sql import Window
    F = functions()  # noqa: N806
    key = key_column(spec)
    columns = [*spec.columns, *label_columns(spec)]  # a window's label too
    grain = [*([] if spec.records_can_move else [key]), *spec.business_key]
    keyed = inp.where(in_scope(spec, partitions))
    if variant == "a":
        order = [getattr(F.col(o.column), f"{o.direction}_nulls_{o.nulls or 'last'}")() for o in spec.ordering]
        ranked = keyed.withColumn("__backfill_rank", F.row_number().over(Window.partitionBy(*grain).orderBy(*order)))
        return ranked.where(F.col("__backfill_rank") == 1).select(*columns)
    types = {f.name: f.dataType.simpleString() for f in keyed.schema.fields}
    rest = [c for c in columns if c not in grain]
    newest_first = [_newest_first(F, o, types[o.column]) for o in spec.ordering]
    if all(key is not None for key in newest_first):
        # One aggregate: the greatest struct of (ordering keys turned newest-first, then the
        # row). What ties on every key was found equal by the tie check.
        fields = [part.alias(f"__backfill_o{i}_{j}") for i, key in enumerate(newest_first) for j, part in enumerate(key)]
        best = F.max(F.struct(*fields, *[F.col(c).alias(c) for c in rest])).alias("__backfill_best")
        return keyed.groupBy(*grain).agg(best).select(
            *[F.col(c) if c in grain else F.col(f"__backfill_best.`{c}`").alias(c) for c in columns])
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
    return found.groupBy(*grain).agg(*[F.max(c).alias(c) for c in rest]).select(*columns)


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


def stage_frame(session: SparkSession, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> Any | None:
    """The stage's partitions ``values`` as a DataFrame (None: none of them has rows)."""
    base, key = stage_dir(ctx.spec, variant), key_column(ctx.spec)
    dirs = [base / partition_dir(key, v) for v in values]
    found = [str(d) for d in dirs if d.is_dir() and any(p.suffix == ".parquet" for p in d.iterdir())]
    if not found:
        return None
    # A window's label is read as the text it is (Spark's discovery would type 2024-11-03 a date).
    label = "".join(f", `{c}` STRING" for c in label_columns(ctx.spec))
    return session.read.schema(schema_ddl(ctx.target_columns) + label).option("basePath", str(base)).parquet(*found)


def stage_readings(session: SparkSession, ctx: Context, variant: str, values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of the stage's partitions ``values``, in that order (format 3, in Spark)."""
    return _in_order(stage_frame(session, ctx, variant, values), ctx, values)


def _in_order(frame: DataFrame | None, ctx: Context, values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of ``frame``'s partitions ``values``, in that order (an empty one's where it
    has no rows; None: no rows at all)."""
    spec = ctx.spec
    found = {} if frame is None else {partition_label(v): fp for v, fp in spark_fp.readings(
        frame, ctx.target_columns, spec.business_key, key_column(spec), spec.total).items()}
    return [found.get(partition_label(v)) or empty(ctx.target_columns, spec.total) for v in values]


def _files_of(directories: Sequence[Path], session: Callable[[], SparkSession]) -> list[str]:
    """The seal of each stage partition: the digest of its files' names, sizes and SHA-256
    (hashed on the executors where there is much to hash)."""
    found = [sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
             if d.is_dir() else [] for d in directories]
    digests = sha256_files([str(p) for files in found for p in files], session)
    return [files_digest([(p.name, str(p.stat().st_size), digests[str(p)]) for p in files]) for files in found]


class Seal(TypedDict):
    """A stage partition's seal: the snapshot it was built from, its readings, and the digest
    of its files' names, sizes and SHA-256."""

    snapshot_id: str
    readings: Reading
    files: str


def _recorded(spec: Spec, variant: str) -> dict[str, Seal]:
    """Every partition's seal, by label."""
    folder = _seals_dir(spec, variant)
    found: dict[str, Seal] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(FileNotFoundError):  # unsealed meanwhile by its own build
            found[urllib.parse.unquote(path.stem)] = json.loads(path.read_text())
    return found


def _seal(spec: Spec, variant: str, label: str, seal: Seal | None) -> None:
    """Record one partition's seal (None: remove it), atomically."""
    path = _seal_path(spec, variant, label)
    if seal is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(seal, sort_keys=True))
    os.replace(tmp, path)


# A build's own folder under its stage (skipped by readers: it starts with "_"), and how long
# one a killed build left is kept before a later build removes it.
_BUILDING = "_building-"
_ABANDONED_AFTER = 86400.0


def _remove_abandoned(base: Path) -> None:
    """Remove what builds killed long ago left under ``base`` (never a running build's)."""
    for folder in base.glob(f"{_BUILDING}*"):
        with contextlib.suppress(FileNotFoundError):
            if time.time() - folder.stat().st_mtime > _ABANDONED_AFTER:
                shutil.rmtree(folder, ignore_errors=True)


def build_stage(session: SparkSession, ctx: Context, snapshot: LakeSnapshot, source: SparkSource,
                variant: Literal["a", "b"], progress: Progress, *, keep: bool = True,
                values: Sequence[PartitionValue] | None = None) -> dict[str, Fingerprint]:
    """Build, write, fingerprint and seal the partitions ``values`` (default: the context's) of
    one stage. Not ``keep``: the stage's partitions are emptied, and the rows are fingerprinted
    as Spark builds them, in the target's types, and not written (stage B while it equals
    stage A: one job, where writing and reading it back were two)."""
    spec = ctx.spec
    values = list(ctx.partitions if values is None else values)
    labels = [partition_label(v) for v in values]
    step, total = f"stage {variant}", len(values)
    progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
    base = stage_dir(spec, variant)
    for label in labels:  # unsealed until rebuilt: a failed build leaves nothing that passes as built
        _seal(spec, variant, label, None)
    base.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(base)
    inp = windowed_input(session, ctx, source.frame(session, snapshot.pin), labels)
    if keep:
        _write(newest(inp, spec, variant, values), spec, base, values)
        found = stage_readings(session, ctx, variant, values)
    else:
        for value in values:
            shutil.rmtree(base / partition_dir(key_column(spec), value), ignore_errors=True)
        found = _hashed(newest(inp, spec, variant, values), ctx, values)
    out = dict(zip(labels, found))
    if keep:
        seals = _files_of([base / partition_dir(key_column(spec), v) for v in values], lambda: session)
        for label, files in zip(labels, seals):
            _seal(spec, variant, label, Seal(snapshot_id=snapshot.snapshot_id, readings=out[label].as_dict(), files=files))
    for n, (label, fp) in enumerate(out.items(), 1):
        progress(ProgressEvent(step, f"{fp.row_count} row(s)", partition=label, done=n, total=total,
                               rows=fp.row_count, status="built"))
    return out


def _write(built: DataFrame, spec: Spec, base: Path, values: Sequence[PartitionValue]) -> None:
    """The built partitions written under ``base``: apart first (a folder of this build's own,
    which readers skip), then each partition moved in, so that another run's build of other
    partitions never shares Spark's job folder."""
    private = base / f"{_BUILDING}{uuid.uuid4().hex}"
    try:
        built.write.partitionBy(key_column(spec)).parquet(str(private))
        for value in values:
            directory = partition_dir(key_column(spec), value)
            shutil.rmtree(base / directory, ignore_errors=True)
            if (private / directory).is_dir():
                os.replace(private / directory, base / directory)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _hashed(built: DataFrame, ctx: Context, values: Sequence[PartitionValue]) -> list[Fingerprint]:
    """The readings of the built rows, in the target's Spark types (as a stage is read back)."""
    F = functions()  # noqa: N806
    types = {c.name: spark_type(c) for c in ctx.target_columns}
    label = [F.col(c) for c in label_columns(ctx.spec)]
    return _in_order(built.select(*[F.col(c).cast(types[c]).alias(c) for c in ctx.spec.columns], *label), ctx, values)


def seals_hold(session: Callable[[], SparkSession], ctx: Context, variant: str,
               expected: dict[str, Reading]) -> list[str]:
    """The partitions of ``expected`` (label -> readings) whose stage no longer carries them:
    those whose seal recorded exactly those readings and whose files still have the sealed
    names, sizes and SHA-256 are unchanged (Parquet files are immutable: a change is a new
    file or a rewritten one: changed, whatever it holds); one whose seal recorded other
    readings is fingerprinted again in Spark. ``session`` gives the session, started only if
    needed."""
    spec = ctx.spec
    recorded = _recorded(spec, variant)
    base = stage_dir(spec, variant)
    # A stage's files are written once: other bytes than the sealed ones are another stage.
    sealed = [label for label in expected if label in recorded]
    now = _files_of([base / partition_dir(key_column(spec), ctx.value_of(label)) for label in sealed], session)
    changed = [label for label, files in zip(sealed, now) if recorded[label]["files"] != files]
    sealed_readings = {label: recorded[label].get("readings") for label in sealed}
    doubtful = [label for label in expected if label not in changed and sealed_readings.get(label) != expected[label]]
    if not doubtful:
        return changed
    found = stage_readings(session(), ctx, variant, [ctx.value_of(label) for label in doubtful])
    return changed + [label for label, fp in zip(doubtful, found) if fp.as_dict() != expected[label]]


def sealed(ctx: Context, variant: str, labels: Sequence[str]) -> dict[str, Proven]:
    """Each partition's seal (of those that have one) as a proof by bytes: the digest of its
    files' names, sizes and SHA-256 when it was built, and the readings of those files' rows
    (core.lake.lake_files.proved_by_bytes)."""
    out = {}
    for label in labels:
        seal = _seal_of(ctx.spec, variant, label)
        if seal is not None and seal.get("readings") is not None:
            out[label] = Proven(seal["files"], seal["readings"])
    return out


def _seal_of(spec: Spec, variant: str, label: str) -> Seal | None:
    """One partition's seal, if it has one."""
    try:
        return json.loads(_seal_path(spec, variant, label).read_text())
    except FileNotFoundError:
        return None


def build_both(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, source: SparkSource, session: SparkSession,
               clock: Clock, progress: Progress) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B (one after the other: each is a Spark job over every executor),
    and record each build in the control store. Stage B is fingerprinted as it is built and
    written only where it differs from stage A (core.pinned.pins.record_builds_b_kept_where_it_differs)."""
    a = build_stage(session, ctx, snapshot, source, "a", progress)
    b = build_stage(session, ctx, snapshot, source, "b", progress, keep=False)
    record_builds_b_kept_where_it_differs(
        control, ctx, snapshot.snapshot_id, a, b, clock,
        lambda values: build_stage(session, ctx, snapshot, source, "b", progress, values=values))
    return a, b


def unholdable(session: SparkSession, ctx: Context) -> list[str]:
    """Stage A's dates and time stamps outside the years 1 to 9999, per partition and column."""
    F = functions()  # noqa: N806
    spec = ctx.spec
    checked = [c.name for c in ctx.target_columns if c.base_type in ("date", "timestamptz")]
    frame = stage_frame(session, ctx, "a", ctx.partitions) if checked else None
    if frame is None:
        return []
    found = frame.groupBy(spec.partition_key).agg(
        *[F.sum(((F.year(c) < 1) | (F.year(c) > 9999)).cast("long")) for c in checked]).collect()
    return [
        f"partition {partition_label(r[0])}: column {name} has {n} value(s) outside the years 1 to 9999; fix them "
        "in the source or transform"
        for r in found for name, n in zip(checked, r[1:]) if n
    ]


def stage_files(ctx: Context, variant: str, labels: Sequence[str]) -> dict[str, list[str]]:
    """Each stage partition's data files (full paths), by label."""
    base = stage_dir(ctx.spec, variant)
    out = {}
    for label in labels:
        directory = base / partition_dir(key_column(ctx.spec), ctx.value_of(label))
        out[label] = [str(p) for p in sorted(directory.glob("*.parquet"))] if directory.is_dir() else []
    return out


def stage_rows(ctx: Context, variant: str, labels: Sequence[str]) -> dict[str, int]:
    """Each stage partition's row count, from its files' footers (no row is read)."""
    return {label: sum(pq.ParquetFile(p).metadata.num_rows for p in paths)
            for label, paths in stage_files(ctx, variant, labels).items()}


def finish_plan(control: psycopg.Connection, ctx: Context, snapshot: LakeSnapshot, session: SparkSession,
                reports: dict[str, tuple[int, int]], a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                clock: Clock, progress: Progress) -> Plan:
    """Compare the stages, store the plan; a refused plan's differing stage partitions are
    deleted so that nothing can apply them."""
    from backfill_assets.core.engines.spark.compare import differing_keys
    from backfill_assets.core.engines.spark.moves import linked_problems
    spec = ctx.spec
    problems = unholdable(session, ctx) + linked_problems(ctx)
    differ = [label for label in ctx.labels if a[label] != b[label]]
    if differ:
        found = differing_keys(session, ctx, stage_files(ctx, "a", differ), stage_files(ctx, "b", differ))
        problems += [f"partition {label}: first differing key(s), stage A against stage B: "
                     + keys_detail(spec.business_key, found[label]) for label in differ]
    plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested, problems)  # type: ignore[arg-type]
    if plan.status == "refused":
        for entry in plan.document.partitions:
            if not entry.match:
                for v in ("a", "b"):
                    shutil.rmtree(stage_dir(spec, v) / partition_dir(key_column(spec), ctx.value_of(entry.partition)),
                                  ignore_errors=True)
    return record_plan(control, spec, plan, snapshot.snapshot_id, clock, progress)
