"""A Hive-partitioned Parquet folder as a pinned source: the pin is the list of the planned
partitions' files with their sizes and SHA-256 (core.pinned.source). For time windows the
planned partitions' files are those anywhere in the folder whose row groups' statistics of the
column can hold a row of a window (read from the files' footers, no row read)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from backfill_assets.core.errors import SnapshotError, SpecError
from backfill_assets.core.lake.lake_files import files_digest, sha256_files
from backfill_assets.core.lake.parts import Part, Span, part_label, window_files
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import SOURCE_ROWS, LakeSource, in_windows, plan_again, spans_in
from backfill_assets.core.spec import ParquetSourceSpec
from backfill_assets.core.vocabulary import partition_label

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


class ParquetSource(LakeSource):
    keeps_versions = False

    def __init__(self, spec: ParquetSourceSpec, windowed: bool = False) -> None:
        self.root = Path(local_path(spec.location))
        self.windowed = windowed  # partitions are time windows: a pin lists files, not folders
        self.name = spec.display_name
        self.hash_files = sha256_files  # the pinned files' SHA-256 (an engine may hash them on its executors)

    def _listing(self, partition_key: str, values: Sequence[Part]) -> dict[str, list[Path]]:
        """Per partition label, its files (``<key>=<value>/``, any depth below; a time window's:
        :meth:`_window_files`)."""
        if not self.root.is_dir():
            raise SpecError(f"source {self.name} is not a folder; check source.location")
        spans = spans_in(values)
        if spans:
            return self._window_files(partition_key, spans, sorted(p for p in self.root.rglob("*.parquet") if p.is_file()))
        wanted = {partition_label(v) for v in values}
        found: dict[str, list[Path]] = {label: [] for label in wanted}
        for entry in sorted(self.root.iterdir()):
            key, sep, raw = entry.name.partition("=")
            if not sep or key != partition_key or not entry.is_dir():
                continue
            label = urllib.parse.unquote(raw)
            if label in found:
                found[label] = sorted(p for p in entry.rglob("*.parquet") if p.is_file())
        return found

    def _window_files(self, column: str, spans: Sequence[Span], paths: Sequence[Path]) -> dict[str, list[Path]]:
        """Per window, the files among ``paths`` that can hold its rows (core.lake.parts.window_files)."""
        return {label: [Path(p) for p in held] for label, held in window_files(column, spans, [str(p) for p in paths]).items()}

    def _pin(self, listing: dict[str, list[Path]], hashed: bool) -> Pin:
        unique = sorted({p for paths in listing.values() for p in paths})  # windows may share a file
        digests = self.hash_files([str(p) for p in unique]) if hashed else {}
        files = [(p.relative_to(self.root).as_posix(), p.stat().st_size, digests.get(str(p), "")) for p in unique]
        files.sort()
        return Pin(files_digest(files), tuple(files))

    def latest(self, partition_key: str, values: Sequence[Part]) -> Pin:
        return self._pin(self._listing(partition_key, values), hashed=True)

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        now = self.latest(partition_key, values)
        if now.files == pin.files:
            return None
        before, after = {f[0]: f for f in pin.files}, {f[0]: f for f in now.files}
        for path in sorted(before.keys() | after.keys()):
            if path not in after:
                return f"file {path} was removed"
            if path not in before:
                return f"file {path} was added"
            if before[path] != after[path]:
                return f"file {path} was rewritten"
        return "its files changed"

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[Part]) -> None:
        # The files were hashed against the pin by the step (unreadable) before any attach;
        # approval hashes them again before anything is written.
        if any(not (self.root / f[0]).is_file() for f in pin.files):
            raise plan_again(self.name, pin, "a file is gone")
        files = [str(self.root / f[0]) for f in pin.files]
        spans = spans_in(values)
        if not files and spans:  # no file can hold a row of the windows: none has any
            self.attach_schema(duck)
            return
        if not files:
            raise SnapshotError(f"source {self.name} has no Parquet file in partition(s) "
                                f"{', '.join(part_label(v) for v in values)}; check the partitions and the folder")
        # hive_partitioning: the partition key comes from the folder names, typed by DuckDB.
        relation = duck.read_parquet(files, hive_partitioning=True)
        if spans:  # the pinned files may hold other windows' rows too
            relation = in_windows(duck, relation, partition_key, spans)
        duck.register(SOURCE_ROWS, relation)  # this connection's only

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        """The pinned partitions' files and, for every other partition (every other file, for
        time windows), its files now: where moved keys' versions are looked for (the snapshot pins the partitions that hold them
        and looks again at that pin, core.engines.duckdb.snapshot)."""
        if any(not (self.root / f[0]).is_file() for f in pin.files):
            raise plan_again(self.name, pin, "a file is gone")
        files = [str(self.root / f[0]) for f in pin.files]
        if self.windowed:  # a window's pin lists its files: every other file as it is
            pinned_files = set(files)
            files += [str(p) for p in sorted(self.root.rglob("*.parquet")) if p.is_file() and str(p) not in pinned_files]
        else:
            pinned = {f[0].split("/", 1)[0] for f in pin.files}
            for entry in sorted(self.root.iterdir()) if self.root.is_dir() else []:
                if entry.is_dir() and "=" in entry.name and entry.name not in pinned:
                    files += [str(p) for p in sorted(entry.rglob("*.parquet")) if p.is_file()]
        if not files:
            raise SnapshotError(f"source {self.name} holds no Parquet file; check source.location")
        duck.register(SOURCE_ROWS, duck.read_parquet(files, hive_partitioning=True))

    def attach_newest(self, duck: DuckDBPyConnection) -> None:
        self.attach_schema(duck)  # the folder holds a Parquet file
        duck.register(SOURCE_ROWS, duck.read_parquet(str(self.root / "**" / "*.parquet"), hive_partitioning=True))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        if not self.root.is_dir():
            raise SpecError(f"source {self.name} is not a folder; check source.location")
        first = next((p for p in sorted(self.root.rglob("*.parquet")) if p.is_file()), None)
        if first is None:
            raise SpecError(f"source {self.name} holds no Parquet file; check source.location")
        duck.register(SOURCE_ROWS, duck.read_parquet(str(first), hive_partitioning=True).limit(0))

    def signature(self, partition_key: str, values: Sequence[Part]) -> tuple[str, dict[str, str]]:
        """Per partition, a digest of its files' paths and sizes (no file is read: a file
        rewritten at the same size is found by approval and apply, which hash every file)."""
        listing = self._listing(partition_key, values)
        per = {label: files_digest([(p.relative_to(self.root).as_posix(), str(p.stat().st_size)) for p in paths])
               for label, paths in listing.items()}
        return files_digest(sorted(per.items())), per

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        spans = spans_in(values)
        if spans:  # each window's pinned files, by their footers' statistics
            sizes = {f[0]: str(f[1]) for f in pin.files}
            present = [self.root / f[0] for f in pin.files if (self.root / f[0]).is_file()]
            held = self._window_files(partition_key, spans, present)
            return {label: files_digest([(p.relative_to(self.root).as_posix(), sizes[p.relative_to(self.root).as_posix()])
                                         for p in paths]) for label, paths in held.items()}
        per: dict[str, list[tuple[str, str]]] = {partition_label(v): [] for v in values}
        for path, size, _ in pin.files:
            label = urllib.parse.unquote(path.split("/", 1)[0].partition("=")[2])
            if label in per:
                per[label].append((path, str(size)))
        return {label: files_digest(files) for label, files in per.items()}

