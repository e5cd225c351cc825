"""Figure 14 of benchmarks/bench.py: the whole safe backfill on Spark (local[2]), a Parquet
folder to a Parquet folder, side by side with the naive way and the raw read, in one Spark
session started before any of them (its start-up, 5-10 s, is nobody's).

- ours: plan (pin the folder's files, check them, two builds in Spark: stage A written, read
  back, fingerprinted and sealed, stage B fingerprinted as built; compare), approve and apply
  (per partition: the target fingerprinted by Spark, stage A's files linked beside it and
  proved by their bytes, switched in, proved by their bytes again), in process, as
  bench.safe_backfill runs it.
- naive: one Spark job: newest-wins by a window over the source folder, written with dynamic
  partition overwrite (``partitionOverwriteMode=dynamic``); no pin, no second build, no
  fingerprint, no verification, and the partition deleted before it is written.
- raw read: every row of the source read by Spark (a count and the notes' total length).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as pads
from duck_lake import source_rows  # benchmarks/duck_lake.py: the same source, as Arrow


def spec(folder: Path, url_env: str) -> dict[str, Any]:
    """The bench's spec on Spark: the Parquet source in ``folder``, a new Parquet target there."""
    return {
        "name": "bench_spark", "database_url_env": url_env,
        "engine": {"type": "spark", "staging": str(folder / "staging")},
        "source": {"format": "parquet", "location": str(folder / "src")},
        "target": {"format": "parquet", "location": str(folder / "tgt")},
        "partition_key": "d", "business_key": ["k"],
        "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
        "columns": ["d", "k", "updated_at", "seq", "amount", "status", "note"], "total": "amount",
        "transform_version": "bench-v1",
    }


def export_source(conn: psycopg.Connection, folder: Path) -> int:
    """bench.src written to a Hive-partitioned Parquet folder (one file per day). Rows."""
    data = source_rows(conn)
    pads.write_dataset(data, folder / "src", format="parquet", partitioning=["d"], partitioning_flavor="hive",
                       existing_data_behavior="delete_matching")
    return data.num_rows


def session() -> Any:
    """The bench's Spark session (local[2], as the tool starts it)."""
    from backfill_assets.core.engines.spark.session import DEFAULT_MASTER, start_session
    return start_session(DEFAULT_MASTER, {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8"},
                         "backfill_assets:bench")


def naive(spark: Any, folder: Path) -> float:
    """The naive way into a new Parquet folder. Seconds."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
    start = time.perf_counter()
    src = spark.read.parquet(str(folder / "src"))
    w = Window.partitionBy("d", "k").orderBy(F.col("updated_at").desc(), F.col("seq").desc())
    newest = src.where(F.col("k").isNotNull()).withColumn("r", F.row_number().over(w)).where("r = 1").drop("r")
    (newest.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("d")
     .parquet(str(folder / "naive")))
    return time.perf_counter() - start


def raw_read(spark: Any, folder: Path) -> tuple[float, int]:
    """Every row of the source read by Spark. (seconds, rows)"""
    from pyspark.sql import functions as F  # noqa: N812
    start = time.perf_counter()
    rows, _ = spark.read.parquet(str(folder / "src")).agg(F.count(F.lit(1)), F.sum(F.length("note"))).collect()[0]
    return time.perf_counter() - start, int(rows)
