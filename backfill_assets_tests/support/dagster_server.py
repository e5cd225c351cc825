"""A real Dagster deployment on loopback for the end-to-end tests: dagster-webserver and
dagster-daemon with a dagster-postgres instance in a fresh database, driven over GraphQL
exactly as the UI drives them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import yaml
from psycopg import sql

from backfill_assets_tests.support.specs import REPO, URL_ENV

LOCATION = "backfill_assets.dagster_layer.definitions"
REPOSITORY = "__repository__"
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
RUN_DONE = {"SUCCESS", "FAILURE", "CANCELED"}

# dagster-daemon, with the backfill daemon's tick at 2 s instead of 30. Dagster reads this
# constant each loop (dagster/_daemon/backfill.py) and has no setting for it; at 30 s a
# backfill of stages, checks and target spends most of a test waiting for ticks. Everything
# else is the real daemon: the same CLI, instance, queue and run launcher.
SHORT_TICK_DAEMON = (
    "import sys; import dagster._daemon.controller as c; c.DEFAULT_DAEMON_INTERVAL_SECONDS = 2; "
    "from dagster._daemon.cli import main; sys.argv[0] = 'dagster-daemon'; sys.exit(main())"
)


class GraphQL:
    def __init__(self, url: str) -> None:
        self.url = url

    def __call__(self, query: str, **variables: object) -> dict:
        body = json.dumps({"query": query, "variables": variables}).encode()
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            payload = json.loads(response.read())
        assert "errors" not in payload, payload["errors"]
        return payload["data"]

    def launch_backfill(self, assets: list[list[str]], partitions: list[str]) -> str:
        data = self("""
            mutation($params: LaunchBackfillParams!) {
              launchPartitionBackfill(backfillParams: $params) {
                __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
              }
            }""", params={"assetSelection": [{"path": a} for a in assets], "partitionNames": partitions})
        result = data["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return result["backfillId"]

    def wait_backfill(self, backfill_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self("""
                query($id: String!) { partitionBackfillOrError(backfillId: $id) {
                  __typename ... on PartitionBackfill { status } } }""", id=backfill_id)
            status = data["partitionBackfillOrError"]["status"]
            if status in TERMINAL and not self.runs({"dagster/backfill": backfill_id}, running=True):
                return status
            time.sleep(2)
        raise AssertionError(f"backfill {backfill_id} did not finish in {timeout} s")

    def runs(self, tags: dict[str, str], running: bool = False) -> list[dict]:
        """Runs with ``tags``: id, status, job, start and end time (seconds since the epoch,
        as the instance recorded them), and their tags."""
        data = self("""
            query($filter: RunsFilter) { runsOrError(filter: $filter) {
              ... on Runs { results { runId status jobName startTime endTime tags { key value } } } } }""",
                    filter={"tags": [{"key": k, "value": v} for k, v in tags.items()]})
        runs = data["runsOrError"]["results"]
        return [r for r in runs if r["status"] not in RUN_DONE] if running else runs

    def launch_run(self, job: str, run_config: dict | None = None, tags: dict[str, str] | None = None) -> str:
        data = self("""
            mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
              __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
              ... on RunConfigValidationInvalid { errors { message } } } }""",
                    params={"selector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY,
                                         "jobName": job},
                            "runConfigData": run_config or {},
                            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in (tags or {}).items()]}})
        result = data["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return result["run"]["runId"]

    def wait_run(self, run_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self("""query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }""", id=run_id)
            if data["runOrError"]["status"] in RUN_DONE:
                return data["runOrError"]["status"]
            time.sleep(1)
        raise AssertionError(f"run {run_id} did not finish in {timeout} s")

    def check_executions(self, asset: list[str], check: str) -> dict[str, dict]:
        data = self("""
            query($key: AssetKeyInput!, $check: String!) {
              assetCheckExecutions(assetKey: $key, checkName: $check, limit: 100) {
                partition status evaluation { success metadataEntries {
                  label ... on TextMetadataEntry { text } } } } }""", key={"path": asset}, check=check)
        latest: dict[str, dict] = {}
        for e in data["assetCheckExecutions"]:  # newest first
            latest.setdefault(e["partition"], e)
        return latest

    def set_pool_limit(self, pool: str, limit: int) -> None:
        """What `dagster instance concurrency set` and the UI's pool page do."""
        data = self("""mutation($pool: String!, $limit: Int!) {
                         setConcurrencyLimit(concurrencyKey: $pool, limit: $limit) }""", pool=pool, limit=limit)
        assert data["setConcurrencyLimit"] is True, data

    def stop_sensor(self, name: str) -> None:
        data = self("""query($selector: SensorSelector!) { sensorOrError(sensorSelector: $selector) {
                         __typename ... on Sensor { sensorState { id } } } }""",
                    selector={"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": name})
        state_id = data["sensorOrError"]["sensorState"]["id"]
        data = self("""mutation($id: String!) { stopSensor(id: $id) {
                         __typename ... on StopSensorMutationResult { instigationState { status } } } }""", id=state_id)
        assert data["stopSensor"]["instigationState"]["status"] == "STOPPED", data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, procs: list[subprocess.Popen], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a Dagster process exited during start-up")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(1)
    raise AssertionError(f"{url} did not answer in {timeout} s")


