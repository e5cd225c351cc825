"""What the multi-run tests read of a deployment's runs (over GraphQL) and of the ledger."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql

from backfill_assets.core.store.control import ensure_control_schema
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets_tests.support.dagster_server import RUN_DONE, GraphQL


def latest_ledger(conn, plan_id: str) -> dict[str, str]:
    """Each partition's newest ledger status for the plan."""
    rows = conn.execute(
        "SELECT DISTINCT ON (partition) partition, status FROM backfill_control.ledger "
        "WHERE plan_id = %s ORDER BY partition, run_started_at DESC, finished_at DESC", (plan_id,)).fetchall()
    return dict(rows)


def most_at_once(runs: list[dict]) -> int:
    """The most runs that were running at one moment, from their start and end times."""
    edges = sorted([(r["startTime"], 1) for r in runs] + [(r["endTime"], -1) for r in runs])
    running = most = 0
    for _, step in edges:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def run_ranges(runs: list[dict]) -> list[tuple[str, str]]:
    """Each run's partition range (first, last), sorted."""
    tags = [{t["key"]: t["value"] for t in r["tags"]} for r in runs]
    return sorted((t[RANGE_START], t[RANGE_END]) for t in tags)


def wait_runs(gql: GraphQL, tags: dict[str, str], count: int, timeout: float = 240, done: bool = True) -> list[dict]:
    """The ``count`` runs with ``tags`` once they exist (and with ``done``, have finished)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = gql.runs(tags)
        if len(runs) >= count and (not done or all(r["status"] in RUN_DONE for r in runs)):
            return runs
        time.sleep(1)
    raise AssertionError(f"{count} runs tagged {tags} did not finish in {timeout} s")


# A spec's lock wait, long enough for runs to wait out ``snapshots_held``.
HELD_LOCK_TIMEOUT_MS = 240_000


@contextlib.contextmanager
def snapshots_held(url: str, schema: str = "backfill_control") -> Iterator[None]:
    """Another session holds the control store's ``snapshots`` table (ACCESS EXCLUSIVE) until
    the block ends: every build run writes it before it can end, so runs launched in the block
    wait (their spec's ``lock_timeout_ms`` must outlast it: ``HELD_LOCK_TIMEOUT_MS``). With
    ``wait_running`` in the block, runs a pool admits together are seen together, however
    fast each one is."""
    with psycopg.connect(url, autocommit=True) as conn:
        ensure_control_schema(conn, schema)
    with psycopg.connect(url) as holder:
        holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema, "snapshots")))
        yield
        holder.rollback()


def wait_running(gql: GraphQL, tags: dict[str, str], count: int, timeout: float = 240) -> None:
    """Until ``count`` runs with ``tags`` are running at one moment."""
    deadline = time.monotonic() + timeout
    while len([r for r in gql.runs(tags) if r["status"] == "STARTED"]) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} runs tagged {tags} were never running at once: {gql.runs(tags)}")
        time.sleep(0.5)
