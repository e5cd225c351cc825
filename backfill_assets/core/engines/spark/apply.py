"""Apply's target on Spark (:class:`SparkTarget`): the partition is written by Spark's executors
from stage A's files, and fingerprinted by them; the driver moves only metadata (file lists,
readings, the switch), so its memory does not grow with the partition.

Under each partition's lock (core.apply):

- The target's partition is read as the files the table lists for it, and fingerprinted by
  Spark (the readings before, and whether the approval still covers it).
- Stage A is rechecked by its seals (core.engines.spark.stages.seals_hold): the same files,
  sizes and SHA-256 as when it was fingerprinted, or fingerprinted again.
- Stage A's files of the partition (Parquet without the partition column, as the target
  holds it) are placed where the table puts a new partition (a folder's
  ``_backfill_staging/<run>/``, a catalog table's ``_backfill_versions/.../<run>``) as hard
  links: no byte copied, no row decoded. Where the file system cannot link them (another
  device), Spark reads the partition and writes it there.
- The placed files are proved before anything is switched in: where they are stage A's files,
  by their bytes (the same names, sizes and SHA-256 as stage A's seal, whose readings are
  those of exactly these files: core.engines.spark.stages.sealed); otherwise (Spark
  wrote them, or any file differs) by Spark's fingerprint of their rows. Either way the
  readings of exactly what is about to be switched in, compared with the approval.
- The table switches the written partition in (a directory exchange, a catalog update), if
  nobody changed the partition since it was listed; then its files are listed afresh and
  proved again the same way, by their bytes where they are still the sealed files, by their
  rows otherwise: the verification after the commit.

What a run wrote and did not switch in is removed when the write ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import psycopg

from backfill_assets.core.context import Checkpoint, Context, no_checkpoint
from backfill_assets.core.engines.spark.catalog import quoted
from backfill_assets.core.engines.spark.files import files_readings, partition_frame, sha256_files
from backfill_assets.core.engines.spark.parquet import ParquetFolderTable, partition_dir
from backfill_assets.core.engines.spark.session import schema_ddl
from backfill_assets.core.engines.spark.stages import sealed, stage_files, stage_frame
from backfill_assets.core.engines.spark.windows import key_column
from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.lake.engine import lake_engine_for
from backfill_assets.core.lake.lake_files import Proven, digests, proved_by_bytes
from backfill_assets.core.lake.tables import EXAMPLE_KEYS, META_PREFIX, KeysFound
from backfill_assets.core.lake.target import LakeTarget, LakeWrite
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@runtime_checkable
class SparkFilesTable(Protocol):
    """A target Spark writes as files (core.engines.spark.parquet, core.engines.spark.spark_table)."""

    def partition_paths(self, handle: Any, value: PartitionValue) -> list[str]:
        """The data files of one partition as ``handle`` lists them (full paths)."""

    def place(self, run: str, value: PartitionValue) -> Path:
        """Where one run writes one partition in full before it is switched in (not created)."""

    def switch_in(self, handle: Any, column: str, values: Sequence[PartitionValue],
                  placed: Mapping[str, Path]) -> str | None:
        """Switch the placed partitions (label -> where written) in; the table's new version."""

    def discard(self, run: str, values: Sequence[PartitionValue], placed: Mapping[str, Path]) -> None:
        """Remove what a run placed and did not switch in."""


class SparkTarget(LakeTarget):
    """A Spark spec's target (a Parquet folder or a catalog table), written and read by Spark
    (see the module docstring). ``session`` gives the engine's session, started when first
    asked for."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context,
                 session: Callable[[], SparkSession], checkpoint: Checkpoint = no_checkpoint) -> None:
        super().__init__(conn, control, ctx, lake_engine_for(ctx.spec).table(control), checkpoint)
        assert isinstance(self.table, SparkFilesTable), self.table
        self.files_table: SparkFilesTable = self.table
        self._session = session
        self.switched: dict[str, Proven] = {}  # label -> the files the last write proved and switched in

    @property
    def session(self) -> SparkSession:
        return self._session()

    def files(self, handle: Any, labels: list[str]) -> dict[str, list[str]]:
        """Each partition's data files as ``handle`` lists them (full paths)."""
        return {label: self.files_table.partition_paths(handle, self.ctx.value_of(label))
                for label in labels}

    def _read(self, handle: Any, labels: list[str]) -> dict[str, Reading]:
        return files_readings(self.session, self.ctx, self.files(handle, labels))

    def proved(self, files: Mapping[str, Sequence[str]], known: Mapping[str, Proven]) -> dict[str, Proven]:
        """Each partition's files (label -> full paths) proved: by their bytes where they are
        the files of ``known`` (core.lake.lake_files.proved_by_bytes), else by Spark's
        fingerprint of their rows, their bytes hashed after it."""
        def sha256(paths: Sequence[str]) -> dict[str, str]:
            return sha256_files(paths, lambda: self.session)

        by_bytes, now = proved_by_bytes(files, known, sha256)
        rest = {label: paths for label, paths in files.items() if label not in by_bytes}
        by_rows = files_readings(self.session, self.ctx, rest) if rest else {}
        now.update(digests(rest, sha256))
        return {label: Proven(now[label], by_bytes[label] if label in by_bytes else by_rows[label]) for label in files}

    @contextlib.contextmanager
    def data_transaction(self) -> Iterator[None]:
        yield  # stage A is rechecked by its seals under the partition lock; nothing held in PostgreSQL

    def new_write(self, handle: Any) -> LakeWrite:
        return SparkWrite(self, handle)

    def committed_readings(self, labels: list[str]) -> dict[str, Reading]:
        """The partitions as the table lists them now (a folder or a catalog keeps no old
        versions): by their bytes where they are the files proved before the switch, else
        fingerprinted by Spark."""
        proved = self.proved(self.files(self.table.open(), labels), self.switched)
        return {label: proved[label].readings for label in labels}


