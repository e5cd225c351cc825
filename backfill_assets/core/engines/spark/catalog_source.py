"""A table of the Spark session's catalog as the source (``format: spark_table``), pinned as the
files at each planned partition's location with their sizes and SHA-256: a pinned file that
changes or goes breaks the pin; the catalog moving a partition elsewhere since does not (the
pinned files are still read).

A partition is a value of the table's own partition column, the partition key. With time windows
(``partition_window``) the table may be partitioned by any one column, or not at all: a window's
files are those anywhere in the table with a row group whose statistics of the time stamp can
hold one of its rows (core.lake.parts.window_files: every partition's location is listed and
each file's footer read, no row), and the windows' rows are kept from them by their range
(core.engines.spark.inspect.windowed_input).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.core.engines.spark.source import SparkSource
from backfill_assets.core.errors import SnapshotError, SpecError
from backfill_assets.core.lake.lake_files import files_digest
from backfill_assets.core.lake.parts import Part, part_label, window_files
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import spans_in
from backfill_assets.core.spec import SparkTableSpec, Spec
from backfill_assets.core.vocabulary import PartitionValue

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backfill_assets.core.engines.spark.catalog import CatalogTable


def data_files(location: Path | None) -> list[Path]:
    """Every file Spark reads at a location, whatever its name."""
    if location is None or not location.is_dir():
        return []
    return [p for p in sorted(location.iterdir()) if p.is_file() and not p.name.startswith(("_", "."))]


class CatalogSource(SparkSource):
    """A catalog table (see the module docstring). A pin's entries are ``<label>\\t<path>``:
    the value of the table's partition column the file lies under ("" in a table not
    partitioned), and the file."""

    def __init__(self, spec: Spec) -> None:
        source = spec.source
        assert isinstance(source, SparkTableSpec)
        self.table, self.name, self.partition_key = source.table, source.display_name, spec.partition_key
        self.windowed = spec.partition_window is not None

    def _catalog(self, session: SparkSession, by: str | None = None) -> CatalogTable:
        """The table, its partitions keyed by ``by`` (default: the partition key)."""
        from backfill_assets.core.engines.spark.catalog import CatalogTable
        catalog = CatalogTable(session, self.table, by or self.partition_key)
        if not catalog.exists():
            raise SpecError(f"source {self.name} does not exist in the Spark session's catalog; check source.table "
                            "and the session's catalog settings (engine.conf)")
        return catalog

    def _partitioned_by(self, catalog: CatalogTable) -> list[str]:
        """The table's partition columns, as the spec needs them.

        Raises:
            SpecError: partitioned otherwise than by the partition key (time windows: by more
                than one column).
        """
        by = catalog.partitioned_by()
        if self.windowed and len(by) > 1:
            raise SpecError(f"source {self.name} is partitioned by ({', '.join(by)}); with partition_window a "
                            "spark_table source is partitioned by one column or none")
        if not self.windowed and by != [self.partition_key]:
            raise SpecError(f"source {self.name} is partitioned by ({', '.join(by) or 'nothing'}), "
                            f"not by the partition key ({self.partition_key})")
        return by

    def locations(self, session: SparkSession, values: Sequence[PartitionValue]) -> dict[str, Path | None]:
        """Each partition's location in the catalog (None: not there)."""
        return self._catalog(session).locations(values)

    def every_location(self, session: SparkSession) -> dict[str, Path | None]:
        """Every partition's location by its value's label (a table not partitioned: its own, as "")."""
        by = self._partitioned_by(self._catalog(session))
        if not by:
            return {"": self._catalog(session).location()}
        catalog = self._catalog(session, by[0])
        return catalog.locations(sorted(catalog.listed()))

    def window_files(self, session: SparkSession, values: Sequence[Part]) -> dict[str, list[tuple[str, Path]]]:
        """Per window, the files that can hold its rows, with the label each lies under."""
        spans = spans_in(values)
        under = {str(p): label for label, location in self.every_location(session).items()
                 for p in data_files(location)}
        held = window_files(self.partition_key, spans, sorted(under))
        return {label: [(under[p], Path(p)) for p in paths] for label, paths in held.items()}

    def newest(self, session: SparkSession) -> Any:
        catalog = self._catalog(session)
        if catalog.provider() != "parquet":
            raise SpecError(f"source {self.name} is a {catalog.provider() or 'non-file'} table; a spark_table source is "
                            "a Parquet table (USING parquet)")
        self._partitioned_by(catalog)
        return session.table(self.table)

    def latest(self, session: SparkSession, partition_key: str, values: Sequence[Part]) -> Pin:
        if self.windowed:
            found = sorted({entry for held in self.window_files(session, values).values() for entry in held})
        else:
            found = [(label, p) for label, location in self._catalog(session).locations(values).items()
                     for p in data_files(location)]
        digests = self.sha256([p for _, p in found])
        files = [(f"{label}\t{p}", p.stat().st_size, digests[p]) for label, p in found]
        return Pin(files_digest(files), tuple(files))

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        for entry, size, _ in pin.files:
            p = Path(entry.split("\t", 1)[1])
            if not p.is_file():
                return f"file {p} is gone"
            if p.stat().st_size != size:
                return f"file {p} was rewritten"
        paths = [Path(entry.split("\t", 1)[1]) for entry, _, _ in pin.files]
        digests = self.sha256(paths)
        for p, (_, _, digest) in zip(paths, pin.files):
            if digests[p] != digest:
                return f"file {p} was rewritten"
        return None

    def pinned_per_part(self, pin: Pin, values: Sequence[Part]) -> dict[str, list[tuple[str, int, str]]]:
        """Per partition, its pinned files (path, size, SHA-256): a value's by the partition they
        lie under, a window's by their footers' statistics."""
        per: dict[str, list[tuple[str, int, str]]] = {part_label(v): [] for v in values}
        spans = spans_in(values)
        if spans:
            by_path = {entry.split("\t", 1)[1]: (size, digest) for entry, size, digest in pin.files}
            present = [p for p in sorted(by_path) if Path(p).is_file()]
            for label, paths in window_files(self.partition_key, spans, present).items():
                per[label] = [(p, *by_path[p]) for p in paths]
            return per
        for entry, size, digest in pin.files:
            label, path = entry.split("\t", 1)
            if label in per:
                per[label].append((path, size, digest))
        return per

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        return {label: files_digest(sorted((f"{size}:{digest}",) for _, size, digest in files))
                for label, files in self.pinned_per_part(pin, values).items()}

    def pinned_labels(self, pin: Pin, partition_key: str) -> set[str]:
        return {entry.split("\t", 1)[0] for entry, _, _ in pin.files}

    def frame(self, session: SparkSession, pin: Pin) -> Any:
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql.types import StructType
        if not pin.files:
            raise SnapshotError(f"source {self.name} has no file in the planned partitions; check the partitions")
        schema = session.table(self.table).schema
        by = set(self._partitioned_by(self._catalog(session)))
        data = StructType([f for f in schema.fields if f.name not in by])
        by_label: dict[str, list[str]] = {}
        for entry, _, _ in pin.files:
            label, path = entry.split("\t", 1)
            by_label.setdefault(label, []).append(path)
        frames = []
        for label, paths in by_label.items():
            frame = session.read.schema(data).parquet(*paths)
            for f in schema.fields:  # the partition column (if any) holds the value the files lie under
                if f.name in by:
                    frame = frame.withColumn(f.name, F.lit(label).cast(f.dataType))
            frames.append(frame)
        out = frames[0]
        for f in frames[1:]:
            out = out.unionByName(f)
        return out.select(*[f.name for f in schema.fields])
