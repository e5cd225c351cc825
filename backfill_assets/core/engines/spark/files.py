"""Partitions held by lists of Parquet files, read and fingerprinted by Spark on its executors,
and files hashed there: the driver hands Spark paths and gets readings back, never rows.

- :func:`partition_frame`: the rows of each partition's files (label -> full paths), in the
  spec's columns and the target's Spark types, the partition column the label's value (files
  in a partition directory do not carry it).
  Spark's reading of a Parquet file's schema is a job of its own, even for one file (a few
  hundred milliseconds, as many as the fingerprint's): a label whose files all have one
  footer schema is read with the schema Spark gave that footer before in this process.
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
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.context import Context
from backfill_assets.core.engines.spark import fingerprint as spark_fp
from backfill_assets.core.engines.spark.catalog import quoted
from backfill_assets.core.engines.spark.session import spark_type
from backfill_assets.core.engines.spark.windows import key_column, label_columns
from backfill_assets.core.fingerprint.partition import empty
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.lake.lake_files import sha256_files as driver_sha256
from backfill_assets.core.vocabulary import partition_label

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

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
    key = key_column(spec)  # a value's files leave out its column; a window's keep it, and are labelled
    frames = []
    settings = schema_settings(session)  # read once, not once a partition (over Connect, a call each)
    for label, paths in files.items():
        if not paths:
            continue
        read = parquet_files(session, paths, settings)
        frames.append(read.select(*[
            (F.lit(ctx.value_of(label)) if c == key else F.col(quoted(c))).cast(types[c]).alias(c)
            for c in wanted], *[F.lit(label).alias(c) for c in label_columns(spec)]))
    if not frames:
        return None
    return functools.reduce(lambda a, b: a.unionByName(b), frames)


# The settings under which Spark turns a Parquet footer into a schema (besides the footer itself).
_SCHEMA_SETTINGS = ("spark.sql.parquet.binaryAsString", "spark.sql.parquet.int96AsTimestamp",
                    "spark.sql.parquet.inferTimestampNTZ.enabled", "spark.sql.legacy.parquet.nanosAsLong",
                    "spark.sql.parquet.mergeSchema", "spark.sql.caseSensitive")
_SPARK_ROW_METADATA = b"org.apache.spark.sql.parquet.row.metadata"  # the schema Spark wrote beside the file's own
_SCHEMAS: dict[tuple, StructType] = {}  # (footer schema, settings) -> the schema Spark read from it
_MOST_SCHEMAS = 256
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def schema_settings(session: SparkSession) -> tuple:
    """The session's values of the settings Spark reads a footer's schema under."""
    return tuple(session.conf.get(k, None) for k in _SCHEMA_SETTINGS)


def parquet_files(session: SparkSession, paths: Sequence[str], settings: tuple | None = None) -> DataFrame:
    """``paths`` (Parquet files) as Spark reads them, its schema read from a footer as Spark
    reads it: by a job, unless this process saw Spark read a footer of the same schema, under
    the same settings (``settings``: :func:`schema_settings` of ``session``, read here if not
    given), before. Files whose footers differ, or that cannot be read here, are left to Spark
    (which reads the schema of one of them, and fails on a file that is no Parquet)."""
    footers = {_footer(p) for p in paths}
    if len(footers) != 1 or None in footers:
        return session.read.parquet(*paths)
    key = (footers.pop(), settings if settings is not None else schema_settings(session))
    if key not in _SCHEMAS:
        if len(_SCHEMAS) >= _MOST_SCHEMAS:
            _SCHEMAS.clear()
        _SCHEMAS[key] = session.read.parquet(paths[0]).schema
    return session.read.schema(_SCHEMAS[key]).parquet(*paths)


def _footer(path: str) -> str | None:
    """A Parquet file's schema, as its footer writes it (with Spark's own, if Spark wrote the
    file), or None if it cannot be read here."""
    try:
        meta = pq.read_metadata(path)
    except (OSError, ValueError, pa.ArrowException):
        return None
    schema = _ADDRESS.sub("", str(meta.schema))  # its text names the Python object's address first
    return f"{schema}\n{(meta.metadata or {}).get(_SPARK_ROW_METADATA)!r}"


def files_readings(session: SparkSession, ctx: Context, files: Mapping[str, Sequence[str]]) -> dict[str, Reading]:
    """The readings of each partition held by its files (label -> full paths), computed by Spark."""
    spec = ctx.spec
    frame = partition_frame(session, ctx, files)
    found = {} if frame is None else {partition_label(v): fp for v, fp in spark_fp.readings(
        frame, ctx.target_columns, spec.business_key, key_column(spec), spec.total).items()}
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