def _linked(files: list[str], place: Path) -> bool:
    """Stage A's files of a partition linked at ``place`` (hard links: no byte copied, no row
    decoded; a stage file is never written again, only removed). False where the file system
    cannot (another device, no hard links): then nothing is left at ``place``."""
    place.mkdir(parents=True)
    try:
        for path in files:
            os.link(path, place / Path(path).name)
    except OSError:
        shutil.rmtree(place, ignore_errors=True)
        return False
    return True


class SparkWrite(LakeWrite):
    """The write of a group of partitions by Spark from stage A's files, switched in by the
    table (the module docstring)."""

    def __init__(self, target: SparkTarget, handle: Any) -> None:
        super().__init__(target, handle)
        self.spark = target
        self.run = uuid.uuid4().hex
        self.placed: dict[str, Path] = {}  # label -> where Spark wrote it
        self.linked: set[str] = set()  # the labels whose placed files are links to stage A's
        self.proven: dict[str, Proven] = {}  # label -> what was proved of its placed files

    def _written(self, label: str) -> list[str]:
        place = self.placed[label]
        if not place.is_dir():
            return []
        return sorted(str(p) for p in place.iterdir() if p.suffix == ".parquet" and not p.name.startswith(("_", ".")))

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        t = self.spark
        ctx, spec = t.ctx, t.ctx.spec
        # The directory carries a value (its files leave it out); a window's files keep the time stamp.
        columns = [c for c in spec.columns if c != key_column(spec)]
        for label, files in stage_files(ctx, "a", labels).items():
            value = ctx.value_of(label)
            place = self.placed[label] = t.files_table.place(self.run, value)
            if files and _linked(files, place):
                self.linked.add(label)
            elif files:
                frame = stage_frame(t.session, ctx, "a", [value])
                if frame is not None:
                    frame.select(*columns).write.parquet(str(place))
        self.pending = {}  # the rows are in the files written
        self.note = dict(note or {})
        self.metadata = {META_PREFIX + k: v for k, v in self.note.items()}
        t.checkpoint("inserted", labels)

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        if self.pending is None:
            return super().readings(labels)
        t = self.spark
        self.proven.update(t.proved({label: self._written(label) for label in labels},
                                    sealed(t.ctx, "a", [label for label in labels if label in self.linked])))
        return {label: self.proven[label].readings for label in labels}

    def writes_keys(self, labels: list[str]) -> bool:
        return any(self._written(label) for label in labels)

    def keys_elsewhere(self, handle: Any, labels: list[str], values: list[PartitionValue]) -> KeysFound | None:
        """The keys written here that another partition of the folder holds, as ``handle``
        listed it, found by a Spark join (records_can_move: a Parquet folder target only)."""
        t = self.spark
        ctx, spec = t.ctx, t.ctx.spec
        table = t.table
        if not isinstance(table, ParquetFolderTable):
            raise SpecError("records_can_move is not supported on a spark_table target")
        key = key_column(spec)  # the directories' name: the key's value, or a window's label
        skip = {partition_dir(key, v) for v in values}
        paths = [str(table.root / d / name) for d, files in (handle.partitions.items() if handle is not None else ())
                 if d not in skip for name, _, _ in files if name.endswith(".parquet")]
        if not paths:
            return None
        keys = list(spec.business_key)
        named = {c.name: c for c in ctx.target_columns}
        ddl = schema_ddl([named[c] for c in (spec.partition_key, *keys)])
        if key != spec.partition_key:  # a window's label, from its folder's name
            ddl += f", {quoted(key)} STRING"
        others = t.session.read.schema(ddl).option("basePath", str(table.root)).parquet(*paths)
        mine = partition_frame(t.session, ctx, {label: self._written(label) for label in labels}, keys)
        if mine is None:
            return None
        found = others.join(mine.distinct(), on=keys, how="left_semi")
        first = found.orderBy(*keys, key).limit(EXAMPLE_KEYS).collect()
        if not first:
            return None
        partitions = sorted({"NULL" if r[0] is None else partition_label(r[0])
                             for r in found.select(key).distinct().collect()})
        examples = [", ".join(f"{c}={r[c]}" for c in keys) + f" in {partition_label(r[key])}" for r in first]
        return KeysFound(partitions, found.select(*keys).distinct().count(), examples)

    def overwrite(self, handle: Any, labels: list[str], values: list[PartitionValue], exclusive: bool) -> str | None:
        t = self.spark
        version = t.files_table.switch_in(handle, key_column(t.ctx.spec), labels,
                                          {label: self.placed[label] for label in labels})
        t.switched = {label: self.proven[label] for label in labels if label in self.proven}
        return version

    def discard(self) -> None:
        """Remove what this write placed and did not switch in."""
        t = self.spark
        t.files_table.discard(self.run, [t.ctx.value_of(label) for label in self.placed], self.placed)