@contextlib.contextmanager
def dagster_deployment(admin_url: str, data_url: str, tmp_path: Path, spec: dict,
                       instance_settings: dict | None = None,
                       stopped_sensors: tuple[str, ...] = (), also: tuple[dict, ...] = ()) -> Iterator[tuple[GraphQL, int]]:
    """dagster-webserver and dagster-daemon on 127.0.0.1 for one spec (and the specs ``also``
    names, in the same code location), with the instance of
    ``deploy/dagster.yaml`` (plus ``instance_settings``) in a fresh dagster-postgres database;
    yields the GraphQL client and the port. Both processes' logs are printed on failure.

    ``stopped_sensors`` are stopped through the webserver before the daemon starts. Stopped
    while the daemon runs, a sensor that has no stored state yet races the daemon's first tick:
    both insert its state, and the loser's unique violation is GraphQL's HTTP 500.

    Each process runs in a session of its own, which is killed whole at the end: the code
    servers the webserver and the daemon start (``dagster api grpc``) and the runs the daemon
    launches do not outlive the test."""
    instance_db = f"bfa_dagster_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(instance_db)))
    home = tmp_path / "dagster_home"
    home.mkdir()
    settings = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text(encoding="utf-8"))
    # The queue is checked each second rather than each 5 s (the daemon's tick, SHORT_TICK_DAEMON).
    settings = {**settings, "run_queue": {"dequeue_interval_seconds": 1}, **(instance_settings or {})}
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings), encoding="utf-8")
    spec_files = []
    for each in (spec, *also):
        spec_files.append(tmp_path / f"{each['name']}.yaml")
        spec_files[-1].write_text(yaml.safe_dump(each), encoding="utf-8")
    env = {
        **os.environ, "DAGSTER_HOME": str(home), URL_ENV: data_url,
        "BACKFILL_SPECS": os.pathsep.join(map(str, spec_files)),
        "DAGSTER_PG_URL": urlunsplit(urlsplit(admin_url)._replace(path="/" + instance_db)),
    }
    port = free_port()
    bin_dir = Path(sys.executable).parent
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("webserver", "daemon")}
    workspace = str(REPO / "workspace.yaml")
    commands = {"webserver": [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port), "-w", workspace],
                "daemon": [sys.executable, "-c", SHORT_TICK_DAEMON, "run", "-w", workspace]}

    def start(name: str) -> subprocess.Popen:
        return subprocess.Popen(commands[name], cwd=REPO, env=env, stdout=logs[name], stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)

    procs = [start("webserver")]
    try:
        if not stopped_sensors:
            procs.append(start("daemon"))
        wait_http(f"http://127.0.0.1:{port}/server_info", procs)
        gql = GraphQL(f"http://127.0.0.1:{port}/graphql")
        if stopped_sensors:
            for name in stopped_sensors:
                gql.stop_sensor(name)
            procs.append(start("daemon"))
        yield gql, port
    except BaseException:
        for name in logs:
            print((tmp_path / f"{name}.log").read_text(errors="replace")[-6000:])
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # what is left of its session: code servers, runs
        for f in logs.values():
            f.close()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(instance_db)))
