"""The DuckDB database a DuckDB spec's stages live in, and its connections.

One database file per spec by default (``<home>/duckdb/<spec name>.duckdb``; ``engine.database``
names another). DuckDB lets one process at a time open a file for writing: a second process
(another run, the Dagster daemon) waits for it up to the spec's ``lock_timeout_ms``, retrying,
and is then refused as a transient error, safe to retry, like a lock wait in PostgreSQL. In
one process every connection shares one database instance, so the two builds run at once on
two connections of it.

Every connection carries the spec's ``memory_limit`` and ``threads``; DuckDB spills to a
temporary folder next to the database beyond its memory limit. Without the ICU extension
(which DuckDB cannot load offline, and this engine does not need) DuckDB has no session time
zone: time stamps with time zone are UTC instants, and the fingerprint renders them as epoch
microseconds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from backfill_assets.core import duck
from backfill_assets.core.errors import TransientDatabaseError
from backfill_assets.core.lake.tables import local_path
from backfill_assets.core.pg import embedded
from backfill_assets.core.spec import Spec

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

_RETRY_SECONDS = 0.1


def database_path(spec: Spec) -> Path:
    """Where the spec's DuckDB database lives."""
    if spec.engine.database is not None:
        return Path(local_path(spec.engine.database))
    return embedded.home() / "duckdb" / f"{spec.name}.duckdb"


def _config(spec: Spec, path: Path) -> dict[str, str]:
    config = {"temp_directory": str(path.with_suffix(".tmp"))}
    if spec.engine.memory_limit is not None:
        config["memory_limit"] = spec.engine.memory_limit.replace(" ", "")
    if spec.engine.threads is not None:
        config["threads"] = str(spec.engine.threads)
    return config


_opened: dict[Path, Any] = {}
_opened_lock = threading.Lock()


def _open(spec: Spec, path: Path) -> Any:
    import duckdb
    deadline = time.monotonic() + spec.lock_timeout_ms / 1000
    while True:
        try:
            return duck.connect(str(path), config=_config(spec, path))
        except duckdb.IOException as err:
            if "lock" not in str(err).lower():
                raise
            if time.monotonic() >= deadline:
                raise TransientDatabaseError(
                    f"the DuckDB database {path} is held by another process (another run, or a tool with it "
                    f"open) for longer than lock_timeout_ms ({spec.lock_timeout_ms} ms); try again when it is done",
                    lock_wait=True,
                ) from None
            time.sleep(_RETRY_SECONDS)


@contextlib.contextmanager
def database(spec: Spec) -> Iterator[Any]:
    """The spec's DuckDB database, open for the block (one instance per process and file: the
    builds' connections are cursors of it). Closed at the end of the outermost block, so that
    other processes can open the file between steps."""
    path = database_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _opened_lock:
        entry = _opened.get(path)
        if entry is not None:
            entry[1] += 1
    if entry is None:
        # Opened outside the lock: waiting for another process's file lock must not hold up
        # the threads of this one that open other databases.
        fresh = _open(spec, path)
        with _opened_lock:
            entry = _opened.get(path)
            if entry is None:
                entry = _opened[path] = [fresh, 0]
            else:
                fresh.close()  # another thread of this process opened it meanwhile
            entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _opened_lock:
            entry[1] -= 1
            if entry[1] == 0:
                del _opened[path]
                entry[0].close()


def cursor(db: DuckDBPyConnection) -> Any:
    """A connection of its own to ``db`` (a DuckDB cursor: one per thread)."""
    return db.cursor()
