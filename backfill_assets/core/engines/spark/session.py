"""The Spark session a Spark spec runs in, where its stages live, and the types it reads.

- The session: the one already active in the process (a Dagster resource's, a notebook's) is
  used as it is; otherwise one is started from ``engine.master`` (default ``local[2]``) and
  ``engine.conf``. Each step works in a session of its own over that context
  (``newSession``), so that its temporary views (``source``) are its own.
- The staging folder (``engine.staging``, default ``<home>/spark/<spec name>``) holds the
  stages (``stage_a/``, ``stage_b/``: Parquet, Hive-partitioned), their seals, and a JDBC
  source's copies (``snapshots/``). Every executor must see it: on a cluster, a shared file
  system.
- Types: each Spark type is named by the PostgreSQL type that holds the same values
  (``bigint``, ``decimal(12,2)`` as ``numeric(12,2)``, ``timestamp`` as ``timestamp with time
  zone``), so that plans and fingerprints equal those of the other engines for the same rows.
"""

from __future__ import annotations

import atexit
import contextlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from backfill_assets.core.catalog import ColumnInfo, mapped_column
from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pg import embedded
from backfill_assets.core.spec import Spec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What every session of ours sets, whatever else it carries: Parquet time stamps as
# microseconds (INT96, Spark's old default, is not what other readers expect).
REQUIRED_CONF = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                 # The string literals core.engines.spark.catalog writes are escaped for Spark's default reading.
                 "spark.sql.parser.escapedStringLiterals": "false",
                 # A comparison's join, kept on the executors for its counts and its first keys
                 # (core.engines.spark.compare), keeps the partitions adaptive execution coalesced it
                 # to: by default a cached plan keeps all of spark.sql.shuffle.partitions (200), and
                 # each read of it ran 200 tasks, however few its rows (4.5x slower on local[2]).
                 "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true"}
DEFAULT_MASTER = "local[2]"
# Where Debian's libpostgresql-jdbc-java puts the PostgreSQL driver: a session started here for a
# JDBC source loads it (``engine.conf`` may name another in spark.jars).
DEBIAN_DRIVER_JAR = "/usr/share/java/postgresql.jar"


def start_session(master: str, conf: dict[str, str], app: str = "backfill_assets") -> SparkSession:
    """The process's session: the one running (started by a Dagster resource, a notebook, or
    in another thread), else one started from ``master`` and ``conf``. The PostgreSQL JDBC
    driver Debian installs is added unless ``conf`` names jars of its own."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise SpecError("engine spark needs pyspark and a Java 17 runtime: pip install 'backfill-assets[spark]'") from None
    active = SparkSession.getActiveSession()
    if active is None and SparkContext._active_spark_context is not None:  # started in another thread
        active = SparkSession.builder.getOrCreate()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app)
    builder = builder.remote(master) if master.startswith("sc://") else builder.master(master)
    if not master.startswith("sc://"):  # a Connect server's driver has its own UI and jars
        conf = {"spark.ui.showConsoleProgress": "false", **conf}
        if "spark.jars" not in conf and Path(DEBIAN_DRIVER_JAR).is_file():
            conf["spark.jars"] = DEBIAN_DRIVER_JAR
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if master.startswith("sc://"):
        _STARTED.append(session)
    return session


# Spark Connect sessions started here. A Connect client's channel is otherwise closed by the
# session's __del__, which at interpreter shutdown can wait forever on gRPC's threads: they are
# stopped while the process still runs.
_STARTED: list[SparkSession] = []  # the process's own (start_session)
_OPEN: list[SparkSession] = []  # each step's new one (session_for)


@atexit.register
def _stop_all() -> None:
    for started in (_OPEN, _STARTED):
        while started:
            _stop_quietly(started.pop())


def _stop_quietly(session: SparkSession) -> None:
    with contextlib.suppress(Exception):  # the server may be gone already; the process is ending
        session.stop()


def is_connect(session: SparkSession) -> bool:
    """Whether ``session`` is a Spark Connect client's."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def release(session: SparkSession | None) -> None:
    """End a session :func:`session_for` made over Spark Connect (its channel, its state on the
    server). The process's own session, and any classic one (they share the process's context,
    which stays up for the next step), are left alone."""
    if session is not None and any(s is session for s in _OPEN):
        _OPEN[:] = [s for s in _OPEN if s is not session]
        _stop_quietly(session)


def session_for(spec: Spec) -> SparkSession:
    """A new session (its own temporary views) over the process's Spark context, started
    from the spec's engine settings when none is running."""
    active = start_session(spec.engine.master or DEFAULT_MASTER, dict(spec.engine.conf), f"backfill_assets:{spec.name}")
    try:
        session = active.newSession()
    except Exception:  # noqa: BLE001 - Spark Connect keeps one session per client: its views are its own already
        session = active
    if session is not active and is_connect(session):
        _OPEN.append(session)  # a channel of its own: closed by release(), or at exit
    for key, value in REQUIRED_CONF.items():
        session.conf.set(key, value)
    return session


def staging_dir(spec: Spec) -> Path:
    """Where the spec's stages and copies live."""
    if spec.engine.staging is not None:
        return Path(local_path(spec.engine.staging))
    return embedded.home() / "spark" / spec.name


# Spark type -> the PostgreSQL base type that holds the same values (core.catalog.PG_TYPES).
_TYPES = {"bigint": "int8", "int": "int4", "boolean": "bool", "double": "float8", "string": "text",
          "binary": "bytea", "date": "date", "timestamp": "timestamptz"}
_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")
_CASTS = {"tinyint": "int", "smallint": "int", "float": "double", "timestamp_ntz": "timestamp (at a stated zone)",
          "void": "a typed NULL"}
# PostgreSQL base type -> Spark type (the stage's schema, from the spec's columns).
_SPARK = {**{base: name for name, base in _TYPES.items()}, "varchar": "string"}


def column_info(name: str, spark_type: str) -> ColumnInfo | None:
    """The column as the PostgreSQL type that holds the same values, or None."""
    return mapped_column(name, spark_type, _TYPES, _DECIMAL)


def unsupported(name: str, spark_type: str) -> str:
    """The problem of a column without a counterpart, and the cast that gives it one."""
    cast = _CASTS.get(spark_type)
    instead = (f"cast it in transform_sql (CAST(`{name}` AS {cast}))" if cast else
               "select it as a supported type in transform_sql (int, bigint, decimal(p,s), double, boolean, "
               "string, binary, date, timestamp)")
    return f"column {name} has Spark type {spark_type}, which has no exact counterpart in the fingerprint; {instead}"


def spark_type(column: ColumnInfo) -> str:
    """The Spark type that holds ``column``'s values (the inverse of :func:`column_info`)."""
    if column.base_type == "numeric":
        return column.type_name.replace("numeric", "decimal", 1)
    return _SPARK[column.base_type]


def schema_ddl(columns: list[ColumnInfo]) -> str:
    """A Spark schema, as DDL, for ``columns`` (names backtick-quoted)."""
    return ", ".join(f"`{c.name.replace('`', '``')}` {spark_type(c)}" for c in columns)
