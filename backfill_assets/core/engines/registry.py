"""Every build engine, by its ``engine.type``: what each supports (its allow-list, with the
class of its build engine), in the order messages list them. A new engine is one line here and
one folder under core/engines/ (docs/engines.md)."""

from __future__ import annotations

from backfill_assets.core.engines.duckdb.supports import SUPPORTS as DUCKDB
from backfill_assets.core.engines.postgres.supports import SUPPORTS as POSTGRES
from backfill_assets.core.engines.spark.supports import SUPPORTS as SPARK
from backfill_assets.core.engines.supports import Supports

SUPPORTS: dict[str, Supports] = {e.engine: e for e in (POSTGRES, DUCKDB, SPARK)}
