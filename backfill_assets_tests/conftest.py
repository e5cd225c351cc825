"""Fixtures: a real PostgreSQL for every test.

By default the embedded server (pgserver) is started once per test session in a temporary
folder. Set BACKFILL_TEST_DATABASE_URL to an admin URL (a role that may CREATE DATABASE)
to run the suite against another server instead. Each test gets its own fresh database.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import DatabaseUrl, connect, connection_factory
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets_tests.support.servers import server_folder
from backfill_assets_tests.support.specs import CANARY, URL_ENV

ADMIN_URL_ENV = "BACKFILL_TEST_DATABASE_URL"
# The order tests run in: the slow ones first on every worker, once -m and -k have deselected;
# the session's Spark cluster (the spark_cluster fixture).
pytest_plugins = ["backfill_assets_tests.support.ordering", "backfill_assets_tests.support.spark_cluster"]

settings.register_profile(
    "ci", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "slow", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


SERVER_FREE_ENV = "BACKFILL_TEST_SERVER_FREE"  # set by `make check`: no server, no JVM
NO_JVM_ENV = "BACKFILL_TEST_NO_JVM"  # set by `make test-core`: no JVM
JVM_TEST_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def pytest_configure(config: pytest.Config) -> None:
    """The project's local state (DuckDB files, Spark staging, the demo's lake) goes to a
    folder of this test process, never to the working directory or the user's own."""
    config._bfa_home = tempfile.mkdtemp(prefix="bfa-home-")  # type: ignore[attr-defined]
    os.environ[embedded.HOME_ENV] = config._bfa_home  # type: ignore[attr-defined]
    # Every JVM the tests start (the Spark session, drivers of their own, a cluster's master,
    # workers, executors and Connect server) compiles with C1 only and collects with one thread:
    # the tests' jobs are short, and C2's compiler threads took half the CPU of two cores (the
    # cluster tests: 300 s -> 159 s). The JIT tier changes no result.
    given = os.environ.get("JAVA_TOOL_OPTIONS", "")
    if JVM_TEST_OPTIONS not in given:  # a pytest-xdist worker inherits the controller's
        os.environ["JAVA_TOOL_OPTIONS"] = f"{given} {JVM_TEST_OPTIONS}".strip()
    if os.environ.get(SERVER_FREE_ENV):
        _forbid_servers()
    if os.environ.get(SERVER_FREE_ENV) or os.environ.get(NO_JVM_ENV):
        _forbid_jvm()


def _forbid_servers() -> None:
    """The server-free tier (`make check`) starts no server: starting the embedded PostgreSQL or
    the machine's own fails the test that tries, which then needs the `postgres` marker that
    moves it to the tiers above. (Its tests may still try an address where nothing listens,
    to see the error a user gets.)"""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError(f"{SERVER_FREE_ENV}: this tier starts no server; a test that needs one uses the "
                           "admin_url fixture, or is marked postgres")

    import pgserver

    import backfill_assets_tests.support.servers as servers

    pgserver.get_server = refuse
    servers.server_bin = refuse  # the machine's own PostgreSQL


def _forbid_jvm() -> None:
    """The tiers without Spark (`make check`, `make test-core`) launch no JVM: a test that does
    fails, and needs the `spark` marker (support.specs.engine_params for a parameter)."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("this tier launches no JVM; a test that needs Spark uses the spark fixture or is "
                           "marked spark (support.specs.engine_params marks a Spark parameter)")

    import pyspark.core.context

    pyspark.core.context.launch_gateway = refuse


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(getattr(config, "_bfa_home", ""), ignore_errors=True)


# Markers applied from what a test uses, so that nobody has to remember them: `postgres` for a
# test that needs a PostgreSQL server (the admin_url fixture, directly or through another),
# `dagster` for the Dagster layer's tests, `lake` for those of Delta and Iceberg targets,
# `duckdb` and `spark` for those engines' tests (`spark` starts a JVM), `browser` for the test
# that drives Chromium. `pytest -m "not postgres and not spark"` runs the tests that need no
# server, in seconds (`make check`).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        name = path.rsplit("/", 1)[-1]
        fixtures = getattr(item, "fixturenames", ())
        if "admin_url" in fixtures:
            item.add_marker(pytest.mark.postgres)
        if "/dagster_layer/" in path:
            item.add_marker(pytest.mark.dagster)
        if "lake" in name or "lake" in item.name:
            item.add_marker(pytest.mark.lake)
        if "spark" in fixtures or "/spark/" in path or "spark" in name:
            item.add_marker(pytest.mark.spark)
        if "/duckdb/" in path or "duck" in name:
            item.add_marker(pytest.mark.duckdb)


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    """An admin URL of a running PostgreSQL server: one per test process (a pytest-xdist
    worker has its own).

    The embedded server's folder is not under pytest's temporary root: as root, the server
    runs as a user of its own, and pytest makes that root private again whenever another
    pytest starts, which would cut the server off from its own files."""
    if os.environ.get(ADMIN_URL_ENV):
        yield os.environ[ADMIN_URL_ENV]
        return
    folder = Path(tempfile.mkdtemp(prefix="bfa-pg-"))
    folder.chmod(0o755)
    yield embedded.server_url(folder / "pgdata")
    embedded.stop(folder / "pgdata")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def server_dir() -> Iterator[Path]:
    """A folder for a PostgreSQL a test starts itself (its data, or a project home whose
    embedded server keeps its data there), outside pytest's temporary root for the reason
    :func:`admin_url` gives; removed afterwards."""
    with server_folder("server") as folder:
        folder.chmod(0o755)
        yield folder


@pytest.fixture
def home(server_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project home of the test's own (``BACKFILL_ASSETS_HOME``), in :func:`server_dir`:
    where the command line starts its embedded server, which is stopped afterwards."""
    monkeypatch.setenv(embedded.HOME_ENV, str(server_dir))
    yield server_dir
    embedded.stop(server_dir / "pgdata")


