"""Step 1: inspect source and target read-only, as the spec's build engine reads them (its
``resolve`` then checks the spec against what it found, before anything is written)."""

from __future__ import annotations

from backfill_assets.core.build import open_reading_engine
from backfill_assets.core.catalog import Inspection
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec


def inspect(spec: Spec, factory: ConnectionFactory) -> Inspection:
    """Inspect read-only, as the spec's build engine does: the source, the target, and every
    problem with them.

    Raises:
        TransformError: the spec's transform is refused.
    """
    # Inspection reads the data's database only: it needs no control store (nor its variable),
    # and on an engine whose data is not in PostgreSQL no database at all (core.build).
    with open_reading_engine(factory, spec, control_is_data=True) as engine:
        return engine.inspect()
