"""A real Spark cluster on 127.0.0.1, from what the pyspark wheel ships: a standalone master,
two workers of one core each, and a Spark Connect server on that cluster. Started by the test
fixtures, each JVM in a process group of its own, and stopped (the whole group) afterwards.
The ``spark_cluster`` fixture (this module is a pytest plugin of the suite's conftest) starts
one of each for the test session, on the worker that first needs it: the tests that use it
are marked ``xdist_group("spark_cluster")``, which the suite's ordering keeps on one worker.

``run_flow`` runs plan, approve, apply and a rerun in a process of its own (the test process
already holds a local Spark context, which a session started there would reuse)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_READY_SECONDS = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


def _env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "SPARK_HOME": str(_spark_home()), "SPARK_LOG_DIR": str(workdir),
            "SPARK_WORKER_DIR": str(workdir / "work"), "SPARK_LOCAL_IP": "127.0.0.1"}


@contextlib.contextmanager
def _jvm(args: list[str], log: Path, ready: str, workdir: Path) -> Iterator[subprocess.Popen]:
    """A JVM started from the wheel's scripts, until ``ready`` appears in its log."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=_env(workdir), start_new_session=True)
    try:
        deadline = time.monotonic() + _READY_SECONDS
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{args[1].rsplit('.', 1)[-1]} did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def standalone_cluster(workdir: Path) -> Iterator[str]:
    """``spark://127.0.0.1:<port>``: a master and two one-core workers."""
    workdir.mkdir(parents=True, exist_ok=True)
    spark_class = str(_spark_home() / "bin" / "spark-class")
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(_jvm(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(_free_port())], workdir / "master.log", "I have been elected leader", workdir))
        for n in (1, 2):
            stack.enter_context(_jvm(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                 "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(workdir / f"work{n}"),
                 master], workdir / f"worker{n}.log", "Successfully registered with master", workdir))
        yield master


@contextlib.contextmanager
def connect_server(master: str, workdir: Path) -> Iterator[str]:
    """``sc://127.0.0.1:<port>``: a Spark Connect server whose driver runs on ``master``, its
    application taking one of the workers' two cores: the other stays free for a driver started
    on the master itself, as an application holding every core would leave the other none."""
    port = _free_port()
    args = [str(_spark_home() / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master,
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", f"spark.connect.grpc.binding.port={port}",
            "--conf", "spark.ui.enabled=false", "--conf", "spark.cores.max=1",
            "--conf", "spark.executor.memory=512m"]
    if Path("/usr/share/java/postgresql.jar").is_file():
        args += ["--jars", "/usr/share/java/postgresql.jar"]
    with _jvm([*args, "spark-internal"], workdir / "connect.log", "Spark Connect server started", workdir):
        yield f"sc://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The session's cluster: ``master`` (spark://), ``connect`` (sc://, an application
    holding one of the two cores) and ``workdir`` (its logs: master.log, worker1.log,
    worker2.log, connect.log). Its tests see what earlier ones left in the logs, and read
    what they need from where the logs stood when they began."""
    workdir = tmp_path_factory.mktemp("cluster")
    with standalone_cluster(workdir) as master, connect_server(master, workdir) as connect:
        yield {"master": master, "connect": connect, "workdir": workdir}


def on_cluster(spec: dict, master: str) -> dict:
    """The spec with its engine on ``master``, taking one of the workers' two cores (the other
    is the Connect server's)."""
    conf = {} if master.startswith("sc://") else {"spark.cores.max": "1", "spark.executor.memory": "512m"}
    return {**spec, "engine": {**spec["engine"], "master": master, "conf": conf}}


def run_flow(master: str, root: Path, spec: dict, *more: str) -> dict:
    """Plan, approve, apply and apply again the spec (engine.master set to ``master``) in a
    process of its own (``more``: "planned" stops after the approval); what it found, as JSON."""
    mapping = on_cluster(spec, master)
    done = subprocess.run([sys.executable, "-m", "backfill_assets_tests.support.cluster_flow", json.dumps(mapping),
                           *more],
                          capture_output=True, text=True, timeout=300, cwd=str(root),
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    found = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and found, f"the flow on {master} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(found[-1])


def executors_launched(log: Path) -> list[str]:
    """The executors a worker launched (from its log), for a test to see that the work ran on
    the cluster and not in a local driver."""
    return re.findall(r"Asked to launch executor (\S+)", log.read_text(errors="replace"))


def applications(master_log: Path) -> dict[str, str]:
    """The applications the master registered, id -> name, in the order they came (from its log)."""
    return {app: name for name, app in re.findall(r"Registered app (\S+) with ID (\S+)",
                                                  master_log.read_text(errors="replace"))}


def executor_of(app: str) -> list:
    """The executor processes (psutil) that run for application ``app`` on this machine."""
    import psutil
    found = []
    for p in psutil.process_iter(["cmdline"]):
        line = p.info["cmdline"] or []
        if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in line and app in line:
            found.append(p)
    return found

