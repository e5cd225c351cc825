"""The Spark engine's snapshot: the declared partitions pinned (a Parquet folder's files, or a
JDBC table's one copy), counted and checked in Spark, and named by the digest of their files.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from backfill_assets.core.context import Clock, Context
from backfill_assets.core.engines.spark import fingerprint as spark_fp
from backfill_assets.core.engines.spark.inspect import fields_of, functions, types_of, windowed_input
from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.engines.spark.windows import key_column, labelled, spans, windows_frame
from backfill_assets.core.fingerprint.rows import Digest
from backfill_assets.core.lake.target import parts_of
from backfill_assets.core.pinned.pins import LakeSnapshot, record_snapshot
from backfill_assets.core.planning import Outside, Tie, Ties, check_source_counts
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def in_scope(spec: Spec, partitions: Sequence[PartitionValue]) -> Any:
    F = functions()  # noqa: N806
    cond = F.col(key_column(spec)).isin(list(partitions))
    for k in spec.business_key:
        cond = cond & F.col(k).isNotNull()
    return cond


def check_source(inp: DataFrame, ctx: Context) -> dict[str, tuple[int, int]]:
    """Refuse source data newest-wins cannot rebuild exactly, by the rules every engine applies
    (core.planning.check_source_counts, over :class:`_Counts`); return each partition's (rows
    read, rows with a NULL key).

    Raises:
        SourceDataError: rows outside the declared partitions, NULLs in an ordering column
            without declared NULL placement, ties on every ordering column between rows that
            differ, a partition whose every row has a NULL key.
    """
    return check_source_counts(ctx.spec, _Counts(inp, ctx), "loaded")


class _Counts:
    """The source checks' counts of the input ``inp``: one Spark aggregate answers the rows
    outside the partitions, the ordering columns' NULLs and the input report; the ties are a
    second job, run only when those pass."""

    def __init__(self, inp: DataFrame, ctx: Context) -> None:
        self.inp, self.ctx = inp, ctx

    @functools.cached_property
    def everything(self) -> list[Any]:
        """Per partition value of the input: its rows, those with a NULL key, and those with a
        NULL in each ordering column (of the keyed rows)."""
        F = functions()  # noqa: N806
        spec = self.ctx.spec
        null_key = F.lit(False)
        for k in spec.business_key:
            null_key = null_key | F.col(k).isNull()
        return self.inp.groupBy(F.col(key_column(spec)).alias("p")).agg(
            F.count(F.lit(1)), F.sum(null_key.cast("long")),
            *[F.sum((F.col(o.column).isNull() & ~null_key).cast("long")) for o in spec.ordering]).collect()

    def outside(self) -> Outside:
        declared = set(self.ctx.labels)
        outside = sorted(((("NULL" if r[0] is None else partition_label(r[0])), int(r[1])) for r in self.everything
                          if r[0] is None or partition_label(r[0]) not in declared), key=lambda o: (-o[1], o[0]))[:3]
        return Outside(sum(n for _, n in outside), outside)

    def ordering_nulls(self) -> list[int]:
        return [sum(int(r[3 + i] or 0) for r in self.everything) for i in range(len(self.ctx.spec.ordering))]

    def reports(self) -> dict[str, tuple[int, int]]:
        return {partition_label(r[0]): (int(r[1]), int(r[2] or 0)) for r in self.everything}

    def ties(self) -> Ties:
        F = functions()  # noqa: N806
        spec, ctx = self.ctx.spec, self.ctx
        ordering = [o.column for o in spec.ordering]
        # A key that can move has one newest version across partitions, so ties are per key.
        scope = [] if spec.records_can_move else [key_column(spec)]
        group = [*scope, *spec.business_key, *ordering]
        keyed = self.inp.where(in_scope(spec, ctx.partitions))
        # Groups of one row (nearly all) are found by a plain GROUP BY; only the rows of the others
        # are rendered and compared, by their canonical text (the output rows decide).
        several = keyed.groupBy(*group).count().where(F.col("count") > 1).drop("count")
        left, right = keyed.alias("l"), several.alias("r")
        same = None
        for c in group:
            cond = F.col(f"l.`{c}`").eqNullSafe(F.col(f"r.`{c}`"))
            same = cond if same is None else same & cond
        # The text is projected first: Spark counts a double's rendering (``reflect``) as not
        # deterministic, which no aggregate may take as its argument.
        text = spark_fp.row_text(fields_of(ctx.target_columns)).alias("__text")
        grain = [*scope, *spec.business_key]
        tied = (left.join(right, same, "left_semi").select(*[F.col(c) for c in grain], text).groupBy(*grain)
                .agg(F.count_distinct("__text").alias("n")).where(F.col("n") > 1).limit(3).collect())
        width = len(scope)  # each row: (partition,)? key values..., different rows
        return Ties(len(tied), [Tie(tuple(r[:width]), tuple(r[width:-1]), r[-1]) for r in tied])


def take_snapshot(control: psycopg.Connection, ctx: Context, source: SparkSource, session: SparkSession, clock: Clock,
                  progress: Progress) -> tuple[LakeSnapshot, Context]:
    """Pin the declared partitions, count and check them, and record the snapshot in the
    control store."""
    spec = ctx.spec
    requested = list(ctx.labels)
    pin = source.latest(session, spec.partition_key, parts_of(ctx))
    progress(ProgressEvent("snapshot", f"pinned {spec.source_name} at {pin.version[:16]}"))
    if spec.records_can_move:
        from backfill_assets.core.engines.spark.moves import moved_scope
        pin, ctx = moved_scope(control, ctx, source, session, pin, progress)
    frame = source.frame(session, pin)
    names = {n for n, _ in types_of(frame)}
    columns = [c for c in ctx.inspection.source_columns if c.name in names]
    reports = check_source(windowed_input(session, ctx, frame), ctx)
    if ctx.transform is None:  # the input is the source
        counts = {label: n for label, (n, _) in reports.items()}
    else:
        rows = frame if ctx.windowing is None else labelled(
            frame, spec.partition_key, windows_frame(session, spans(ctx), key_column(spec)))
        counts = {partition_label(r[0]): int(r[1]) for r in rows.groupBy(key_column(spec)).count().collect()
                  if r[0] is not None}
    files = source.signature_at(pin, spec.partition_key, parts_of(ctx))
    parts = {label: Digest(row_count=counts.get(label, 0), content_hash=files[label]) for label in ctx.labels}
    return record_snapshot(control, ctx, pin, columns, parts, requested, reports, clock), ctx


def input_reports(session: SparkSession, ctx: Context, snapshot: LakeSnapshot, source: SparkSource) -> dict[str, tuple[int, int]]:
    F = functions()  # noqa: N806
    spec = ctx.spec
    inp = windowed_input(session, ctx, source.frame(session, snapshot.pin))
    null_key = F.lit(False)
    for k in spec.business_key:
        null_key = null_key | F.col(k).isNull()
    found = inp.groupBy(key_column(spec)).agg(F.count(F.lit(1)), F.sum(null_key.cast("long"))).collect()
    return {partition_label(r[0]): (int(r[1]), int(r[2] or 0)) for r in found}
