"""Two sets of partitions compared key by key as Spark jobs (the change preview, ``diff``, and
the first differing keys a refused plan or a failed verification names): the work grows with
the executors, and the driver gets back counts and the rows of a few keys, never a partition.

- Spark joins both sides on the partition and business key (NULL equal to NULL), each key's
  rows counted and the least SHA-256 of their canonical text kept (core.engines.spark.fingerprint),
  and classifies each key as DuckDB's comparison does (core.comparison.compare.partition_diff):
  added, removed, changed (other text, or more than one row on a side), unchanged.
- The counts come back per partition, and so do the first ``most`` differing keys in key
  order (NULLs last, as DuckDB orders them).
- Only the rows of those keys are then brought to the driver (as Arrow) and compared in
  DuckDB by the same queries as on the other engines, for the columns that differ and their
  values in PostgreSQL's text forms.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from backfill_assets.core.comparison import compare
from backfill_assets.core.comparison.diff import diff_relations
from backfill_assets.core.context import Context
from backfill_assets.core.differences import KINDS, Change, PartitionDiff
from backfill_assets.core.engines.spark.catalog import quoted
from backfill_assets.core.engines.spark.files import partition_frame
from backfill_assets.core.engines.spark.fingerprint import row_text
from backfill_assets.core.engines.spark.inspect import fields_of, functions
from backfill_assets.core.engines.spark.session import spark_type
from backfill_assets.core.engines.spark.windows import key_column, label_columns
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.vocabulary import partition_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Files = Mapping[str, Sequence[str]]  # label -> a side's files of that partition


@dataclass
class Compared:
    """One partition compared: how many keys of each kind, and the rows of its first
    differing keys on each side (Arrow, the target's schema)."""

    counts: dict[str, int]
    left: pa.Table
    right: pa.Table


def _side(session: SparkSession, ctx: Context, files: Files) -> DataFrame:
    """One side's partitions; where it has no file at all, no row, in the target's types (made in
    the JVM: ``createDataFrame`` would start Python workers on the executors)."""
    frame = partition_frame(session, ctx, files)
    if frame is not None:
        return frame
    F = functions()  # noqa: N806
    label = [F.lit(None).cast("string").alias(c) for c in label_columns(ctx.spec)]
    return session.range(0).select(*[F.lit(None).cast(spark_type(c)).alias(c.name) for c in ctx.target_columns], *label)


def compare_files(session: SparkSession, ctx: Context, left: Files, right: Files, most: int) -> dict[str, Compared]:
    """Each partition of ``left`` (the rows a replacement writes) against ``right`` (see the
    module docstring), by label."""
    F = functions()  # noqa: N806
    spec = ctx.spec
    grain = [key_column(spec), *spec.business_key]
    fields = fields_of(ctx.target_columns)
    sides = [_side(session, ctx, left), _side(session, ctx, right)]
    # Each row's hash in a projection first: Spark takes no ``reflect`` (doubles) inside an aggregate.
    keyed = [s.select(*[F.col(quoted(c)) for c in grain], F.sha2(row_text(fields), 256).alias("__t"))
             .groupBy(*[F.col(quoted(c)) for c in grain]).agg(F.count(F.lit(1)).alias("__n"), F.min("__t").alias("__h"))
             .alias(name) for s, name in zip(sides, ("l", "r"))]
    on = functools.reduce(lambda a, b: a & b, [F.col(f"l.{quoted(c)}").eqNullSafe(F.col(f"r.{quoted(c)}")) for c in grain])
    kind = (F.when(F.col("r.__n").isNull(), "added").when(F.col("l.__n").isNull(), "removed")
            .when((F.col("l.__n") > 1) | (F.col("r.__n") > 1) | (F.col("l.__h") != F.col("r.__h")), "changed")
            .otherwise("unchanged"))
    joined = keyed[0].join(keyed[1], on=on, how="full_outer").select(
        *[F.coalesce(F.col(f"l.{quoted(c)}"), F.col(f"r.{quoted(c)}")).alias(f"__g{i}") for i, c in enumerate(grain)],
        kind.alias("__kind"))
    out = {label: Compared(dict.fromkeys(KINDS, 0), _schema(ctx).empty_table(), _schema(ctx).empty_table())
           for label in {**left, **right}}
    # Kept on the executors (memory, then disk) for the counts and the first keys: one join.
    joined = joined.persist()
    try:
        for value, k, n in joined.groupBy("__g0", "__kind").count().collect():
            out[partition_label(value)].counts[k] = int(n)
        if most > 0 and any(c.counts["added"] + c.counts["removed"] + c.counts["changed"] for c in out.values()):
            _first_rows(ctx, sides, joined, grain, most, out)
    finally:
        joined.unpersist()
    return out


def _first_rows(ctx: Context, sides: list[DataFrame], joined: DataFrame, grain: list[str], most: int,
                out: dict[str, Compared]) -> None:
    """Each side's rows of each partition's first ``most`` differing keys, into ``out``."""
    from pyspark.sql import Window
    F = functions()  # noqa: N806
    spec = ctx.spec
    order = Window.partitionBy("__g0").orderBy(*[F.col(f"__g{i}").asc_nulls_last() for i in range(1, len(grain))])
    first = (joined.where(F.col("__kind") != "unchanged").withColumn("__rank", F.row_number().over(order))
             .where(F.col("__rank") <= most).select(*[f"__g{i}" for i in range(len(grain))]))
    first = F.broadcast(first)  # a few keys a partition: each side is scanned once against them
    wanted = functools.reduce(lambda a, b: a & b, [F.col(quoted(c)).eqNullSafe(F.col(f"__g{i}")) for i, c in enumerate(grain)])
    # Both sides' rows of those keys in one job, told apart by a tag.
    key = key_column(spec)
    columns = [*spec.columns, *label_columns(spec)]
    schema = _schema(ctx)
    tagged = [side.join(first, on=wanted, how="left_semi").select(F.lit(i).alias("__side"), *[quoted(c) for c in columns])
              for i, side in enumerate(sides)]
    both = tagged[0].unionByName(tagged[1]).toArrow()
    rows = [both.filter(pc.equal(both["__side"], i)).drop_columns(["__side"]).cast(schema) for i in (0, 1)]
    for label, found in out.items():
        value = ctx.value_of(label)
        found.left, found.right = (r.filter(pc.equal(r[key], pa.scalar(value, schema.field(key).type))) for r in rows)


def _schema(ctx: Context) -> pa.Schema:
    """The rows compared, in the lake's types (and a window's label)."""
    schema = lake_schema(ctx.target_columns)
    for column in label_columns(ctx.spec):
        schema = schema.append(pa.field(column, pa.string()))
    return schema


@contextlib.contextmanager
def _duck(ctx: Context, found: Compared) -> Iterator[Any]:
    from backfill_assets.core.duck import connect
    duck = connect()
    try:
        duck.register("stage_rows", found.left)
        duck.register("target_rows", found.right)
        yield duck
    finally:
        duck.close()


def changes(session: SparkSession, ctx: Context, stage: Files, target: Files, first: int) -> dict[str, Change]:
    """The change preview: per partition, the keys replacing the target with the stage adds,
    removes, changes and keeps, and (``first``) the first of them with their columns."""
    spec = ctx.spec
    out: dict[str, Change] = {}
    for label, found in compare_files(session, ctx, stage, target, first).items():
        c = found.counts
        out[label] = Change(added=c["added"], removed=c["removed"], changed=c["changed"], unchanged=c["unchanged"])
        if first:
            with _duck(ctx, found) as duck:
                rows = duck.execute(compare.first_changes("stage_rows", "target_rows", key_column(spec),
                                                          spec.business_key, fields_of(ctx.target_columns), first),
                                    {"partition": ctx.value_of(label)}).fetchall()
            out[label]["first"] = compare.first_changes_json(rows, spec.business_key)
    return out


def diffs(session: SparkSession, ctx: Context, left: Files, right: Files, limit: int) -> dict[str, PartitionDiff]:
    """``diff`` per partition: the counts from Spark, the examples from the rows of the first
    ``limit`` differing keys (core.comparison.diff)."""
    out = {}
    for label, found in compare_files(session, ctx, left, right, limit).items():
        with _duck(ctx, found) as duck:
            examples = diff_relations(duck, "stage_rows", "target_rows", ctx.target_columns, key_column(ctx.spec),
                                      ctx.spec.business_key, label, ctx.value_of(label), limit).examples
        out[label] = PartitionDiff(label, **found.counts, examples=examples)
    return out


def differing_keys(session: SparkSession, ctx: Context, left: Files, right: Files, most: int = 3) -> dict[str, list[tuple]]:
    """The first ``most`` business keys (in key order, as text) whose rows differ, per partition."""
    spec = ctx.spec
    out = {}
    for label, found in compare_files(session, ctx, left, right, most).items():
        with _duck(ctx, found) as duck:
            out[label] = duck.execute(compare.differing_keys("stage_rows", "target_rows", key_column(spec),
                                                             spec.business_key, fields_of(ctx.target_columns), most),
                                      {"partition": ctx.value_of(label)}).fetchall()
    return out
