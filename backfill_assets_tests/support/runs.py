"""What the multi-run tests read of a deployment's runs (over GraphQL) and of the ledger."""

from __future__ import annotations

import time

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
