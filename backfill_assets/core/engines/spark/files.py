"""Partitions held by lists of Parquet files, read and fingerprinted by Spark on its executors,
and files hashed there: the driver hands Spark paths and gets readings back, never rows.

- :func:`partition_frame`: the rows of each partition's files (label -> full paths), in the
  spec's columns and the target's Spark types, the partition column the label's value (files
  in a partition directory do not carry it).
- :func:`files_readings`: their format-3 readings, in one aggregate (core.engines.spark.fingerprint).
- :func:`sha256_files`: the SHA-256 of files, by a Spark job over ``binaryFile`` when there
  is enough to hash that executors beat one driver thread, else by the driver reading them
  through a small buffer (core.lake.lake_files.sha256_files); the same digests either way.
  Pins (of a folder, a catalog table's files, a JDBC source's copy) and stage seals are hashed
  this way.
"""

from __future__ import annotations

import functools
import hashlib
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.core.context import Context
from backfill_assets.core.engines.spark import fingerprint as spark_fp
from backfill_assets.core.engines.spark.catalog import quoted
from backfill_assets.core.engines.spark.session import spark_type
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.lake.lake_files import sha256_files as driver_sha256
from backfill_assets.core.vocabulary import partition_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Below this many bytes in all, files are hashed by the driver: a Spark job costs a few hundred
# milliseconds before it reads a byte. Above it, each file is read and hashed by an executor.
DRIVER_HASH_BYTES = 256 * 2**20
# ``binaryFile`` holds a file in one byte array: larger files are hashed by the driver.
LARGEST_SPARK_HASH = 1 << 30
_EMPTY = hashlib.sha256(b"").hexdigest()


def partition_frame(session: SparkSession, ctx: Context, files: Mapping[str, Sequence[str]],
                    columns: Sequence[str] | None = None) -> DataFrame | None:
    """The rows of each partition's files, as one DataFrame of ``columns`` (default: the spec's),
    each cast to the target's Spark type (None: no file at all)."""
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
    spec = ctx.spec
    types = {c.name: spark_type(c) for c in ctx.target_columns}
    wanted = list(columns or spec.columns)
    frames = []
    for label, paths in files.items():
        if not paths:
            continue
        read = session.read.parquet(*paths)
        frames.append(read.select(*[
            (F.lit(ctx.value_of(label)) if c == spec.partition_key else F.col(quoted(c))).cast(types[c]).alias(c)
            for c in wanted]))
    if not frames:
        return None
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


def files_readings(session: SparkSession, ctx: Context, files: Mapping[str, Sequence[str]]) -> dict[str, Reading]:
    """The readings of each partition held by its files (label -> full paths), computed by Spark."""
    spec = ctx.spec
    frame = partition_frame(session, ctx, files)
    found = {} if frame is None else {partition_label(v): fp for v, fp in spark_fp.readings(
        frame, ctx.target_columns, spec.business_key, spec.partition_key, spec.total).items()}
    return {label: (found.get(label) or empty(ctx.target_columns, spec.total)).as_dict() for label in files}


def sha256_files(paths: Sequence[str], session: Callable[[], SparkSession] | None) -> dict[str, str]:
    """Each file's SHA-256 (lower-case hex), by path: by Spark's executors where there is
    much to hash (``session`` gives the session, started if need be), else by the driver
    (see the module docstring)."""
    sizes = {p: os.stat(p).st_size for p in paths}
    by_spark = [p for p in paths if 0 < sizes[p] <= LARGEST_SPARK_HASH]  # Spark lists no empty file
    if session is None or sum(sizes[p] for p in by_spark) < DRIVER_HASH_BYTES:
        return driver_sha256(paths)
    out = {p: _EMPTY for p in paths if sizes[p] == 0}
    out.update(_spark_sha256(session(), by_spark))
    return {**driver_sha256([p for p in paths if p not in out]), **out}


def _spark_sha256(session: Any, paths: Sequence[str]) -> dict[str, str]:
    from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
    found = (session.read.format("binaryFile").load(list(paths))
             .select("path", F.sha2(F.col("content"), 256).alias("sha")).collect())
    wanted = set(paths)
    out = {}
    for row in found:
        local = urllib.parse.unquote(urllib.parse.urlparse(row["path"]).path)
        if local in wanted:
            out[local] = row["sha"]
    return out
