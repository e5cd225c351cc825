"""What the spark engine supports: a Parquet folder, a PostgreSQL table over JDBC or a table of
the session's catalog, both builds in Spark (core.engines.spark), a Parquet folder or catalog table
written."""

from __future__ import annotations

from backfill_assets.core.engines.supports import Supports, refused

# Delta and Iceberg are written by the lake engines through Arrow; through Spark they would
# need the cluster's jars, which the tests cannot assume (docs/engines.md).
_JARS = "Delta and Iceberg through Spark need the cluster's own jars: see docs/engines.md"

SUPPORTS = Supports(
    engine="spark",
    builds="backfill_assets.core.engines.spark.engine:SparkBuildEngine",
    sources=("parquet", "jdbc", "spark_table"),
    targets=("parquet", "spark_table"),
    reads="a Parquet folder, a PostgreSQL table over JDBC or a table of its catalog",
    writes="a Parquet folder or a table of its catalog",
    options={
        "records_can_move": refused(
            "a key's versions are looked for in every partition of the pinned source, and a Parquet pin (or a JDBC "
            "copy) holds only the planned partitions; remove it, or run the spec on engine duckdb over a Delta or "
            "Iceberg source"),
        "parallel": refused("one run builds every partition, and Spark spreads the work over its executors; "
                            "remove it"),
        "replace_batch_rows": refused("each partition's files are switched on their own; remove it"),
        "trusted_functions": refused("they name PostgreSQL functions, and engine spark trusts Spark's built-in "
                                     "functions only; remove them"),
    },
    settings=("master", "conf", "staging"),
    notes={"delta": _JARS, "iceberg": _JARS},
)
