"""The PostgreSQL resource: the URL comes from the spec's variable through dagster.EnvVar,
read when a run uses it, never stored in run config, logged or printed. The resource of a build
engine that declares one (a session the code location configures), made of what the engine
declares in its folder. And how a step ends on a timeout: retried a bounded number of times,
naming what it waited for."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, ClassVar

import dagster as dg
import pydantic

from backfill_assets.core.errors import ConcurrentRunError, TransientDatabaseError
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import ConnectionFactory, DatabaseUrl, connection_factory
from backfill_assets.core.spec import Spec
from backfill_assets.core.supports import SUPPORTS, imported
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


class EngineResource(dg.ConfigurableResource):
    """A build engine's resource: the session the code location configures for the engine's
    specs (one per process), started before the first step that uses the engine. Each is made
    by :func:`engine_resource_class` of the settings class its engine declares in its folder
    (``resource`` in its supports.toml), whose fields are the resource's config."""

    settings: ClassVar[Any] = None  # the engine's settings class (core, no dagster)

    def start(self) -> None:
        """Start (or find) the process's session."""
        self.settings.model_validate({name: getattr(self, name) for name in self.settings.model_fields}).start()


@functools.cache
def engine_resource_class(engine: str) -> type[EngineResource]:
    """The resource class of ``engine`` (``<label>Resource``, as the launchpad names it): its
    declared settings' fields, defaults and docstring, and their ``start``."""
    declared = SUPPORTS[engine]
    settings = imported(declared.resource["settings"])
    fields = {name: (info.annotation, info) for name, info in settings.model_fields.items()}
    made = pydantic.create_model(f"{declared.label}Resource", __base__=EngineResource, __doc__=settings.__doc__,
                                 __module__=__name__, **fields)
    made.settings = settings
    return made


def engine_keys(spec: Spec) -> set[str]:
    """The resources a spec's steps need beyond its PostgreSQL one (its engine's session)."""
    key = SUPPORTS[spec.engine.type].resource.get("key")
    return set() if key is None else {key}


def start_engine(resources: object, spec: Spec) -> None:
    """Start (or find) the session of the spec's engine from the run's resources, before any
    step uses it: the code location's settings, not only the spec's."""
    for key in engine_keys(spec):
        getattr(resources, key).start()


def engine_resources(specs: list[Spec]) -> dict[str, EngineResource]:
    """Each engine's resource the specs need, from the first such spec's engine settings (the
    settings class's ``of``)."""
    made: dict[str, EngineResource] = {}
    for spec in specs:
        for key in engine_keys(spec) - set(made):
            resource = engine_resource_class(spec.engine.type)
            made[key] = resource(**resource.settings.of(spec).model_dump())
    return made


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
