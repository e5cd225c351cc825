"""The embedded default: a local PostgreSQL the project starts itself (the pgserver wheel).

Its data lives under ``$BACKFILL_ASSETS_HOME`` (default ``./.backfill_assets``, git-ignored).
It listens on a Unix socket only and has no password, so its URL is no credential.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from backfill_assets.core.pg.db import DatabaseUrl, url_from_env
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import DEFAULT_LIMITS

HOME_ENV = "BACKFILL_ASSETS_HOME"
DEFAULT_DATABASE = "backfill_demo"
# The control store of a spec that names no database (an engine whose data is not in
# PostgreSQL: plans, approvals, the ledger and the runs' locks).
CONTROL_DATABASE = "backfill_control"

_servers: dict[Path, object] = {}


def home() -> Path:
    """Where the project keeps its local state."""
    return Path(os.environ.get(HOME_ENV) or ".backfill_assets").resolve()


def server_url(pgdata: Path | None = None) -> str:
    """Start (or reuse) the embedded server and return its admin URL.

    The server stops when the last process using it exits.
    """
    pgdata = (pgdata or home() / "pgdata").resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # platformdirs warns when XDG_RUNTIME_DIR is unset (as under CI); it is harmless here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver  # imported here: only the embedded default needs it

        if pgdata not in _servers:
            _servers[pgdata] = pgserver.get_server(pgdata, cleanup_mode="stop")
        return _servers[pgdata].get_uri()  # type: ignore[attr-defined]


def stop(pgdata: Path) -> None:
    """Stop the embedded server of ``pgdata`` if this process started it (tests; otherwise it
    stops when the last process using it exits)."""
    server = _servers.pop(pgdata.resolve(), None)
    if server is not None:
        server._cleanup()  # type: ignore[attr-defined]  # pgserver's own stop of its last handle


def database_url(database: str = DEFAULT_DATABASE, pgdata: Path | None = None) -> DatabaseUrl:
    """The URL of a database on the embedded server, created if missing."""
    admin = server_url(pgdata)
    with psycopg.connect(admin, autocommit=True, options=DEFAULT_LIMITS.options()) as conn:
        exists = conn.execute(
            sql.SQL("SELECT 1 FROM pg_database WHERE datname = %(name)s"), {"name": database}
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    # Keep the URL form (SQLAlchemy, used by dagster-postgres, takes URLs only).
    parts = urlsplit(admin)
    return DatabaseUrl(urlunsplit(parts._replace(path="/" + quote(database))), source="the embedded PostgreSQL")


def spec_url(spec: Spec) -> DatabaseUrl:
    """The URL a spec's connections open: its ``database_url_env``'s; for a spec without one
    (an engine whose data is not in PostgreSQL, which then needs PostgreSQL only for the
    control store), ``control_database_url_env``'s, or else the embedded server's control
    database, started here if it is not running.

    Raises:
        ConnectionConfigError: the named variable is unset or empty.
    """
    name = spec.database_url_env or spec.control_database_url_env
    return url_from_env(name) if name is not None else database_url(CONTROL_DATABASE)


def embedded_url(spec: Spec) -> DatabaseUrl:
    """The URL a spec's connections open with ``--embedded`` (the embedded server instead of
    the spec's variable): the demo's database for a spec whose data is in PostgreSQL (its
    ``database_url_env`` named), else the control database :func:`spec_url` gives a spec
    that names no database, so that its plans, approvals and ledger are the same with
    ``--embedded`` as without."""
    return database_url(DEFAULT_DATABASE if spec.database_url_env is not None else CONTROL_DATABASE)
