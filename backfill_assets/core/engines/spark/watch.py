"""The source sensor's signatures of the Spark engine's sources that are not lake folders
(core.pinned.watch asks them; a Parquet folder is watched as a lake source):

- a catalog table (``format: spark_table``): per partition, its location and the names and
  sizes of the files there, from the catalog and a listing (no file read; a time window's
  files are those whose footers' statistics can hold its rows, every partition's location
  listed and each file's footer read); the pin recorded the same files, with their SHA-256,
  which approval and apply check again;
- a JDBC source with ``change_column``: per partition, its row count and newest change value,
  as the PostgreSQL engine's second gate reads them (core.engines.postgres.watch): now from the
  database (one aggregate the JDBC reader pushes down to it), at the pin from the pinned copy's
  Parquet files. An UPDATE that leaves the change column is missed, as on PostgreSQL.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from backfill_assets.core.catalog import partition_kind_of, windowing_of
from backfill_assets.core.engines.spark.catalog_source import CatalogSource, data_files
from backfill_assets.core.engines.spark.session import column_info
from backfill_assets.core.engines.spark.source import JdbcSource, SparkSource
from backfill_assets.core.engines.spark.windows import key_column, labelled, restricted, windows_frame
from backfill_assets.core.lake.lake_files import files_digest
from backfill_assets.core.lake.parts import Part, Span, span_of
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionKind, PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _spans(spec: Spec, frame: Any, values: Sequence[PartitionValue]) -> list[Span]:
    """The windows ``values`` (labels) as the source's column holds their bounds."""
    field = next(f for f in frame.schema.fields if f.name == spec.partition_key)
    info = column_info(field.name, field.dataType.simpleString())
    assert info is not None
    windowing = windowing_of(spec, info)
    return [span_of(windowing, str(v)) for v in values]


def _kind(frame: Any, partition_key: str) -> PartitionKind:
    field = next((f for f in frame.schema.fields if f.name == partition_key), None)
    info = None if field is None else column_info(field.name, field.dataType.simpleString())
    kind = None if info is None else partition_kind_of(info, [])
    return kind or "text"


class CatalogSignatures:
    """A catalog table's partitions by their locations' files (names and sizes); made for one
    tick, which reads the table's columns once."""

    def __init__(self, spec: Spec, source: CatalogSource, session: SparkSession) -> None:
        self.spec, self.source, self.session = spec, source, session

    @functools.cached_property
    def _frame(self) -> Any:
        return self.source.schema_frame(self.session)

    def kind(self) -> PartitionKind:
        if self.spec.partition_window is not None:
            return "text"  # windows are named by their labels
        return _kind(self._frame, self.spec.partition_key)

    def now(self, values: Sequence[PartitionValue]) -> dict[str, str]:
        if self.spec.partition_window is not None:
            spans = _spans(self.spec, self._frame, values)
            return {label: files_digest([(str(p), str(p.stat().st_size)) for _, p in held])
                    for label, held in self.source.window_files(self.session, spans).items()}
        return {label: files_digest([(str(p), str(p.stat().st_size)) for p in data_files(location)])
                for label, location in self.source.locations(self.session, values).items()}

    def at(self, pin: Pin, values: Sequence[PartitionValue]) -> dict[str, str]:
        parts: Sequence[Part] = values
        if self.spec.partition_window is not None:
            parts = _spans(self.spec, self._frame, values)
        return {label: files_digest(sorted((path, str(size)) for path, size, _ in held))
                for label, held in self.source.pinned_per_part(pin, parts).items()}


def _newest_text(value: Any) -> str:
    return "none" if value is None else str(value)


class JdbcSignatures:
    """A JDBC source's partitions by their row count and newest change value."""

    def __init__(self, spec: Spec, source: JdbcSource, session: SparkSession, change_column: str) -> None:
        self.spec, self.source, self.session, self.change = spec, source, session, change_column

    def kind(self) -> PartitionKind:
        if self.spec.partition_window is not None:
            return "text"  # windows are named by their labels
        return _kind(self.source.schema_frame(self.session), self.spec.partition_key)

    def now(self, values: Sequence[PartitionValue]) -> dict[str, str]:
        from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
        frame = self.source.newest(self.session, push_down_aggregates=True)
        newest = F.max(self.change)
        if dict(frame.dtypes)[self.change] == "timestamp":
            newest = F.unix_micros(newest)
        pk = self.spec.partition_key
        if self.spec.partition_window is not None:  # each row of the windows by its window's label
            spans = _spans(self.spec, frame, values)
            least, most = min(w.start for w in spans), max(w.end for w in spans)
            key = key_column(self.spec)
            windows = windows_frame(self.session, spans, key)
            bounded = frame.where((F.col(pk) >= F.lit(least)) & (F.col(pk) < F.lit(most)))
            frame, pk = labelled(restricted(bounded, pk, windows), pk, windows), key
        rows = (frame.where(F.col(pk).isin(list(values))).groupBy(pk)
                .agg(F.count(F.lit(1)), newest.cast("string")).collect())
        found = {partition_label(r[0]): f"{int(r[1])}:{_newest_text(r[2])}" for r in rows}
        return {partition_label(v): found.get(partition_label(v), "0:none") for v in values}

    def at(self, pin: Pin, values: Sequence[PartitionValue]) -> dict[str, str]:
        wanted = {partition_label(v) for v in values}
        per: dict[str, list[Path]] = {label: [] for label in wanted}
        for path, _, _ in pin.files:
            directory = next(p for p in path.split("/") if p.startswith(f"{key_column(self.spec)}="))
            label = urllib.parse.unquote(directory.partition("=")[2])
            if label in per:
                per[label].append(self.source.copies / path)
        out = {}
        for label, files in per.items():
            data = (pa.concat_tables([pq.read_table(f, columns=[self.change]) for f in files]) if files
                    else pa.table({self.change: pa.array([], pa.int64())}))
            column = data.column(self.change)
            newest = pc.max(column).as_py() if data.num_rows else None
            if pa.types.is_timestamp(column.type) and newest is not None:
                newest = pc.cast(pc.max(pc.cast(column, pa.timestamp("us", tz="UTC"))), pa.int64()).as_py()
            out[label] = f"{data.num_rows}:{_newest_text(newest)}"
        return out


def signatures_for(spec: Spec, source: SparkSource, session: SparkSession) -> Any:
    """The signatures of a catalog table or a JDBC source with a change column (None: a JDBC
    source without one, which the sensor cannot watch without reading every row)."""
    if isinstance(source, CatalogSource):
        return CatalogSignatures(spec, source, session)
    change = getattr(spec.source, "change_column", None)
    if isinstance(source, JdbcSource) and change is not None:
        return JdbcSignatures(spec, source, session, change)
    return None
