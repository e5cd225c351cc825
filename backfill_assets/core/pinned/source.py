"""A lake source pinned to one version that cannot change (each format in its own module:
``delta``, ``iceberg``, ``parquet``; ``by_format`` picks the spec's).

A plan pins what it read, and both builds, approval and apply read exactly that:

- Delta: the table version (a version's files are never rewritten in place). It stays
  readable until a vacuum deletes its files or the log is cleaned up past it.
- Iceberg: the snapshot id. It stays readable until the snapshot is expired or its files
  are deleted.
- Parquet: a Hive-partitioned folder (``<partition_key>=<value>/...parquet``) has no version
  of its own: the pin is the list of the planned partitions' files with each file's size and
  SHA-256, and the version is the SHA-256 of that list. Any file added, removed or rewritten
  in those partitions breaks it.

:meth:`LakeSource.unreadable` says why a pin can no longer be read ("plan again"). DuckDB
reads the pinned files itself, as ``source_rows`` on the caller's connection (see
core.pinned.iceberg.IcebergSource._register for the exception). :meth:`LakeSource.signature` is the source
sensor's cheap per-partition signal: metadata only, no data file read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from backfill_assets.core.errors import SnapshotError, SpecError
from backfill_assets.core.lake.parts import Part, Span, spans_table
from backfill_assets.core.pinned.pins import Pin

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection


# The relation the pinned rows are visible as, on the connection that reads them.
SOURCE_ROWS = "source_rows"


# The time windows a build reads (core.lake.tables.spans_table: label, lo, hi), registered on
# the connection beside the pinned rows.
WINDOWS = "__backfill_windows"


def spans_in(values: Sequence[Part]) -> list[Span]:
    """The time windows among the partitions asked for (none: they are values)."""
    return [v for v in values if isinstance(v, Span)]


def in_windows(duck: DuckDBPyConnection, relation: Any, column: str, spans: Sequence[Span]) -> Any:
    """The rows of ``relation`` whose ``column`` lies in one of ``spans`` (registered as
    :data:`WINDOWS` on ``duck``): a semi-join, whose bounds DuckDB pushes into the Parquet
    scan, skipping the row groups whose statistics lie outside."""
    duck.register(WINDOWS, spans_table(spans))
    return relation.set_alias("s").join(duck.table(WINDOWS).set_alias("w"),
                                        f"s.{quoted(column)} >= w.lo AND s.{quoted(column)} < w.hi", how="semi")


def quoted(name: str) -> str:
    """A column name as DuckDB's quoted identifier."""
    return '"' + name.replace('"', '""') + '"'


def plan_again(name: str, pin: Pin, why: str) -> SnapshotError:
    return SnapshotError(f"the pinned version {pin.version} of {name} can no longer be read ({why}); plan again")


class LakeSource:
    """A lake source (Delta, Iceberg or Parquet; see the module docstring)."""

    name: str
    # Whether a pin holds every partition at its version (a table format's log); a folder's pin
    # holds only the files of the partitions it was taken for.
    keeps_versions = True

    def latest(self, partition_key: str, values: Sequence[Part]) -> Pin:
        """The newest version, for the partitions ``values``."""
        raise NotImplementedError

    def unreadable(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> str | None:
        """Why the partitions ``values`` of ``pin`` can no longer be read exactly (a vacuumed
        or expired version, a file missing or changed), or None. Reads metadata and file
        listings (a Parquet folder's files are hashed again)."""
        raise NotImplementedError

    def attach(self, duck: DuckDBPyConnection, pin: Pin, partition_key: str, values: Sequence[Part]) -> None:
        """Make the partitions ``values`` (values of the key, or time windows of it: then only
        the rows in a window, read from the files whose statistics can hold them) of ``pin`` readable as :data:`SOURCE_ROWS` on the
        DuckDB connection ``con`` (its own: each build reads the source on its own).

        Raises:
            SnapshotError: the pin can no longer be read; plan again.
        """
        raise NotImplementedError

    def attach_all(self, duck: DuckDBPyConnection, pin: Pin) -> None:
        """Every partition of ``pin`` as :data:`SOURCE_ROWS` on ``con`` (where moved keys'
        newest versions are looked for; a Parquet pin holds only its partitions' files)."""
        raise SpecError(f"records_can_move needs every partition of the source: {self.name} cannot give them")

    def attach_newest(self, duck: DuckDBPyConnection) -> None:
        """Every partition of the source's newest version as :data:`SOURCE_ROWS` on ``con``
        (what ``profile`` reads, filtering the partitions it profiles; nothing is pinned)."""
        self.attach_all(duck, self.latest("", ()))

    def attach_schema(self, duck: DuckDBPyConnection) -> None:
        """Make the source's newest columns readable as :data:`SOURCE_ROWS` on ``con``, without
        rows (what inspection describes)."""
        raise NotImplementedError

    def signature(self, partition_key: str, values: Sequence[Part]) -> tuple[str, dict[str, str]]:
        """The newest version, and per partition a digest of the files that hold it there
        (metadata only): the source sensor's signal of which partitions changed."""
        raise NotImplementedError

    def signature_at(self, pin: Pin, partition_key: str, values: Sequence[Part]) -> dict[str, str]:
        """Per partition, the digest :meth:`signature` gives, at ``pin`` (metadata only)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the source opened (an Iceberg catalog's connections)."""

