"""The engines a spec's target can name, by ``target.format``: each a module of its own.

:func:`engine_for` chooses one when a spec is resolved (core.resolve); the steps ask it what
they need of the target (core.context.TargetEngine). A new engine is its module, its
variant of ``TargetSpec`` (core.spec) and one line in :data:`ENGINES`.
"""

from __future__ import annotations

from collections.abc import Callable

from backfill_assets.core.context import TargetEngine
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets.delta import DeltaEngine
from backfill_assets.core.targets.iceberg import IcebergEngine
from backfill_assets.core.targets.postgres import PostgresEngine

ENGINES: dict[str, Callable[[Spec], TargetEngine]] = {
    "postgres": PostgresEngine,
    "delta": DeltaEngine,
    "iceberg": IcebergEngine,
}


def engine_for(spec: Spec) -> TargetEngine:
    """The engine of the spec's target."""
    return ENGINES[spec.target.format](spec)

