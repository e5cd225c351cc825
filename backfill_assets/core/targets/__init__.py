"""The engines a spec's target can name, by ``target.format``: each a module of its own.

:func:`engine_for` chooses one when a spec is resolved (core.engines.postgres.resolve and each engine's resolve); the steps ask it what
they need of the target (core.context.TargetEngine). A new engine is its module, its
variant of ``TargetSpec`` (core.spec) and one line in :data:`ENGINES`.
"""

from __future__ import annotations

import importlib

from backfill_assets.core.context import TargetEngine
from backfill_assets.core.spec import Spec

# Each format's engine class, by where it lives. It is imported when a spec names it: a
# PostgreSQL spec never loads pyarrow and the lake libraries, which would add about 50 MiB
# and 0.2 s to every process of the command line (measured: importing the command line,
# 51 MiB and 0.62 s against 100 MiB and 0.83 s with every engine imported up front).
ENGINES: dict[str, str] = {
    "postgres": "backfill_assets.core.engines.postgres.target:PostgresEngine",
    "delta": "backfill_assets.core.lake.delta:DeltaEngine",
    "iceberg": "backfill_assets.core.lake.iceberg:IcebergEngine",
    "parquet": "backfill_assets.core.engines.spark.parquet:ParquetEngine",
    "spark_table": "backfill_assets.core.engines.spark.spark_table:SparkTableEngine",
}


def engine_for(spec: Spec) -> TargetEngine:
    """The engine of the spec's target."""
    module, name = ENGINES[spec.target.format].split(":")
    engine: type[TargetEngine] = getattr(importlib.import_module(module), name)
    return engine(spec)
