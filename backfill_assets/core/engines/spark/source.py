"""The source of a Spark spec, pinned so that both builds, approval and apply read exactly
the same rows.

- Parquet (``format: parquet``): a Hive-partitioned folder, pinned as the DuckDB engine pins
  it (core.pinned.parquet.ParquetSource): the planned partitions' files with each file's size
  and SHA-256; Spark reads exactly those files.
- JDBC (``format: jdbc``): a PostgreSQL table, copied once, when the snapshot is taken, into
  ``<staging>/snapshots/<copy>/`` as Parquet, and pinned as that copy's files. The copy is one
  SELECT on one connection (no ``partitionColumn``: Spark would open one connection, and one
  snapshot of the source, per slice), so it is one consistent read. ``numeric`` columns
  without a declared scale are refused (Spark's JDBC reader would make them
  ``decimal(38,18)``, changing their text and failing on large values). A copy is removed
  when a later copy is taken once it is older than ``approval_expires_after`` and a day.
- A catalog table (``format: spark_table``): core.engines.spark.catalog_source.

Spark's errors name the JDBC URL, which may carry a password: a failure is reported with
the URL and any ``password=`` value removed, and never chained.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.core.engines.spark.files import sha256_files
from backfill_assets.core.engines.spark.session import staging_dir
from backfill_assets.core.engines.spark.windows import key_column, label_columns, labelled, restricted, windows_frame
from backfill_assets.core.errors import SnapshotError, SpecError
from backfill_assets.core.lake.lake_files import files_digest
from backfill_assets.core.lake.parts import Part, part_label
from backfill_assets.core.pinned.parquet import ParquetSource as _Folder
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import spans_in
from backfill_assets.core.spec import JdbcSourceSpec, ParquetSourceSpec, Spec
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JDBC_DRIVER = "org.postgresql.Driver"


class SparkSource:
    """What the Spark engine asks of its source (see the module docstring)."""

    name: str
    # The engine's session, started when first asked for: pinned files are hashed on its
    # executors where there is much to hash (core.engines.spark.files.sha256_files).
    session_of: Callable[[], SparkSession] | None = None

    def use_session(self, session_of: Callable[[], SparkSession]) -> None:
        self.session_of = session_of

    def sha256(self, paths: Sequence[Path]) -> dict[Path, str]:
        """Each file's SHA-256, by path."""
        found = sha256_files([str(p) for p in paths], self.session_of)
        return {p: found[str(p)] for p in paths}

    def newest(self, session: SparkSession) -> Any:
        """Every row of the source as it is now, as a DataFrame that reads them when asked
        (what ``profile`` reads; nothing is pinned or copied)."""
        raise NotImplementedError

    def schema_frame(self, session: SparkSession) -> Any:
        """The newest columns of the source, as a DataFrame that reads no row."""
        return self.newest(session).limit(0)

    def latest(self, session: SparkSession, partition_key: str, values: Sequence[PartitionValue]) -> Pin:
        """Pin the partitions ``values`` (a JDBC source is copied here)."""
        raise NotImplementedError

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[PartitionValue]) -> str | None:
        """Why ``pin`` no longer holds exactly its files (hashed again), or None."""
        raise NotImplementedError

    def frame(self, session: SparkSession, pin: Pin) -> Any:
        """The pinned rows, as a DataFrame of ``session``."""
        raise NotImplementedError

    def frame_all(self, session: SparkSession, pin: Pin, partition_key: str) -> Any:
        """Every partition of the source: the pinned ones as pinned, the others as they are now
        (where records_can_move looks for a key's versions; core.engines.spark.moves)."""
        from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
        pinned = sorted(self.pinned_labels(pin, partition_key))
        others = self.newest(session).where(~F.col(partition_key).cast("string").isin(pinned))
        return self.frame(session, pin).unionByName(others) if pin.files else others

    def pinned_labels(self, pin: Pin, partition_key: str) -> set[str]:
        """The partitions ``pin`` holds files of."""
        found = set()
        for path, _, _ in pin.files:
            directory = next((p for p in path.split("/") if p.startswith(f"{partition_key}=")), None)
            if directory is not None:
                found.add(_label(directory))
        return found

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        """Per partition, the digest of its files at the pin (the snapshot's partition hash)."""
        per: dict[str, list[tuple[str, str]]] = {partition_label(v): [] for v in values}
        for path, size, digest in pin.files:
            directory = next(part for part in path.split("/") if part.startswith(f"{partition_key}="))
            label = _label(directory)
            if label in per:
                per[label].append((path.split("/", 1)[1] if self._copied else path, f"{size}:{digest}"))
        return {label: files_digest(sorted(files)) for label, files in per.items()}

    _copied = False

    def close(self) -> None:
        pass


