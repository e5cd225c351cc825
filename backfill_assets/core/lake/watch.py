"""The source sensor's question for a DuckDB spec: which snapshotted partitions of the lake
source changed since their newest snapshot?

A lake keeps its versions: for each partition, the files that hold it at the version its
newest snapshot pinned are compared with the files that hold it at the newest version, from
the lake's metadata only (the Delta log, Iceberg manifests, a Parquet folder's listing). Where
they differ, the partition's stages are requested again, once: the sensor's cursor keeps the
files' digest each changed partition was requested with (core.lake.pinned_engine).
The Spark engine's Parquet source is watched the same way; its JDBC and catalog sources are not.
"""

from __future__ import annotations

import psycopg

from backfill_assets.core.catalog import partition_kind_of
from backfill_assets.core.lake.duck_types import column_info, source_types
from backfill_assets.core.lake.sources import LakeSource, Pin, lake_source
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.vocabulary import PartitionKind, parse_labels


def lake_changes(conn: psycopg.Connection, spec: Spec) -> dict[str, str]:
    """The partitions whose files changed since their newest snapshot, each with the digest of
    its files now (what a run key names the change by), in label order (``conn``: the control
    store)."""
    schema = spec.control_schema
    if spec.source.format in ("jdbc", "spark_table") or not store.control_ready(conn, schema):
        return {}  # a JDBC or catalog source (engine spark) is not watched: plan again to restage it
    labels = sorted(store.latest_snapshotted(conn, schema, spec.source_name))
    if not labels:
        return {}
    newest = store.newest_snapshots(conn, schema, spec.source_name, spec.partition_key, labels)
    by_snapshot: dict[str, list[str]] = {}
    for label, (snapshot_id, _) in newest.items():
        by_snapshot.setdefault(snapshot_id, []).append(label)
    source = lake_source(spec, conn)
    changed: list[str] = []
    try:
        kind = _kind(spec, source)
        all_values = parse_labels(labels, kind)
        _, now = source.signature(spec.partition_key, all_values)
        for snapshot_id, members in by_snapshot.items():
            found = store.find_snapshot(conn, schema, snapshot_id)
            if found is None or not (found["scope"] or {}).get("pin"):
                changed.extend(members)
                continue
            then = source.signature_at(Pin.of(found["scope"]["pin"]), spec.partition_key, parse_labels(members, kind))
            changed.extend(label for label in members if then.get(label) != now.get(label))
    finally:
        source.close()
    return {label: now[label] for label in sorted(changed)}


def _kind(spec: Spec, source: LakeSource) -> PartitionKind:
    """The partition key's kind, from the source's schema (metadata only)."""
    from backfill_assets.core.lake.duck import connect
    with connect() as duck:
        source.attach_schema(duck)
        types = dict(source_types(duck))
    info = column_info(spec.partition_key, types.get(spec.partition_key, ""))
    kind = None if info is None else partition_kind_of(info, [])
    return kind or "text"
