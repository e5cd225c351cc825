"""The PostgreSQL resource: the URL comes from the spec's variable through dagster.EnvVar,
read when a run uses it, never stored in run config, logged or printed. And how a step ends
on a timeout: retried a bounded number of times, naming what it waited for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import dagster as dg

from backfill_assets.core.errors import ConcurrentRunError, TransientDatabaseError
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import ConnectionFactory, DatabaseUrl, connection_factory
from backfill_assets.core.spec import Spec
from backfill_assets.core.waits import explained_waits

MAX_TRANSIENT_RETRIES = 3


class PostgresResource(dg.ConfigurableResource):
    """Connections to the databases of one spec: its data, and its control store when that is
    a database of its own (``control_database_url_env``)."""

    database_url: str
    variable: str = "DATABASE_URL"
    control_database_url: str | None = None
    control_variable: str | None = None
    # Where the URL came from, for messages, when not from ``variable`` (the embedded server).
    source: str | None = None

    def factory(self, spec: Spec, application_name: str = "backfill_assets:dagster") -> ConnectionFactory:
        """Open pinned connections carrying the spec's lock and statement timeouts from their
        first statement (see core.pg.db); errors never contain the URL."""
        control = (None if self.control_database_url is None
                   else DatabaseUrl(self.control_database_url, source=f"${self.control_variable}"))
        return connection_factory(DatabaseUrl(self.database_url, source=self.source or f"${self.variable}"),
                                  spec.limits, application_name, control_url=control)


def resource_key(spec: Spec) -> str:
    return f"pg_{spec.name}"


SPARK_RESOURCE = "spark"


class SparkResource(dg.ConfigurableResource):
    """The Spark session of the code location's Spark specs (one per process, as Spark allows):
    started from ``master`` and ``conf`` the first time a step needs it, then used by every
    step of the run (core.engines.spark.session takes the active session as it is). ``master`` may be
    ``local[N]``, ``spark://host:port``, or ``sc://host:port`` for a remote cluster through
    Spark Connect. Configure it in the launchpad or the Definitions to point at a cluster."""

    master: str = "local[2]"
    conf: dict[str, str] = {}

    def start(self) -> None:
        """Start (or find) the process's session."""
        from backfill_assets.core.engines.spark.session import start_session
        start_session(self.master, dict(self.conf))


# engine.type -> the resource whose session its steps start before they use the engine.
ENGINE_RESOURCES = {"spark": SPARK_RESOURCE}


def engine_keys(spec: Spec) -> set[str]:
    """The resources a spec's steps need beyond its PostgreSQL one (its engine's session)."""
    key = ENGINE_RESOURCES.get(spec.engine.type)
    return set() if key is None else {key}


def start_engine(resources: object, spec: Spec) -> None:
    """Start (or find) the session of the spec's engine from the run's resources, before any
    step uses it: the code location's settings, not only the spec's."""
    for key in engine_keys(spec):
        getattr(resources, key).start()


def spark_resource(specs: list[Spec]) -> dict[str, SparkResource]:
    """The Spark resource, from the first Spark spec's engine settings (none without one)."""
    spark = [s for s in specs if SPARK_RESOURCE in engine_keys(s)]
    if not spark:
        return {}
    engine = spark[0].engine
    return {SPARK_RESOURCE: SparkResource(master=engine.master or "local[2]", conf=dict(engine.conf))}


def resource_for(spec: Spec) -> PostgresResource:
    """The spec's connections: its variables, read by Dagster at run time; for a spec that names
    no database (a lake-native engine), the control store named by control_database_url_env, or
    else the embedded PostgreSQL the project starts under its home (core.pg.embedded.spec_url)."""
    control = spec.control_database_url_env
    name = spec.database_url_env or control
    if name is None:
        url = embedded.spec_url(spec)
        return PostgresResource(database_url=url.reveal(), source=url.source)
    return PostgresResource(
        database_url=dg.EnvVar(name), variable=name,
        control_database_url=None if control is None else dg.EnvVar(control), control_variable=control,
    )


@contextlib.contextmanager
def transient_retry(factory: ConnectionFactory, spec: Spec) -> Iterator[None]:
    """Retry the step, a bounded number of times, on a lock or statement timeout, a
    serialization failure or a concurrent run; never on any other error (decided by class).
    A lock wait that ran out names what it waited for (core.waits), in the step's error."""
    try:
        with explained_waits(factory, spec):
            yield
    except (TransientDatabaseError, ConcurrentRunError) as err:
        raise dg.RetryRequested(max_retries=MAX_TRANSIENT_RETRIES, seconds_to_wait=2) from err
