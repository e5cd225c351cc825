"""The source sensor's question for a source pinned at a version (engines duckdb and spark):
which snapshotted partitions changed since their newest snapshot?

For each partition, a signature of what holds it at the version its newest snapshot pinned is
compared with the same signature now. A lake keeps its versions, so both come from its
metadata only: the files that hold the partition (the Delta log, Iceberg manifests, a Parquet
folder's listing). A Spark catalog table's are its partition's location and the files there
(core.engines.spark.watch); a JDBC source's, its row count and newest change-column value, from
the pinned copy and from the database (core.engines.spark.watch). Where they differ, the
partition's stages are requested again, once: the sensor's cursor keeps the signature each
changed partition was requested with (core.pinned.engine).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

import psycopg

from backfill_assets.core.catalog import ColumnInfo, partition_kind_of, windowing_of
from backfill_assets.core.duck import connect
from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.parts import Part, span_of
from backfill_assets.core.pinned.by_format import lake_source
from backfill_assets.core.pinned.duck_types import column_info, source_types
from backfill_assets.core.pinned.pins import Pin
from backfill_assets.core.pinned.source import LakeSource
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.vocabulary import PartitionKind, PartitionValue, parse_labels


class Signatures(Protocol):
    """Per partition, a digest of what holds it (see the module docstring)."""

    def kind(self) -> PartitionKind:
        """The partition key's kind (from the source's schema)."""
        ...

    def now(self, values: Sequence[PartitionValue]) -> dict[str, str]:
        """Each partition's signature now, by label."""
        ...

    def at(self, pin: Pin, values: Sequence[PartitionValue]) -> dict[str, str]:
        """Each partition's signature at ``pin``, by label."""
        ...


def pinned_changes(conn: psycopg.Connection, spec: Spec, signatures: Signatures) -> dict[str, str]:
    """The snapshotted partitions whose signature changed since their newest snapshot, each
    with its signature now (what a run key names the change by), in label order (``conn``: the
    control store)."""
    schema = spec.control_schema
    if not store.control_ready(conn, schema):
        return {}
    labels = sorted(store.latest_snapshotted(conn, schema, spec.source_name))
    if not labels:
        return {}
    newest = store.newest_snapshots(conn, schema, spec.source_name, spec.partition_by, labels)
    by_snapshot: dict[str, list[str]] = {}
    for label, (snapshot_id, _) in newest.items():
        by_snapshot.setdefault(snapshot_id, []).append(label)
    kind = signatures.kind()
    now = signatures.now(parse_labels(labels, kind))
    changed: list[str] = []
    for snapshot_id, members in by_snapshot.items():
        found = store.find_snapshot(conn, schema, snapshot_id)
        scope = None if found is None else found["scope"]
        if scope is None or not scope.get("pin"):
            changed.extend(members)
            continue
        then = signatures.at(Pin.of(scope["pin"]), parse_labels(members, kind))
        changed.extend(label for label in members if then.get(label) != now.get(label))
    return {label: now.get(label, "gone") for label in sorted(changed)}


class LakeSignatures:
    """A lake source's partitions by the files that hold them (metadata only)."""

    def __init__(self, spec: Spec, source: LakeSource) -> None:
        self.spec, self.source = spec, source

    @functools.cached_property
    def _key(self) -> ColumnInfo | None:
        """The partition key as the source's newest schema gives it (read once, no row)."""
        with connect() as duck:
            self.source.attach_schema(duck)
            types = dict(source_types(duck))
        return column_info(self.spec.partition_key, types.get(self.spec.partition_key, ""))

    def kind(self) -> PartitionKind:
        if self.spec.partition_window is not None:
            return "text"  # windows are named by their labels
        kind = None if self._key is None else partition_kind_of(self._key, [])
        return kind or "text"

    def now(self, values: Sequence[PartitionValue]) -> dict[str, str]:
        return self.source.signature(self.spec.partition_key, self._parts(values))[1]

    def at(self, pin: Pin, values: Sequence[PartitionValue]) -> dict[str, str]:
        return self.source.signature_at(pin, self.spec.partition_key, self._parts(values))

    def _parts(self, values: Sequence[PartitionValue]) -> Sequence[Part]:
        """Time windows (their labels, as ``kind`` reads them) as the ranges of the column the
        source's files are looked up by; values as they are."""
        if self.spec.partition_window is None:
            return values
        if self._key is None:
            raise SpecError(f"source {self.spec.source_name} has no column {self.spec.partition_key} to window")
        windowing = windowing_of(self.spec, self._key)
        return [span_of(windowing, str(label)) for label in values]

def lake_changes(conn: psycopg.Connection, spec: Spec) -> dict[str, str]:
    """:func:`pinned_changes` of a lake source (Delta, Iceberg, a Parquet folder)."""
    source = lake_source(spec, conn)
    try:
        return pinned_changes(conn, spec, LakeSignatures(spec, source))
    finally:
        source.close()
