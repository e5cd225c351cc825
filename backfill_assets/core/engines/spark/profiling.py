"""The Spark engine's answers to ``profile`` (core.profiling): the source as it is now (a
Parquet folder, a PostgreSQL table over JDBC or a catalog table; nothing pinned or copied),
each question one Spark job over the profiled partitions, on the executors; only counts come
back to the driver.

The questions are PostgreSQL's (core.pg.sqlbuild.profiling and checks) in the DataFrame API:
a value's text form is Spark's cast to string, hashed by ``xxhash64`` (a NULL as 0; a row's
columns each marked NULL or value, so that no two rows' texts run together); distinct values
are Spark's (typed, as PostgreSQL's DISTINCT).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.core.catalog import ColumnInfo, windowing_of
from backfill_assets.core.engines.spark.inspect import types_of
from backfill_assets.core.engines.spark.session import column_info
from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.engines.spark.windows import collected, key_column, labelled, restricted, windows_frame
from backfill_assets.core.lake.parts import span_of
from backfill_assets.core.profiling import first_windows
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionValue

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession



def _text_hash(F: Any, name: str) -> Any:  # noqa: N803 - pyspark.sql.functions, passed in
    c = F.col(name)
    return F.when(c.isNull(), F.lit(0)).otherwise(F.xxhash64(c.cast("string")))


def _rows_hash(F: Any, names: Sequence[str]) -> Any:  # noqa: N803
    if not names:
        return F.lit(0)
    return F.xxhash64(*[F.when(F.col(n).isNull(), F.lit("n")).otherwise(F.concat(F.lit("v"), F.col(n).cast("string")))
                        for n in names])


class SparkProfiler:
    """The spec's source as it is now, profiled in Spark (core.profiling.SourceProfiler)."""

    def __init__(self, spec: Spec, source: SparkSource, session: SparkSession) -> None:
        self.spec, self.name, self.session = spec, source.name, session
        self.frame: DataFrame = source.newest(session)
        self._columns = [column_info(n, t) or ColumnInfo(n, t, "X", False, t) for n, t in types_of(self.frame)]
        # Time windows: the rows are read with their window's label, which every question
        # groups by as by a key's value.
        column = next((c for c in self._columns if c.name == spec.partition_key), None)
        self._windowing = None if spec.partition_window is None or column is None else windowing_of(spec, column)
        self._pk = spec.partition_key if self._windowing is None else key_column(spec)
        # The profiled partitions' rows, kept by the executors for the questions that follow
        # (a profile asks up to ~80, each a job over the same partitions).
        self._kept: dict[tuple, DataFrame] = {}

    def close(self) -> None:
        for frame in self._kept.values():
            frame.unpersist()

    def _in(self, partitions: Sequence[PartitionValue], key: Sequence[str] = ()) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
        wanted = tuple(partitions)
        if wanted not in self._kept and self._windowing is not None:
            windows = windows_frame(self.session, [span_of(self._windowing, str(p)) for p in partitions], self._pk)
            pk = self.spec.partition_key
            self._kept[wanted] = labelled(restricted(self.frame, pk, windows), pk, windows).cache()
        if wanted not in self._kept:
            self._kept[wanted] = self.frame.where(F.col(self.spec.partition_key).isin(list(partitions))).cache()
        frame = self._kept[wanted]
        for k in key:
            frame = frame.where(F.col(k).isNotNull())
        return frame

    def columns(self) -> list[ColumnInfo]:
        return list(self._columns)

    def first_partitions(self, limit: int) -> list[PartitionValue]:
        from pyspark.sql import functions as F  # noqa: N812
        pk = self.spec.partition_key
        if self._windowing is not None:
            if self._windowing.column_kind == "date":
                first, last = self.frame.agg(F.min(pk), F.max(pk)).collect()[0]
            else:  # as instants: Spark hands a time stamp to Python in the driver's own zone
                micros = self.frame.agg(F.unix_micros(F.min(pk)), F.unix_micros(F.max(pk))).collect()[0]
                first, last = (collected(m, micros=True) for m in micros)
            return first_windows(self._windowing, first, last, self.partition_counts, limit)
        rows = self.frame.where(F.col(pk).isNotNull()).select(pk).distinct().orderBy(pk).limit(limit).collect()
        return [r[0] for r in rows]

    def partition_counts(self, partitions: Sequence[PartitionValue]) -> dict[PartitionValue, int]:
        pk = self._pk
        return {r[0]: int(r[1]) for r in self._in(partitions).groupBy(pk).count().collect()}

    def column_profile(self, column: str, partitions: Sequence[PartitionValue]) -> tuple[int, int]:
        from pyspark.sql import functions as F  # noqa: N812
        c = F.col(column)
        row = self._in(partitions).agg(
            F.sum(F.when(c.isNull(), 1).otherwise(0)),
            F.count_distinct(F.col(self._pk), c)).collect()[0]
        return int(row[0] or 0), int(row[1] or 0)

    def key_evidence(self, key: Sequence[str], others: Sequence[str],
                     partitions: Sequence[PartitionValue]) -> tuple[int, ...]:
        from pyspark.sql import functions as F  # noqa: N812
        grain = [self._pk, *key]
        flags = [f"__v{i}" for i in range(len(others))]
        hashed = self._in(partitions, key).select(*grain, *[_text_hash(F, c).alias(a) for c, a in zip(others, flags)])
        groups = hashed.groupBy(*grain).agg(F.count(F.lit(1)).alias("__n"),
                                            *[(F.min(a) != F.max(a)).alias(a) for a in flags])
        versions = F.lit(False)
        for a in flags:
            versions = versions | F.col(a)
        row = groups.agg(
            F.count(F.lit(1)), F.sum("__n"), F.sum(F.when(F.col("__n") > 1, 1).otherwise(0)),
            F.sum(F.when(versions, 1).otherwise(0)), *[F.sum(F.when(F.col(a), 1).otherwise(0)) for a in flags],
        ).collect()[0]
        return tuple(int(v or 0) for v in row)

    def key_splits(self, key: Sequence[str], split: Sequence[str], others: Sequence[str],
                   partitions: Sequence[PartitionValue]) -> list[tuple[int, int]]:
        from pyspark.sql import functions as F  # noqa: N812
        if not split:
            return []
        grain = [self._pk, *key]
        rows = self._in(partitions, key).select(
            *grain, _rows_hash(F, others).alias("__h"),
            F.explode(F.array(*[F.struct(F.lit(i).alias("__i"), _text_hash(F, c).alias("__c"))
                                for i, c in enumerate(split)])).alias("__s"))
        parts = (rows.groupBy(*grain, "__s.__i", "__s.__c").agg((F.min("__h") != F.max("__h")).alias("__v"))
                 .groupBy(*grain, "__i").agg(F.sum(F.when(F.col("__v"), 1).otherwise(0)).alias("__parts"))
                 .where(F.col("__parts") >= 2).groupBy("__i").count().orderBy("__i").collect())
        return [(int(r[0]), int(r[1])) for r in parts]

    def ordering_nulls(self, key: Sequence[str], ordering: Sequence[str], partitions: Sequence[PartitionValue]) -> int:
        from pyspark.sql import functions as F  # noqa: N812
        row = self._in(partitions, key).agg(*[F.sum(F.when(F.col(c).isNull(), 1).otherwise(0)) for c in ordering])
        return sum(int(v or 0) for v in row.collect()[0])

    def tied_groups(self, key: Sequence[str], ordering: Sequence[str], others: Sequence[str],
                    partitions: Sequence[PartitionValue]) -> int:
        from pyspark.sql import functions as F  # noqa: N812
        if not others:
            return 0  # rows equal in every other column are not a tie
        grain = [self._pk, *key, *ordering]
        groups = (self._in(partitions, key).select(*grain, _rows_hash(F, others).alias("__h")).groupBy(*grain)
                  .agg(F.count(F.lit(1)).alias("__n"), F.count_distinct("__h").alias("__d"))
                  .where((F.col("__n") > 1) & (F.col("__d") > 1)))
        return int(groups.count())
