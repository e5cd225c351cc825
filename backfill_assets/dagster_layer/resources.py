"""The PostgreSQL resource: the URL comes from the spec's variable through dagster.EnvVar,
read when a run uses it, never stored in run config, logged or printed. And how a step ends
on a timeout: retried a bounded number of times, naming what it waited for."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import dagster as dg

from backfill_assets.core.errors import ConcurrentRunError, TransientDatabaseError
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

    def factory(self, spec: Spec, application_name: str = "backfill_assets:dagster") -> ConnectionFactory:
        """Open pinned connections carrying the spec's lock and statement timeouts from their
        first statement (see core.pg.db); errors never contain the URL."""
        control = (None if self.control_database_url is None
                   else DatabaseUrl(self.control_database_url, source=f"${self.control_variable}"))
        return connection_factory(DatabaseUrl(self.database_url, source=f"${self.variable}"), spec.limits,
                                  application_name, control_url=control)


def resource_key(spec: Spec) -> str:
    return f"pg_{spec.name}"


def resource_for(spec: Spec) -> PostgresResource:
    control = spec.control_database_url_env
    return PostgresResource(
        database_url=dg.EnvVar(spec.database_url_env), variable=spec.database_url_env,
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
