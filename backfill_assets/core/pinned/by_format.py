"""The spec's lake source, by its format."""

from __future__ import annotations

import psycopg

from backfill_assets.core.lake.iceberg_catalog import catalog_url
from backfill_assets.core.pinned.delta import DeltaSource
from backfill_assets.core.pinned.iceberg import IcebergSource
from backfill_assets.core.pinned.parquet import ParquetSource
from backfill_assets.core.pinned.source import LakeSource
from backfill_assets.core.spec import DeltaSourceSpec, LakeSourceSpec, ParquetSourceSpec, Spec


def lake_source(spec: Spec, conn: psycopg.Connection | None) -> LakeSource:
    """The spec's lake source (``conn``: the control store's connection, where an Iceberg
    catalog without ``uri_env`` lives)."""
    source: LakeSourceSpec = spec.source  # type: ignore[assignment]
    if isinstance(source, DeltaSourceSpec):
        return DeltaSource(source)
    if isinstance(source, ParquetSourceSpec):
        return ParquetSource(source, windowed=spec.partition_window is not None)
    assert conn is not None, "an Iceberg source's catalog is reached through the control store's connection"
    return IcebergSource(source, catalog_url(conn, spec, source.catalog))