def _label(directory: str) -> str:
    import urllib.parse
    return urllib.parse.unquote(directory.partition("=")[2])


def _read_files(session: SparkSession, base: Path, files: Sequence[str]) -> Any:
    # basePath: the partition key comes from the directory names, typed as Spark infers it.
    return session.read.option("basePath", str(base)).parquet(*[str(base / f) for f in files])


class ParquetFolderSource(SparkSource):
    def __init__(self, spec: ParquetSourceSpec, windowed: bool = False) -> None:
        self.folder = _Folder(spec, windowed=windowed)
        self.root, self.name = self.folder.root, self.folder.name

    def use_session(self, session_of: Callable[[], SparkSession]) -> None:
        super().use_session(session_of)
        self.folder.hash_files = lambda paths: sha256_files(paths, session_of)

    def newest(self, session: SparkSession) -> Any:
        if not self.root.is_dir():
            raise SpecError(f"source {self.name} is not a folder; check source.location")
        if next((p for p in self.root.rglob("*.parquet") if p.is_file()), None) is None:
            raise SpecError(f"source {self.name} holds no Parquet file; check source.location")
        return session.read.parquet(str(self.root))

    def latest(self, session: SparkSession, partition_key: str, values: Sequence[Part]) -> Pin:
        return self.folder.latest(partition_key, values)

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        return self.folder.unreadable(pin, partition_key, values)

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        if spans_in(values):  # a window's pinned files, by their footers' statistics
            return self.folder.signature_at(pin, partition_key, values)
        return super().signature_at(pin, partition_key, values)

    def frame(self, session: SparkSession, pin: Pin) -> Any:
        if not pin.files:
            raise SnapshotError(f"source {self.name} has no Parquet file in the planned partitions; check the "
                                "partitions and the folder")
        if any(not (self.root / f[0]).is_file() for f in pin.files):
            raise SnapshotError(f"the pinned version {pin.version} of {self.name} can no longer be read (a file is "
                                "gone); plan again")
        return _read_files(session, self.root, [f[0] for f in pin.files])


def _scrubbed(text: str, url: str) -> str:
    text = " ".join(text.split())
    if url:
        text = text.replace(url, "[url]")
    return re.sub(r"(?i)(password=)[^&]*", r"\1[redacted]", text)


