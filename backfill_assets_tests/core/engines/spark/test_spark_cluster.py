"""The whole flow on a real Spark cluster on 127.0.0.1 (a standalone master and two one-core
workers started from the pyspark wheel) and through a Spark Connect server on it: the same
content hashes as the DuckDB engine for the same rows, the target verified, a rerun writing
nothing. On both, an executor killed during a build and the driver (through Connect, the
client) killed during apply change nothing; through Connect, readers during the switch see a
partition's old rows or its new ones. Each flow runs in a driver process of its own."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from backfill_assets.cli.crash_hook import PAUSE_ENV, PAUSE_FILE_ENV
from backfill_assets.core import plan as plan_module
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import COLUMNS, duck_spec, newest, source_table
from backfill_assets_tests.support.spark_cluster import (
    applications,
    executor_of,
    executors_launched,
    on_cluster,
    run_flow,
)
from backfill_assets_tests.support.spark_lakes import listed_rows, spark_mapping, target_rows, write_parquet_source
from backfill_assets_tests.support.specs import REPO

VICTIM = "2024-01-02"

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.xdist_group("spark_cluster")]


def _killing(victims: Callable[[], list], when: Callable[[], bool]) -> tuple[threading.Event, list[int], threading.Thread]:
    """A thread that SIGKILLs the processes ``victims`` gives, once, as soon as ``when`` holds."""
    done, killed = threading.Event(), []

    def run() -> None:
        while not done.is_set() and not killed:
            if when():
                for p in victims():
                    p.kill()
                    killed.append(p.pid)
            time.sleep(0.05)

    thread = threading.Thread(target=run)
    thread.start()
    return done, killed, thread


def _read_rows(folder: Path, seen: list[int], stop: threading.Event, switching: threading.Event) -> None:
    """Read one partition of the target, as any Parquet reader does, until ``stop``: its row count
    each time. A read every 50 ms until ``switching`` is set, then back to back: the readers take
    the CPU the apply that switches shares with them only while it can switch."""
    while not stop.is_set():
        with contextlib.suppress(FileNotFoundError, OSError):  # listed before a switch, opened after: never wrong rows
            seen.append(listed_rows(folder))
        if not switching.is_set():
            stop.wait(0.05)


def _paused_apply(spec: dict, plan_id: str, root: Path) -> tuple[subprocess.Popen, list[str], dict[str, str]]:
    """``apply`` of the plan as the command line runs it (``spec`` written under ``root``), paused
    by the crash hook before VICTIM's switch: the process, once there; its command and environment
    for a rerun."""
    spec_file = root / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    marker = root / "paused"
    apply = [sys.executable, "-m", "backfill_assets.cli", "apply", "--spec", str(spec_file), "--plan", plan_id,
             "--quiet", "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(apply, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**env, PAUSE_ENV: f"before-commit:{VICTIM}", PAUSE_FILE_ENV: str(marker)})
    deadline = time.monotonic() + 180
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"apply never reached the switch: {proc.communicate()[1][-3000:]!r}")
        time.sleep(0.1)
    return proc, apply, env


def test_through_spark_connect_a_lost_executor_a_killed_client_and_readers_change_nothing(spark_cluster, tmp_path: Path,
                                                                                         factory, url_env):
    """Through the Connect server: the executor of the server's application is killed (SIGKILL)
    while stage A is written; Spark runs the lost tasks again and plan, approve, apply and a
    rerun give the DuckDB engine's hashes. Then a changed day is planned again and applied from a
    client killed (SIGKILL) before its switch: the day is as it was; a new client's apply
    converges; readers of the day all the while see its old rows or its new ones, never a mix."""
    from backfill_assets.cli import demo
    from backfill_assets_tests.support.duck_lakes import edge_rows
    via = "connect"
    raw = demo.source_rows(orders_per_day=2_000, moved=False) + edge_rows()
    source = write_parquet_source(tmp_path / "orders_raw", source_table(raw))
    mapping = spark_mapping(tmp_path, source, name=f"orders_daily_{via}", control_schema=f"backfill_control_{via}")
    building = Path(mapping["engine"]["staging"]) / "stage_a"
    server = next(iter(applications(spark_cluster["workdir"] / "master.log")))  # the Connect server registered first
    done, killed, killer = _killing(lambda: executor_of(server), lambda: any(building.glob("_building-*")))
    try:
        found = run_flow(spark_cluster[via], tmp_path, mapping)
    finally:
        done.set()
        killer.join()
    assert killed, "the Connect server's executor was not seen while stage A was written"
    assert found["status"] == "ready", found["problems"]
    assert found["applied"] == ["verified"] * 3
    assert found["again"] == ["skipped-already-verified"] * 3
    # The same rows planned by the DuckDB engine, in this process: the same content hashes.
    (tmp_path / "duck").mkdir()
    duck = plan_module.make_plan(duck_spec(tmp_path / "duck", source), PartitionRequest("2024-01-01..2024-01-03"),
                                 factory)
    assert found["hashes"] == {p.partition: p.stage_a.content_hash for p in duck.document.partitions}
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table(raw).to_pylist()]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    # The work ran on the workers' executors, not in a local driver.
    assert executors_launched(spark_cluster["workdir"] / "worker1.log") + executors_launched(spark_cluster["workdir"] / "worker2.log")

    # A third of the day's orders gone from the source: planned and approved again.
    victim = dt.date.fromisoformat(VICTIM)
    changed = [r for r in raw if not (r[0] == victim and (r[1] or 0) % 3 == 0)]
    write_parquet_source(tmp_path / "orders_raw", source_table(changed))
    old, new = len(newest(rows, victim)), len(newest([tuple(r[c] for c in COLUMNS) for r in
                                                      source_table(changed).to_pylist()], victim))
    assert old != new
    again = run_flow(spark_cluster[via], tmp_path, mapping, "planned")
    assert again["status"] == "ready", again["problems"]
    seen, stop, switching = [], threading.Event(), threading.Event()
    readers = [threading.Thread(target=_read_rows, args=(tmp_path / "orders_daily" / f"order_date={VICTIM}", seen,
                                                         stop, switching)) for _ in range(2)]
    for r in readers:
        r.start()
    try:
        proc, apply, env = _paused_apply(on_cluster(mapping, spark_cluster[via]), again["plan_id"], tmp_path)
        os.kill(proc.pid, signal.SIGKILL)  # the client: the Connect server and its session live on
        proc.wait()
        assert target_rows(tmp_path / "orders_daily", victim) == newest(rows, victim)  # never switched in
        switching.set()
        rerun = subprocess.run(apply, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop.set()
        for r in readers:
            r.join()
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    statuses = {p["partition"]: p["status"] for p in json.loads(rerun.stdout)["partitions"]}
    assert statuses[VICTIM] == "verified" and set(statuses.values()) <= {"verified", "skipped-already-verified"}
    assert seen and set(seen) <= {old, new}, sorted(set(seen))
    assert old in seen and seen[-1] == new


def test_an_executor_killed_in_a_build_and_the_driver_killed_in_apply_change_nothing(spark_cluster, tmp_path: Path, factory,
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
        demo.source_rows(orders_per_day=2_000, moved=False) + edge_rows()))
    mapping = spark_mapping(tmp_path, source, name="orders_daily_lost", control_schema="backfill_control_lost")
    building = Path(mapping["engine"]["staging"]) / "stage_a"
    logs = [spark_cluster["workdir"] / "worker1.log", spark_cluster["workdir"] / "worker2.log"]
    launched = sum(len(executors_launched(log)) for log in logs)
    started = time.time()

    def the_flow_s_executors() -> list:  # not the Connect server's
        return [p for p in psutil.process_iter(["cmdline", "create_time"])
                if "CoarseGrainedExecutorBackend" in " ".join(p.info["cmdline"] or []) and p.info["create_time"] >= started]

    done, killed, killer = _killing(the_flow_s_executors, lambda: any(building.glob("_building-*")))
    try:
        planned = run_flow(spark_cluster["master"], tmp_path, mapping, "planned")
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

    proc, apply, env = _paused_apply(on_cluster(mapping, spark_cluster["master"]), planned["plan_id"], tmp_path)
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
