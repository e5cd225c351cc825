"""The ``engine`` mapping of a spec on this engine (``type: postgres``, the default): the source
is read and both builds run in the spec's own database, so it takes no settings."""

from __future__ import annotations

from typing import Literal

from backfill_assets.core.spec_formats import Strict


class PostgresEngineSpec(Strict):
    """``engine: {type: postgres}``, or no ``engine`` at all."""

    type: Literal["postgres"] = "postgres"
