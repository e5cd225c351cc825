"""The whole flow on a real Spark cluster on 127.0.0.1 (a standalone master and two one-core
workers started from the pyspark wheel) and through a Spark Connect server on it: the same
content hashes as the DuckDB engine for the same rows, the target verified, a rerun writing
nothing; on the master, an executor killed during a build and the driver killed during apply
change nothing. Each flow runs in a driver process of its own."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from backfill_assets.cli.crash_hook import PAUSE_ENV, PAUSE_FILE_ENV
from backfill_assets.core import plan as plan_module
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import COLUMNS, duck_spec, newest, source_table
from backfill_assets_tests.support.spark_cluster import (
    connect_server,
    executors_launched,
    on_cluster,
    run_flow,
    standalone_cluster,
)
from backfill_assets_tests.support.spark_lakes import spark_mapping, target_rows, write_parquet_source
from backfill_assets_tests.support.specs import REPO

VICTIM = "2024-01-02"

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module", name="cluster")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("cluster")
    with standalone_cluster(workdir) as master, connect_server(master, workdir) as connect:
        yield {"master": master, "connect": connect, "workdir": workdir}


def test_the_flow_through_spark_connect_gives_the_hashes_of_the_other_engines(cluster, tmp_path: Path, factory,
                                                                             url_env):
    """Plan, approve, apply and a rerun through the Connect server (the flow on the master
    itself is the next test's, with its failures)."""
    via = "connect"
    source = write_parquet_source(tmp_path / "orders_raw")
    mapping = spark_mapping(tmp_path, source, name=f"orders_daily_{via}",
                            control_schema=f"backfill_control_{via}")
    found = run_flow(cluster[via], tmp_path, mapping)
    assert found["status"] == "ready", found["problems"]
    assert found["applied"] == ["verified"] * 3
    assert found["again"] == ["skipped-already-verified"] * 3
    # The same rows planned by the DuckDB engine, in this process: the same content hashes.
    (tmp_path / "duck").mkdir()
    duck = plan_module.make_plan(duck_spec(tmp_path / "duck", source), PartitionRequest("2024-01-01..2024-01-03"),
                                 factory)
    assert found["hashes"] == {p.partition: p.stage_a.content_hash for p in duck.document.partitions}
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    # The work ran on the workers' executors, not in a local driver.
    assert executors_launched(cluster["workdir"] / "worker1.log") + executors_launched(cluster["workdir"] / "worker2.log")


def test_an_executor_killed_in_a_build_and_the_driver_killed_in_apply_change_nothing(cluster, tmp_path: Path, factory,
                                                                                     url_env):
    """On the cluster: the executor running stage A's tasks is killed (SIGKILL) while the build
    writes: the worker starts another, Spark runs the lost tasks again, and the plan's hashes
    are the DuckDB engine's for the same rows. Then the driver process (and so the JVM it
    started) is killed after Spark wrote and fingerprinted a partition, before the switch: the
    partition is as it was, the cluster lets the application go, and a rerun from a new driver
    converges."""
    from backfill_assets.cli import demo
    from backfill_assets_tests.support.duck_lakes import edge_rows
    source = write_parquet_source(tmp_path / "orders_raw", source_table(
        demo.source_rows(orders_per_day=10_000, moved=False) + edge_rows()))
    mapping = spark_mapping(tmp_path, source, name="orders_daily_lost", control_schema="backfill_control_lost")
    building = Path(mapping["engine"]["staging"]) / "stage_a"
    logs = [cluster["workdir"] / "worker1.log", cluster["workdir"] / "worker2.log"]
    launched = sum(len(executors_launched(log)) for log in logs)
    started, done, killed = time.time(), threading.Event(), []

    def kill_the_executor_while_stage_a_is_written() -> None:
        while not done.is_set() and not killed:
            if any(building.glob("_building-*")):
                for p in psutil.process_iter(["cmdline", "create_time"]):
                    if "CoarseGrainedExecutorBackend" in " ".join(p.info["cmdline"] or []) \
                            and p.info["create_time"] >= started:  # this flow's, not the Connect server's
                        p.kill()
                        killed.append(p.pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_executor_while_stage_a_is_written)
    killer.start()
    try:
        planned = run_flow(cluster["master"], tmp_path, mapping, "planned")
    finally:
        done.set()
        killer.join()
    assert killed, "no executor of the flow was seen while stage A was written"
    assert planned["status"] == "ready", planned["problems"]
    # The flow's first executor and the one started in place of the killed one.
    assert sum(len(executors_launched(log)) for log in logs) - launched >= 2
    (tmp_path / "duck").mkdir()
    duck = plan_module.make_plan(duck_spec(tmp_path / "duck", source), PartitionRequest("2024-01-01..2024-01-03"),
                                 factory)
    assert planned["hashes"] == {p.partition: p.stage_a.content_hash for p in duck.document.partitions}

    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(on_cluster(mapping, cluster["master"])), encoding="utf-8")
    marker = tmp_path / "paused"
    apply = [sys.executable, "-m", "backfill_assets.cli", "apply", "--spec", str(spec_file), "--plan",
             planned["plan_id"], "--quiet", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(apply, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, PAUSE_ENV: f"before-commit:{VICTIM}", PAUSE_FILE_ENV: str(marker)})
    deadline = time.monotonic() + 180
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"apply never reached the switch: {proc.communicate()[1][-3000:]!r}")
        time.sleep(0.1)
    jvms = psutil.Process(proc.pid).children(recursive=True)
    assert jvms, "the driver started no JVM"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(jvms, timeout=60)
    assert not alive, "the driver's JVM outlived it"
    target = tmp_path / "orders_daily"
    assert (target / "order_date=2024-01-01").is_dir()  # switched in before the kill
    assert not (target / f"order_date={VICTIM}").exists()  # written and fingerprinted, never switched in
    rerun = subprocess.run(apply, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    statuses = {p["partition"]: p["status"] for p in json.loads(rerun.stdout)["partitions"]}
    assert statuses == {"2024-01-01": "skipped-already-verified", VICTIM: "verified", "2024-01-03": "verified"}
    assert all(p.suffix == ".parquet" for p in (target / f"order_date={VICTIM}").iterdir())
