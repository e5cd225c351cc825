"""A table of the Spark session's catalog (``format: spark_table``), partitioned by the partition
key, with its partitions in the catalog: each has a location of its own, which one catalog
update (``ALTER TABLE ... PARTITION ... SET LOCATION``) moves. That update is the atomic switch
of a catalog table, whatever the file system renames: the new partition is written in full at
a new location first, and readers that resolve the table through the catalog see the old
location or the new one. Locations are local (or shared-mount) paths here.

Spark SQL is not PostgreSQL: its statements are composed here, not with psycopg.sql (whose
double quotes Spark reads as strings). The table's name is bound (``IDENTIFIER(:table)``).
Spark takes no parameter in a PARTITION clause or a LOCATION, so those are spliced: the
partition column backtick-quoted (a backtick doubled), its value one of the tool's own typed
values (a date, an integer) or text escaped as Spark's string literals read it (backslash and
quote escaped), and the location a path the tool made under the table's own.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.core.errors import SpecError
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def quoted(name: str) -> str:
    """A column name, backtick-quoted."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: PartitionValue) -> str:
    """A partition value as a Spark SQL constant of a PARTITION clause."""
    if isinstance(value, bool):
        raise SpecError("a boolean partition key is not supported")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dt.date):
        return "'" + value.isoformat() + "'"
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def local(location: str) -> Path:
    """A catalog location (``file:/...`` or ``file:///...``) as a local path. The catalog shows a
    location as Hadoop's path, not as a URI: not %-decoded (a partition directory Spark names
    ``h=a%3Ab`` holds ``%3A`` on disk), and a space as it is."""
    scheme, sep, rest = location.partition(":")
    if not sep or "/" in scheme:  # no scheme: a path
        return Path(location)
    if scheme != "file":
        raise SpecError(f"partition location {location} is not on a local file system; this engine writes local "
                        "or shared-mount paths only")
    return Path(rest[2:] if rest.startswith("//") else rest)


class CatalogTable:
    """One partitioned table of ``session``'s catalog."""

    def __init__(self, session: SparkSession, name: str, partition_key: str) -> None:
        self.session, self.name, self.partition_key = session, name, partition_key

    def _sql(self, text: str) -> Any:
        """A statement about this table, its name bound as ``:table``."""
        return self.session.sql(text, args={"table": self.name})

    def exists(self) -> bool:
        return bool(self.session.catalog.tableExists(self.name))

    def schema(self) -> Any:
        return self.session.table(self.name).schema

    def provider(self) -> str:
        """The table's data source (``parquet``, ``delta``, ``hive`` ...), lower case."""
        return self._described().get("Provider", "").lower()

    def partitioned_by(self) -> list[str]:
        return [c.name for c in self.session.catalog.listColumns(self.name) if c.isPartition]

    def _described(self, clause: str = "") -> dict[str, str]:
        rows = self._sql(f"DESCRIBE TABLE EXTENDED IDENTIFIER(:table){clause}").collect()
        out: dict[str, str] = {}
        detailed = False
        for r in rows:  # after the columns (one may be named Location), the first of a name: a
            name = "" if r[0] is None else str(r[0]).strip()  # partition's Location before its table's
            if name.startswith("# Detailed"):
                detailed = True
            elif detailed and name and r[1] is not None:
                out.setdefault(name, str(r[1]))
        return out

    def location(self) -> Path:
        """The table's own location."""
        found = self._described().get("Location")
        if found is None:
            raise SpecError(f"table {self.name} has no location in the catalog; use a table with one")
        return local(found)

    def _clause(self, value: PartitionValue) -> str:
        return f" PARTITION ({quoted(self.partition_key)} = {literal(value)})"

    def listed(self) -> set[str]:
        """The labels of the partitions the catalog holds.

        Raises:
            SpecError: the catalog does not keep the table's partitions (a table read by path).
        """
        try:
            rows = self._sql("SHOW PARTITIONS IDENTIFIER(:table)").collect()
        except Exception as err:  # noqa: BLE001 - Spark's analysis errors, reported as the spec's
            raise SpecError(f"table {self.name} keeps no partitions in the catalog ({' '.join(str(err).split())[:200]}); "
                            "a spark_table must be partitioned by the partition key, its partitions in the catalog") from None
        out = set()
        for r in rows:
            key, _, raw = str(r[0]).partition("=")
            if key == self.partition_key:
                out.add(urllib.parse.unquote(raw))
        return out

    def partition_location(self, value: PartitionValue) -> Path:
        found = self._described(self._clause(value)).get("Location")
        if found is None:
            raise SpecError(f"partition {partition_label(value)} of {self.name} has no location in the catalog")
        return local(found)

    def locations(self, values: Sequence[PartitionValue]) -> dict[str, Path | None]:
        """Each partition's location (None: not in the catalog)."""
        listed = self.listed()
        return {partition_label(v): self.partition_location(v) if partition_label(v) in listed else None
                for v in values}

    def set_location(self, value: PartitionValue, path: Path, exists: bool) -> None:
        """Point the partition at ``path`` in one catalog update (adding it if new)."""
        where = literal("file:" + str(path))  # as Spark shows it: file:/...
        if exists:
            self._sql(f"ALTER TABLE IDENTIFIER(:table){self._clause(value)} SET LOCATION {where}")
        else:
            self._sql(f"ALTER TABLE IDENTIFIER(:table) ADD{self._clause(value)} LOCATION {where}")

    def drop(self, value: PartitionValue) -> None:
        """Remove the partition from the catalog (its files stay where they are)."""
        self._sql(f"ALTER TABLE IDENTIFIER(:table) DROP IF EXISTS{self._clause(value)}")
