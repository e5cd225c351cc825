"""Sources and targets of the Spark engine's tests: the DuckDB tests' rows (with NULLs, unicode,
control characters and long text) in a Hive-partitioned Parquet folder or a PostgreSQL table
read over JDBC, the Spark spec over them, and a TCP door to the embedded PostgreSQL (whose
only listener is a Unix socket, which the JDBC driver cannot reach)."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from backfill_assets.core.spec import Spec, spec_from_mapping
from backfill_assets_tests.support.duck_lakes import COLUMNS, source_table
from backfill_assets_tests.support.specs import DEMO_SPEC

JDBC_ENV = "BFA_TEST_JDBC_URL"


def write_parquet_source(folder: Path, data: pa.Table | None = None) -> dict[str, Any]:
    """The rows in a Hive-partitioned Parquet folder (one file per partition); the spec's source."""
    pads.write_dataset(source_table() if data is None else data, folder, format="parquet",
                       partitioning=["order_date"], partitioning_flavor="hive",
                       existing_data_behavior="delete_matching")
    return {"format": "parquet", "location": str(folder)}


def spark_mapping(tmp_path: Path, source: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The demo spec on engine spark, as YAML would give it (None removes a key)."""
    data = {**DEMO_SPEC, "engine": {"type": "spark", "staging": str(tmp_path / "staging")}, "source": source,
            "target": {"format": "parquet", "location": str(tmp_path / "orders_daily")},
            "records_can_move": False, **changes}
    return {k: v for k, v in data.items() if v is not None}


def spark_spec(tmp_path: Path, source: dict[str, Any], **changes: Any) -> Spec:
    return spec_from_mapping(spark_mapping(tmp_path, source, **changes))


def listed_rows(partition: Path) -> int:
    """One partition directory's rows as Spark and DuckDB read a folder: list its data files,
    then open each by name. A file gone since the listing (the partition switched meanwhile) is
    an error (FileNotFoundError), never skipped. PyArrow's dataset discovery on a local folder
    does skip it: across a switch it can find no file at all and read the partition as empty
    without an error (docs/spark.md), so the tests' readers do not discover through it."""
    names = sorted(n for n in os.listdir(partition) if n.endswith(".parquet") and not n.startswith(("_", ".")))
    return sum(pq.read_table(partition / name).num_rows for name in names)


def target_rows(folder: Path, day: dt.date) -> list[tuple]:
    """A partition of the Parquet target as any reader sees it (PyArrow's Hive discovery)."""
    data = pads.dataset(folder, format="parquet", partitioning="hive").to_table()
    rows = [tuple(r[c] for c in COLUMNS) for r in data.to_pylist() if str(r["order_date"]) == str(day)]
    return sorted(((day, *r[1:]) for r in rows), key=lambda r: r[1])


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while chunk := a.recv(65536):
            b.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def tcp_door(socket_path: str) -> Iterator[int]:
    """A loopback TCP port that forwards every connection to a Unix socket."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(socket_path)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


@contextlib.contextmanager
def jdbc_url(database_url: str) -> Iterator[str]:
    """A JDBC URL reaching the database of ``database_url`` (libpq form) over loopback TCP."""
    from psycopg.conninfo import conninfo_to_dict
    info = conninfo_to_dict(database_url)
    database, user = info.get("dbname", "postgres"), info.get("user", "postgres")
    host, port = str(info.get("host") or "localhost"), str(info.get("port") or "5432")
    if host.startswith("/"):
        with tcp_door(f"{host}/.s.PGSQL.{port}") as tcp:
            yield f"jdbc:postgresql://127.0.0.1:{tcp}/{database}?user={user}"
    else:
        password = f"&password={info['password']}" if info.get("password") else ""
        yield f"jdbc:postgresql://{host}:{port}/{database}?user={user}{password}"
