"""What the postgres engine supports: a table of the spec's own database, read and built there
(core.engines.postgres: snapshot, stages), written to a PostgreSQL, Delta or Iceberg target; every option."""

from __future__ import annotations

from backfill_assets.core.engines.supports import Supports, supported

SUPPORTS = Supports(
    engine="postgres",
    builds="backfill_assets.core.engines.postgres.engine:PostgresBuildEngine",
    sources=("postgres",),
    targets=("postgres", "delta", "iceberg"),
    reads="a PostgreSQL table of its own database",
    writes="a PostgreSQL, Delta or Iceberg table",
    options={
        "records_can_move": supported(),
        "parallel": supported(),
        "replace_batch_rows": supported(),
        "trusted_functions": supported(),
    },
)