def _fresh_database(admin_url: str, source: str) -> Iterator[DatabaseUrl]:
    name = f"bfa_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    info = conninfo_to_dict(admin_url)
    info["dbname"] = name
    yield DatabaseUrl(make_conninfo(**info), source=source)
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db_url(admin_url: str) -> Iterator[DatabaseUrl]:
    """A fresh, empty database for one test, dropped afterwards."""
    yield from _fresh_database(admin_url, "the test database")


@pytest.fixture
def control_db_url(admin_url: str) -> Iterator[DatabaseUrl]:
    """A second fresh database on the same server, for a control store of its own."""
    yield from _fresh_database(admin_url, "the test control database")


@pytest.fixture
def factory(db_url: DatabaseUrl):
    return connection_factory(db_url, DEFAULT_LIMITS)


@pytest.fixture
def conn(db_url: DatabaseUrl) -> Iterator[psycopg.Connection]:
    with connect(db_url, DEFAULT_LIMITS) as c:
        yield c


@pytest.fixture
def url_env(db_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch) -> str:
    """Export the test database URL under the name the test specs use."""
    monkeypatch.setenv(URL_ENV, db_url.reveal())
    return URL_ENV


@pytest.fixture
def demo_db(conn: psycopg.Connection) -> psycopg.Connection:
    """The test database loaded with the demo source (moved records included) and stale target."""
    from backfill_assets.cli import demo

    demo.load(conn)
    return conn


@pytest.fixture
def unmoved_db(conn: psycopg.Connection) -> psycopg.Connection:
    """The demo data without moved records, for specs with records_can_move off."""
    from backfill_assets.cli import demo

    demo.load(conn, moved=False)
    return conn


@pytest.fixture
def password_role(admin_url: str) -> str:
    """A role that must log in with a password over the embedded server's socket."""
    if os.environ.get(ADMIN_URL_ENV):
        pytest.skip("needs the embedded server, whose pg_hba.conf the test may edit")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        hba = Path(admin.execute("SHOW hba_file").fetchone()[0])
        line = "local all bfa_pw scram-sha-256\n"
        if line not in hba.read_text():
            hba.write_text(line + hba.read_text())
            admin.execute("SELECT pg_reload_conf()")
        if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = 'bfa_pw'").fetchone():
            admin.execute(sql.SQL("CREATE ROLE bfa_pw LOGIN PASSWORD {}").format(sql.Literal("right-password")))
    info = conninfo_to_dict(admin_url)
    info.update(user="bfa_pw", password=CANARY)
    return make_conninfo(**info)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local Spark session (two cores, UTC, no UI), started once per test session: it takes
    5-10 s with the machine's Java 17. It runs a worker's share of the suite, many hundreds of
    distinct query plans: Spark keeps the classes it compiled for up to 5,000 of them, not its
    default 100, which the suite's plans cycled through (three in four compiled again, about 9%
    of the Spark tests' CPU)."""
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("backfill_assets_tests")
               .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "4").config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.jars", "/usr/share/java/postgresql.jar")
               .config("spark.sql.codegen.cache.maxEntries", "5000")
               .getOrCreate())
    yield session
    session.stop()
