"""Dagster on a real Spark cluster: a deployment (dagster-webserver and dagster-daemon on
loopback) whose Spark resource points at a Spark Connect server on a standalone master on
127.0.0.1 with two one-core workers (the session's: the spark_cluster fixture). A multi-run
backfill of the stages runs two runs at once,
every step of both a session of the one Connect application, on the workers' executors; an
operator plans and approves from the command line through the same server; the target's runs
apply the approved plan one at a time, and the target holds the plan's content hashes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.dagster_layer.names import build_pool, replace_pool
from backfill_assets_tests.support.dagster_server import dagster_deployment
from backfill_assets_tests.support.runs import (
    HELD_LOCK_TIMEOUT_MS,
    latest_ledger,
    most_at_once,
    run_ranges,
    snapshots_held,
    wait_running,
    wait_runs,
)
from backfill_assets_tests.support.spark_cluster import applications, executor_of, executors_launched, on_cluster
from backfill_assets_tests.support.spark_lakes import spark_mapping, write_parquet_source
from backfill_assets_tests.support.specs import REPO, URL_ENV

FOUR = [f"2024-01-0{d}" for d in range(1, 5)]
pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.xdist_group("spark_cluster")]


def cli(spec_file: Path, cwd: Path, url: str, *args: str) -> dict:
    """A command of the command line, as an operator runs it next to the deployment."""
    done = subprocess.run([sys.executable, "-m", "backfill_assets.cli", *args, "--spec", str(spec_file), "--json",
                           "--quiet"], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), URL_ENV: url})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def sessions(connect_log: Path) -> set[str]:
    """The client sessions the Connect server opened (from its log)."""
    return set(re.findall(r"sessionId: ([0-9a-f-]{36})", connect_log.read_text(errors="replace")))


def test_a_multi_run_spark_backfill_shares_the_cluster_and_applies_one_plan(admin_url, db_url, conn, tmp_path,
                                                                           spark_cluster):
    workdir = spark_cluster["workdir"]
    logs = [workdir / "master.log", workdir / "worker1.log", workdir / "worker2.log", workdir / "connect.log"]
    before = {log: len(log.read_text(errors="replace")) for log in logs}  # the session's cluster: what came earlier

    def since(log: Path) -> Path:
        """What ``log`` says since the test began, as a file of its own."""
        part = tmp_path / f"since-{log.name}"
        part.write_text(log.read_text(errors="replace")[before[log]:])
        return part

    source = write_parquet_source(tmp_path / "orders_raw")
    mapping = on_cluster(spark_mapping(tmp_path, source, parallel={"max_partitions_per_run": 2,
                                                                   "max_concurrent_builds": 2},
                                       lock_timeout_ms=HELD_LOCK_TIMEOUT_MS), spark_cluster["connect"])
    spec = spec_from_mapping(mapping)
    spec_file = tmp_path / "cluster_spec.yaml"
    spec_file.write_text(yaml.safe_dump(mapping), encoding="utf-8")
    # The target is launched below as a backfill, by hand.
    with dagster_deployment(admin_url, db_url.reveal(), tmp_path, mapping,
                            stopped_sensors=("approval_sensor",)) as (gql, _):
        gql.set_pool_limit(build_pool(spec), 2)
        gql.set_pool_limit(replace_pool(spec), 0)  # the target's runs wait for the approval
        with snapshots_held(db_url.reveal()):  # both build runs seen running at once, however fast
            stages = gql.launch_backfill([["orders_daily", n] for n in ("snapshot", "stage_a", "stage_b")], FOUR)
            target = gql.launch_backfill([["orders_daily", "target"]], FOUR)
            wait_running(gql, {"dagster/backfill": stages}, 2)
        runs = wait_runs(gql, {"dagster/backfill": stages}, 2, timeout=300)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 2
        assert run_ranges(runs) == [("2024-01-01", "2024-01-02"), ("2024-01-03", "2024-01-04")]
        assert most_at_once(runs) == 2
        matched = gql.check_executions(["orders_daily", "stage_b"], "stages_match")
        assert sorted(matched) == FOUR and all(e["evaluation"]["success"] for e in matched.values())
        # The operator plans the four days and approves that plan from the command line.
        plan = cli(spec_file, tmp_path, db_url.reveal(), "plan", "--partitions", "2024-01-01..2024-01-04")
        assert plan["status"] == "ready", plan
        cli(spec_file, tmp_path, db_url.reveal(), "approve", "--plan", plan["plan_id"], "--by", "e2e", "--yes")
        gql.set_pool_limit(replace_pool(spec), 1)
        runs = wait_runs(gql, {"dagster/backfill": target}, 2, timeout=300)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 2 and most_at_once(runs) == 1
    # One application, the Connect server's, ran everything on the workers' executors: no other
    # registered with the master, the steps of the four runs and the operator's commands were
    # sessions of it, and any executor started meanwhile was its own.
    server = next(iter(applications(workdir / "master.log")))  # the Connect server registered first
    assert applications(since(workdir / "master.log")) == {}
    launched = {a.split("/")[0] for n in (1, 2) for a in executors_launched(since(workdir / f"worker{n}.log"))}
    assert launched <= {server} and executor_of(server)  # its executors run on the workers
    assert len(sessions(since(workdir / "connect.log"))) >= 4
    assert latest_ledger(conn, plan["plan_id"]) == {d: "verified" for d in FOUR}
    # What the target's runs re-read after each switch is what was planned and approved.
    verified = dict(conn.execute("SELECT partition, content_hash FROM backfill_control.ledger "
                                 "WHERE plan_id = %s AND status = 'verified'", (plan["plan_id"],)).fetchall())
    assert verified == {p["partition"]: p["stage_a"]["content_hash"] for p in plan["partitions"]}
