"""The Spark engine's inspection: the source's newest columns (no row read) through the
transform, as PostgreSQL's types, and the target checked against them; the spec resolved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from backfill_assets.core.catalog import ColumnInfo, Inspection, ServerInfo, requested_partitions
from backfill_assets.core.context import Context
from backfill_assets.core.engines.spark.session import column_info, unsupported
from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.engines.spark.windows import key_column, labelled, restricted, spans, windows_frame
from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint import rows
from backfill_assets.core.lake.engine import inspect_input
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_VIEW = "source"  # what transform_sql reads, in the step's own session


def functions() -> Any:  # noqa: N802 - pyspark.sql.functions, imported where Spark is used
    from pyspark.sql import functions
    return functions


def fields_of(columns: Sequence[ColumnInfo]) -> list[tuple[str, str]]:
    return [(c.name, rows.kind_of(c)) for c in columns]


def types_of(frame: DataFrame) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]


def input_of(session: SparkSession, frame: DataFrame, spec: Spec, transform: str | None) -> Any:
    """The input of newest-wins: the source (``frame``) through the transform, as the spec's
    input columns."""
    if transform is None:
        return frame.select(*spec.input_columns)
    frame.createOrReplaceTempView(SOURCE_VIEW)
    return session.sql(transform).select(*spec.input_columns)


def windowed_input(session: SparkSession, ctx: Context, frame: DataFrame, labels: Sequence[str] | None = None) -> Any:
    """The input of newest-wins (core.engines.spark.inspect.input_of): for time windows, of the
    source's rows in the windows ``labels`` (default: the context's), each labelled by its
    window after the transform."""
    spec = ctx.spec
    if ctx.windowing is None:
        return input_of(session, frame, spec, ctx.transform)
    windows = windows_frame(session, spans(ctx, labels), key_column(spec))
    inp = input_of(session, restricted(frame, spec.partition_key, windows), spec, ctx.transform)
    return labelled(inp, spec.partition_key, windows)


def inspect(conn: psycopg.Connection | None, spec: Spec, source: SparkSource, session: SparkSession) -> tuple[Inspection, str | None]:
    """Inspect the source (its newest columns, no row read) and the Parquet target, collecting
    every problem; return the inspection and the validated transform.

    Raises:
        SpecError, TransformError: the source cannot be read, or the transform is refused.
    """
    import pyspark
    frame = source.schema_frame(session)
    types = types_of(frame)
    inspection = Inspection(ServerInfo("spark", pyspark.__version__, 0, "UTF8"),
                            [c for c in (column_info(n, t) for n, t in types) if c is not None], [], [], None, [], None)
    problems = inspection.problems
    transform = None
    if spec.transform_sql is not None:
        from backfill_assets.core.engines.spark.guard import check_spark_transform
        transform = check_spark_transform(spec.transform_sql, types)
    else:
        missing = [c for c in spec.input_columns if c not in dict(types)]
        if missing:
            problems.append(f"source {spec.source_name} has no column(s) {', '.join(missing)}; check columns and "
                            "ordering against the source")
            return inspection, transform
    try:
        found = types_of(input_of(session, frame, spec, transform))
    except Exception as err:  # noqa: BLE001 - Spark's analysis errors, reported as the spec's
        raise SpecError(f"the input of spec {spec.name} cannot be read in Spark: "
                        f"{' '.join(str(err).split())[:300]}") from None
    inspect_input(conn, spec, inspection, found, column_info, unsupported)
    return inspection, transform


def resolve(conn: psycopg.Connection | None, spec: Spec, request: PartitionRequest | list[str], source: SparkSource,
            session: SparkSession) -> Context:
    """Inspect read-only and validate everything about a Spark spec before any write."""
    inspection, transform = inspect(conn, spec, source, session)
    if spec.partition_window is not None and spec.partition_key in getattr(source, "without_zone", ()):
        raise SpecError(
            f"source column {spec.partition_key} is a timestamp without time zone, which engine spark reads over "
            "JDBC as the instant its clock shows in UTC: its clock's own zone (partition_window.column_time_zone) "
            "would be lost, so engine spark does not window it yet; read a view that converts it "
            f"({spec.partition_key} AT TIME ZONE '<its zone>' AS {spec.partition_key}, a timestamptz), "
            "or plan on engine postgres")
    inspection.require_plannable()  # its problems first
    if spec.partition_window is not None and key_column(spec) in {c.name for c in inspection.source_columns}:
        raise SpecError(f"the source has a column named {key_column(spec)}, the name engine spark gives each window's "
                        "folder; rename that column")
    partitions = requested_partitions(spec, inspection, request)
    engine = engine_for(spec)
    engine.check_partitions(partitions)
    return Context(spec, engine, inspection, partitions, transform)
