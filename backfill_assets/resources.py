"""The PostgreSQL resource: the URL comes from the spec's variable through dagster.EnvVar,
read when a run uses it, never stored in run config, logged or printed."""

from __future__ import annotations

import dagster as dg

from backfill_assets.core.db import ConnectionFactory, DatabaseUrl, connection_factory
from backfill_assets.core.spec import Spec


class PostgresResource(dg.ConfigurableResource):
    """Connections to the database of one spec."""

    database_url: str
    variable: str = "DATABASE_URL"

    def factory(self, application_name: str = "backfill_assets:dagster") -> ConnectionFactory:
        """Open pinned connections (see core.db); errors never contain the URL."""
        return connection_factory(DatabaseUrl(self.database_url, source=f"${self.variable}"), application_name)


def resource_key(spec: Spec) -> str:
    return f"pg_{spec.name}"


def resource_for(spec: Spec) -> PostgresResource:
    return PostgresResource(database_url=dg.EnvVar(spec.database_url_env), variable=spec.database_url_env)
