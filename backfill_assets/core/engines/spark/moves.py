"""records_can_move on Spark: the partitions a moved key leaves or enters, found in Spark (the
same closure as every engine, core.moves.close_scope_with), over every partition of the source
(the pinned partitions as pinned, the others as they are now) and the target's keys.

A Parquet folder's pin (or a JDBC copy) holds only the partitions it was taken for, so the
partitions the closure adds are pinned too and the closure runs again at that pin, until the
pin holds the scope. The builds then choose each key's newest version across the scope.

With time windows a key's home is its newest version's time stamp and its place in the target
the target row's, each placed in its window by the calendar (core.moves.placed); the source's
rows outside the pinned windows are read as they are now.

Partitions that moved keys link must be replaced together; a Parquet folder swaps one
partition's directory at a time, so such a plan is refused before anything moves.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from backfill_assets.core.context import Context
from backfill_assets.core.engines.spark.inspect import functions
from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.engines.spark.windows import (
    collectable,
    collected,
    labelled,
    outside,
    restricted,
    spans,
    windows_frame,
)
from backfill_assets.core.errors import SnapshotError
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.lake.engine import lake_engine_for, refuse_keys_in_several_partitions
from backfill_assets.core.lake.target import parts_of
from backfill_assets.core.moves import close_scope_with, placed
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    import psycopg
    from pyspark.sql import DataFrame, SparkSession

# How often the source is pinned again for the partitions moved keys add (each round the
# scope can only grow unless the source changes meanwhile).
PIN_ROUNDS = 5


def _target_keys(session: SparkSession, control: psycopg.Connection, ctx: Context) -> DataFrame:
    """The target's distinct (partition key, business key) pairs as they are now (read by the
    driver: keys only).

    Raises:
        SourceDataError: a business key lies in more than one partition of the target.
    """
    spec = ctx.spec
    names = [spec.partition_key, *spec.business_key]
    by_name = {c.name: c for c in ctx.target_columns}
    schema = lake_schema([by_name[n] for n in names])  # in the order the keys are selected
    table = lake_engine_for(spec).table(control)
    try:
        handle = table.open()
        data = None if handle is None else table.read_columns(handle, names)
    finally:
        table.close()
    keys = schema.empty_table() if data is None or data.num_columns == 0 else \
        data.select(names).group_by(names).aggregate([]).select(names).cast(schema)
    per_key = keys.group_by(list(spec.business_key)).aggregate([([], "count_all")])
    several = per_key.filter(pc.greater(per_key.column("count_all"), 1)).slice(0, 5)
    refuse_keys_in_several_partitions(spec, [tuple(r.values()) for r in several.to_pylist()])
    return session.createDataFrame(keys)


def _every_row(session: SparkSession, source: SparkSource, pin: Pin, ctx: Context) -> DataFrame:
    """Every row of the source: the pinned partitions' as pinned, the others' as they are now
    (with time windows, the rows in none of the context's windows)."""
    spec = ctx.spec
    if ctx.windowing is None:
        return source.frame_all(session, pin, spec.partition_key)
    pinned = windows_frame(session, spans(ctx), "__pinned")
    others = outside(source.newest(session), spec.partition_key, pinned)
    if not pin.files:
        return others
    mine = restricted(source.frame(session, pin), spec.partition_key, pinned)
    return mine.unionByName(others.select(*mine.columns))


def _window_homes(session: SparkSession, frame: DataFrame, targets: DataFrame, ctx: Context):  # noqa: ANN202
    """:func:`_homes` for time windows: each key's newest time stamp and the target's, placed
    in windows by core.moves.placed."""
    from pyspark.sql import Window
    F = functions()  # noqa: N806
    spec = ctx.spec
    windowing = ctx.windowing
    assert windowing is not None
    pk, bk = spec.partition_key, list(spec.business_key)
    not_null = functools.reduce(lambda a, b: a & b, [F.col(k).isNotNull() for k in bk])
    order = [getattr(F.col(o.column), f"{o.direction}_nulls_{o.nulls or 'last'}")() for o in spec.ordering]
    micros = dict(frame.dtypes)[pk] == "timestamp"

    def homes(partitions: list[PartitionValue]) -> list[tuple]:
        windows = windows_frame(session, spans(ctx, [str(p) for p in partitions]), "__in")
        src, tgt = labelled(frame.where(not_null), pk, windows), labelled(targets, pk, windows)
        keys = (src.where(F.col("__in").isNotNull()).select(*bk)
                .unionByName(tgt.where(F.col("__in").isNotNull()).select(*bk)).distinct())
        home = (src.join(keys, on=bk, how="left_semi")
                .withColumn("__rank", F.row_number().over(Window.partitionBy(*bk).orderBy(*order)))
                .where(F.col("__rank") == 1)
                .select(*bk, collectable(src, pk).alias("__home"), "__in", F.lit(True).alias("__s")))
        now = tgt.join(keys, on=bk, how="left_semi").select(*bk, collectable(tgt, pk).alias("__current"),
                                                            F.lit(True).alias("__t"))
        rows = (home.join(now, on=bk, how="full")
                .where(F.col("__s").isNull() | F.col("__t").isNull() | F.col("__in").isNull()
                       | ~F.col("__home").eqNullSafe(F.col("__current")))
                .select("__home", "__current", "__s", "__t", *bk).collect())
        found = [(collected(r[0], micros), collected(r[1], micros), r[2] is not None, r[3] is not None, *r[4:])
                 for r in rows]
        return placed(found, windowing, {str(p) for p in partitions})

    return homes


def _homes(frame: DataFrame, targets: DataFrame, ctx: Context):  # noqa: ANN202 - a closure's function
    """core.moves.KeyHomes over ``frame`` (every partition of the source) and ``targets``."""
    from pyspark.sql import Window
    F = functions()  # noqa: N806
    spec = ctx.spec
    pk, bk = spec.partition_key, list(spec.business_key)
    not_null = F.lit(True)
    for k in bk:
        not_null = not_null & F.col(k).isNotNull()
    order = [getattr(F.col(o.column), f"{o.direction}_nulls_{o.nulls or 'last'}")() for o in spec.ordering]

    def homes(partitions: list[PartitionValue]) -> list[tuple]:
        inside = F.col(pk).isin(list(partitions))
        keys = (frame.where(inside & not_null).select(*bk)
                .unionByName(targets.where(inside).select(*bk)).distinct())
        home = (frame.where(not_null).join(keys, on=bk, how="left_semi")
                .withColumn("__rank", F.row_number().over(Window.partitionBy(*bk).orderBy(*order)))
                .where(F.col("__rank") == 1).select(*bk, F.col(pk).alias("__home")))
        now = targets.join(keys, on=bk, how="left_semi").select(*bk, F.col(pk).alias("__current"))
        rows = (home.join(now, on=bk, how="full")
                .where(F.col("__home").isNull() | F.col("__current").isNull()
                       | ~F.col("__home").eqNullSafe(F.col("__current")) | ~F.col("__home").isin(list(partitions)))
                .select("__home", "__current", *bk).collect())
        return [(None if r[0] is None else partition_label(r[0]), None if r[1] is None else partition_label(r[1]),
                 r[0] is not None, r[1] is not None, *r[2:]) for r in rows]

    return homes


def moved_scope(control: psycopg.Connection, ctx: Context, source: SparkSource, session: SparkSession, pin: Pin,
                progress: Progress) -> tuple[Pin, Context]:
    """The pin and the context with every partition a moved key leaves or enters added, to a
    fixed point, read at the pin (the source's other partitions as they are) and the target as
    it is now; the pin taken again until it holds the whole scope."""
    spec = ctx.spec
    targets = _target_keys(session, control, ctx)
    asked, pinned_for = ctx, set(ctx.labels)
    for _ in range(PIN_ROUNDS):
        every = _every_row(session, source, pin, ctx)
        homes = _homes(every, targets, ctx) if ctx.windowing is None else _window_homes(session, every, targets, ctx)
        scope = close_scope_with(spec, ctx.kind, asked.partitions, homes)
        if ctx.windowing is not None:  # in time order (a label's text order is not, where clocks fall back)
            scope.partitions = list(ctx.windowing.labels([str(p) for p in scope.partitions]))
        ctx.engine.check_partitions(scope.partitions)
        ctx = dataclasses.replace(asked, partitions=scope.partitions, scope=scope)
        if set(ctx.labels) == pinned_for:
            if scope.added:
                progress(ProgressEvent("snapshot", f"moved records add partition(s) {', '.join(scope.added)}"))
            return pin, ctx
        pinned_for = set(ctx.labels)
        pin = source.latest(session, spec.partition_key, parts_of(ctx))
    raise SnapshotError(f"source {spec.source_name} kept changing while moved keys' partitions were pinned; plan "
                        "again when its writers are done")


def linked_problems(ctx: Context) -> list[str]:
    """A plan's problem for each group of partitions moved keys link: engine spark's targets
    switch one partition at a time, so such a group cannot be replaced together."""
    scope = ctx.scope
    if scope is None:
        return []
    return [f"moved keys link partitions {', '.join(group)}, which must be replaced together, and the target swaps "
            "one partition at a time (a Parquet folder's directory, a catalog table's location): nothing is "
            "written; run the spec on engine duckdb with a Delta or Iceberg target, or without records_can_move"
            for group in scope.groups() if len(group) > 1]
