"""``profile`` of a PostgreSQL source on the test's own connection (what the build engine's
profiler is for a PostgreSQL spec)."""

from __future__ import annotations

from typing import Any

import psycopg

from backfill_assets.core.engines.postgres.profiling import PostgresProfiler
from backfill_assets.core.profile import propose
from backfill_assets.core.spec import Spec


def profile_source(conn: psycopg.Connection, spec: Spec, partitions: list | None, **limits: Any) -> propose.Profile:
    return propose.profile_source(PostgresProfiler(conn, spec), spec, partitions, **limits)
