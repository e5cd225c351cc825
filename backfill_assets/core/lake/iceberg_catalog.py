"""An Iceberg table's SQL catalog: its SQLAlchemy URL (the variable ``uri_env`` names, or the
spec's own database, with the spec's limits), the identity a plan names it by (without its
password), and the catalog's tables when it lives in the spec's database."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from backfill_assets.core.errors import ConnectionConfigError
from backfill_assets.core.pg.db import url_from_env
from backfill_assets.core.spec import IcebergCatalogSpec, IcebergTargetSpec, Spec

# The tables of a pyiceberg SQL catalog, when it lives in the spec's own database.
CATALOG_TABLES = ("iceberg_tables", "iceberg_namespace_properties")


def catalog_url(conn: psycopg.Connection, spec: Spec, catalog: IcebergCatalogSpec | None = None) -> Any:
    """The SQLAlchemy URL of an Iceberg spec's SQL catalog (the target's, or ``catalog``: an
    Iceberg source's): the variable ``catalog.uri_env`` names, or else the database apply is
    connected to (the embedded one in the demo). A URL object, whose password no repr shows;
    it is never printed or stored."""
    from sqlalchemy.engine import URL, make_url
    if catalog is None and isinstance(spec.target, IcebergTargetSpec):
        catalog = spec.target.catalog
    if catalog is not None and catalog.uri_env is not None:
        url = url_from_env(catalog.uri_env)
        value = url.reveal()
        scheme = value.split("://", 1)[0] if "://" in value else ""
        try:
            if scheme and scheme not in ("postgresql", "postgres"):
                given = make_url(value)  # a SQLAlchemy URL (postgresql+psycopg://, sqlite:///...)
                if not given.drivername.startswith("postgresql"):
                    return given
                # A PostgreSQL catalog's connections carry the spec's limits too.
                return given.update_query_dict({"options": spec.limits.options(given.query.get("options"))})
            params = conninfo_to_dict(value)
        except Exception:  # noqa: BLE001 - the parsers quote the value back: say only where it is
            problem = f"the Iceberg catalog URL in {url.source} is malformed; write a PostgreSQL or SQLAlchemy URL"
        else:
            problem = None
        if problem is not None:  # raised outside the except block: no chained parser error
            raise ConnectionConfigError(problem)
    else:
        params = dict(conn.info.get_parameters())
        params["password"] = conn.info.password
    host = params.pop("host", None)
    port = params.pop("port", None)
    query = {k: str(v) for k, v in params.items() if k not in ("user", "password", "dbname") and v}
    if host and (host.startswith("/") or "," in host):
        query["host"], host = host, None  # a socket directory goes to libpq as is
    # Finite limits for the catalog's own connections, as for every other connection.
    query.setdefault("connect_timeout", "10")
    query["options"] = spec.limits.options(query.get("options"))
    return URL.create(
        "postgresql+psycopg", username=params.get("user") or None, password=params.get("password") or None,
        host=host or None, port=int(port) if port and str(port).isdigit() else None,
        database=params.get("dbname") or None, query=query,
    )


def catalog_identity(url: Any, warehouse: str) -> str:
    """An Iceberg catalog as a plan names it, without its password: the driver, user, host,
    port and database of its URL (or a SQLite file), and the warehouse. A plan approved for
    one catalog is refused for another (core.approve compares it like the spec's fields)."""
    host = url.host or url.query.get("host") or ""
    user = f"{url.username}@" if url.username else ""
    port = f":{url.port}" if url.port else ""
    return f"{url.drivername}://{user}{host}{port}/{url.database or ''} warehouse {warehouse}"