class JdbcSource(SparkSource):
    _copied = True

    def __init__(self, spec: Spec) -> None:
        source = spec.source
        assert isinstance(source, JdbcSourceSpec)
        self.env, self.table, self.name = source.url_env, source.ref, source.display_name
        self.key = key_column(spec)  # what the copy is partitioned by: the key, or a window's label
        self.labels = label_columns(spec)  # a window's label, which the frame read drops and labels again
        self.copies = staging_dir(spec) / "snapshots"
        self.without_zone: set[str] = set()  # the columns of time stamps without zone, once read
        # A copy older than an approval may be cannot be applied any more: it is removed when
        # the next copy is taken (a plan that still names it is refused with "plan again").
        self.kept_for = spec.approval_expires_after.total_seconds() + 86400

    def _url(self) -> str:
        url = os.environ.get(self.env)
        if not url:
            raise SpecError(f"environment variable {self.env} is not set; set it to the source's JDBC URL "
                            "(jdbc:postgresql://host:port/database?user=...)")
        if not url.startswith("jdbc:postgresql:"):
            raise SpecError(f"{self.env} must hold a PostgreSQL JDBC URL (jdbc:postgresql://...); "
                            "other databases are not supported yet")
        return url

    @contextlib.contextmanager
    def _errors(self, what: str, url: str) -> Iterator[None]:
        try:
            yield
        except SpecError:
            raise
        except Exception as err:  # noqa: BLE001 - Spark and py4j raise many kinds; all end here
            text = _scrubbed(str(err).split("\n", 1)[0], url)[:300]
        else:
            return
        raise SpecError(f"{what} {self.name} over JDBC failed: {text}; check {self.env} and that the table exists")

    def _reader(self, session: SparkSession, url: str, table: str) -> Any:
        return (session.read.format("jdbc").option("url", url).option("driver", JDBC_DRIVER)
                .option("dbtable", table).option("fetchsize", "10000"))

    def _relation(self, session: SparkSession, url: str) -> str:
        """What the reader reads: the table or, where it has time stamps without time zone, a
        SELECT of its columns in order that sends each of those as the instant of its
        wall-clock time in UTC (``AT TIME ZONE 'UTC'``: a timestamp with time zone, which the
        driver reads exactly whatever the JVM's zone; the driver would read the wall-clock
        time itself in the JVM's zone, so two executors in two zones would read two instants).

        Raises:
            SpecError: a numeric without a declared scale (it would become decimal(38,18)).
        """
        from psycopg import sql
        from pyspark.sql import functions as F  # noqa: N812 - Spark's own convention
        columns = self._reader(session, url, "information_schema.columns").load().where(
            (F.col("table_schema") == self.table.schema) & (F.col("table_name") == self.table.name))
        found = sorted(columns.select("ordinal_position", "column_name", "data_type", "numeric_scale").collect())
        unscaled = [f"{name} ({kind})" for _, name, kind, scale in found if kind == "numeric" and scale is None]
        if unscaled:
            raise SpecError(
                f"source {self.name} column(s) {', '.join(unscaled)} have no exact form over JDBC: a numeric without "
                "a declared scale becomes decimal(38,18); declare numeric(p,s) in the source, or read a view that "
                "casts it")
        table = sql.Identifier(self.table.schema, self.table.name)
        self.without_zone = {name for _, name, kind, _ in found if kind == "timestamp without time zone"}
        if not self.without_zone:
            return table.as_string(None)
        utc = sql.SQL("{} AT TIME ZONE 'UTC' AS {}")
        return sql.SQL("(SELECT {columns} FROM {table}) AS {alias}").format(
            columns=sql.SQL(", ").join(utc.format(sql.Identifier(name), sql.Identifier(name))
                                       if kind == "timestamp without time zone" else sql.Identifier(name)
                                       for _, name, kind, _ in found),
            table=table, alias=sql.Identifier("source")).as_string(None)

    def newest(self, session: SparkSession, push_down_aggregates: bool = False) -> Any:
        """(``push_down_aggregates``: a GROUP BY over the frame is sent to the database.)"""
        url = self._url()
        with self._errors("reading the columns of", url):
            reader = self._reader(session, url, self._relation(session, url))
            if push_down_aggregates:
                reader = reader.option("pushDownAggregate", "true")
            return reader.load()

    def latest(self, session: SparkSession, partition_key: str, values: Sequence[Part]) -> Pin:
        """Copy the partitions ``values`` in one SELECT on one connection, and pin the copy (time
        windows: their rows, partitioned by each one's label)."""
        from pyspark.sql import functions as F  # noqa: N812
        url = self._url()
        copy = f"copy-{uuid.uuid4().hex}"
        target = self.copies / copy
        self.copies.mkdir(parents=True, exist_ok=True)
        try:
            with self._errors("copying", url):
                frame = self._reader(session, url, self._relation(session, url)).load()
                windows = spans_in(values)
                if windows:
                    # The windows' whole range as a filter the reader sends to the database (the
                    # key's index serves it); then each row in a window, labelled by it.
                    least, most = min(w.start for w in windows), max(w.end for w in windows)
                    frame = frame.where((F.col(partition_key) >= F.lit(least)) & (F.col(partition_key) < F.lit(most)))
                    bounds = windows_frame(session, windows, self.key)
                    rows = labelled(restricted(frame, partition_key, bounds), partition_key, bounds)
                else:
                    rows = frame.where(F.col(partition_key).isin(list(values)))
                rows.write.partitionBy(self.key).parquet(str(target))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        for old in self.copies.glob("copy-*"):
            if old != target and time.time() - old.stat().st_mtime > self.kept_for:
                shutil.rmtree(old, ignore_errors=True)
        kept = [p for p in sorted(target.rglob("*.parquet"))
                if p.is_file() and not any(part.startswith(("_", ".")) for part in p.relative_to(self.copies).parts)]
        digests = self.sha256(kept)
        files = [(p.relative_to(self.copies).as_posix(), p.stat().st_size, digests[p]) for p in kept]
        return Pin(files_digest([(f"{p.split('/', 1)[1]}", str(n), h) for p, n, h in files]), tuple(files))

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        for path, size, _ in pin.files:
            p = self.copies / path
            if not p.is_file():
                return f"the copy's file {path} is gone"
            if p.stat().st_size != size:
                return f"the copy's file {path} was rewritten"
        digests = self.sha256([self.copies / path for path, _, _ in pin.files])
        for path, _, digest in pin.files:
            if digests[self.copies / path] != digest:
                return f"the copy's file {path} was rewritten"
        return None

    def frame(self, session: SparkSession, pin: Pin) -> Any:
        if not pin.files:
            raise SnapshotError(f"source {self.name} had no row in the planned partitions when it was copied; check "
                                "the partitions")
        base = self.copies / pin.files[0][0].split("/", 1)[0]
        frame = _read_files(session, base, [f[0].split("/", 1)[1] for f in pin.files])
        return frame.drop(*self.labels) if self.labels else frame  # labelled again as read

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        """By the copy's folders: a value's, or a window's label's."""
        labels = [part_label(v) for v in values]
        return super().signature_at(pin, self.key, labels)
