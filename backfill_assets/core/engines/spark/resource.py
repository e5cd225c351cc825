"""What the Dagster code location configures of this engine: the Spark session of its Spark
specs (one per process, as Spark allows). Plain pydantic, no dagster: the Dagster layer makes
its resource of this class (the class its supports.toml names under ``[resource]``), with these
fields as the resource's config."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from backfill_assets.core.engines.spark.session import DEFAULT_MASTER, start_session
from backfill_assets.core.spec import Spec


class SparkSessionSettings(BaseModel):
    """The Spark session of the code location's Spark specs (one per process, as Spark allows):
    started from ``master`` and ``conf`` the first time a step needs it, then used by every
    step of the run (core.engines.spark.session takes the active session as it is). ``master`` may be
    ``local[N]``, ``spark://host:port``, or ``sc://host:port`` for a remote cluster through
    Spark Connect. Configure it in the launchpad or the Definitions to point at a cluster."""

    model_config = ConfigDict(frozen=True)

    master: str = DEFAULT_MASTER
    conf: dict[str, str] = {}

    @classmethod
    def of(cls, spec: Spec) -> SparkSessionSettings:
        """The settings a code location starts from: the spec's engine settings."""
        return cls(master=spec.engine.master or DEFAULT_MASTER, conf=dict(spec.engine.conf))

    def start(self) -> None:
        """Start (or find) the process's session."""
        start_session(self.master, dict(self.conf))
