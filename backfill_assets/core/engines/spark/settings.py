"""The ``engine`` mapping of a spec on this engine (``type: spark``): the session it runs on and
the folder its stages are written to."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
from pydantic import Field

from backfill_assets.core.spec_formats import Strict, check_location


class SparkEngineSpec(Strict):
    """``engine: {type: spark, ...}``: Apache Spark (core.engines.spark)."""

    type: Literal["spark"]
    # The session's master (local[N], spark://host:port, or sc://host:port for Spark Connect)
    # and its settings; a session already active in the process (a Dagster resource's) is used
    # as it is.
    master: Annotated[str, Field(min_length=1, pattern=r"^(local(\[(\d+|\*)\])?|spark://\S+|sc://\S+|yarn|k8s://\S+)$")] | None = None
    conf: dict[Annotated[str, Field(pattern=r"^spark\.[A-Za-z0-9_.-]+$")], str] = {}
    # Where the stages and a JDBC source's copies are written (default: <home>/spark/<spec
    # name>); every executor must see it.
    staging: Annotated[str, Field(min_length=1)] | None = None

    @pydantic.model_validator(mode="after")
    def _location(self) -> SparkEngineSpec:
        if self.staging is not None:
            check_location("spark staging", self.staging)
        return self
