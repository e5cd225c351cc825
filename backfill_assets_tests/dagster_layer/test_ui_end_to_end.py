"""The UI path, end to end: dagster-webserver and dagster-daemon on loopback with the
dagster-postgres instance, driven over GraphQL exactly as the UI does."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

from backfill_assets_tests.conftest import DEMO_SPEC, REPO, URL_ENV
from backfill_assets_tests.core.test_apply import target_day_hashes

pytestmark = pytest.mark.slow

LOCATION = "backfill_assets.definitions"
REPOSITORY = "__repository__"
TERMINAL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
RUN_DONE = {"SUCCESS", "FAILURE", "CANCELED"}


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
        data = self("""
            query($filter: RunsFilter) { runsOrError(filter: $filter) {
              ... on Runs { results { runId status jobName } } } }""",
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


CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1280,800", "--virtual-time-budget=20000",
]


def chromium(url: str, tmp_path: Path, *args: str) -> str:
    """Run headless Debian Chromium on a loopback page; return what it printed."""
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is needed for the screenshot test (make test installs it)"
    done = subprocess.run(
        [exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}", *args, url],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


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


@pytest.fixture
def dagster_ui(admin_url, db_url, tmp_path):
    """A webserver and a daemon on 127.0.0.1 with a dagster-postgres instance."""
    instance_db = f"bfa_dagster_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(instance_db)))
    from urllib.parse import urlsplit, urlunsplit

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    spec_file = tmp_path / "orders_daily.yaml"
    spec_file.write_text(yaml.safe_dump(DEMO_SPEC), encoding="utf-8")
    env = {
        **os.environ, "DAGSTER_HOME": str(home), URL_ENV: db_url.reveal(), "BACKFILL_SPECS": str(spec_file),
        "DAGSTER_PG_URL": urlunsplit(urlsplit(admin_url)._replace(path="/" + instance_db)),
    }
    port = free_port()
    bin_dir = Path(sys.executable).parent
    logs = {name: open(tmp_path / f"{name}.log", "wb") for name in ("webserver", "daemon")}
    procs = [
        subprocess.Popen([str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port),
                          "-w", str(REPO / "workspace.yaml")], cwd=REPO, env=env,
                         stdout=logs["webserver"], stderr=subprocess.STDOUT),
        subprocess.Popen([str(bin_dir / "dagster-daemon"), "run", "-w", str(REPO / "workspace.yaml")],
                         cwd=REPO, env=env, stdout=logs["daemon"], stderr=subprocess.STDOUT),
    ]
    try:
        wait_http(f"http://127.0.0.1:{port}/server_info", procs)
        yield GraphQL(f"http://127.0.0.1:{port}/graphql"), port
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
                p.kill()
        for f in logs.values():
            f.close()
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(instance_db)))


STAGES = [["orders_daily", "snapshot"], ["orders_daily", "stage_a"], ["orders_daily", "stage_b"]]
WEEK = [f"2024-01-0{d}" for d in range(1, 8)]


def test_backfill_checks_approval_sensor_target_and_a_refused_reexecution(dagster_ui, demo_db, tmp_path):
    gql, port = dagster_ui
    # 1. A partition backfill of the stages, launched as the UI launches it.
    backfill = gql.launch_backfill(STAGES, WEEK)
    assert gql.wait_backfill(backfill) == "COMPLETED_SUCCESS"
    matched = gql.check_executions(["orders_daily", "stage_b"], "stages_match")
    assert sorted(matched) == [*WEEK, "2024-01-08"]
    assert all(e["evaluation"]["success"] for e in matched.values())
    meta = {m["label"]: m.get("text") for m in matched["2024-01-01"]["evaluation"]["metadataEntries"]}
    plan_id = meta["plan_id"]
    # 2. The manual gate, from the launchpad.
    run = gql.launch_run("approve_backfill", {"ops": {"approve_plan_gate": {"config": {
        "plan_id": plan_id, "approved_by": "e2e"}}}})
    assert gql.wait_run(run) == "SUCCESS"
    # 3. approval_sensor launches the target for exactly the approved partitions.
    deadline = time.monotonic() + 180
    while not (runs := gql.runs({"backfill_assets/plan_id": plan_id})) and time.monotonic() < deadline:
        time.sleep(2)
    (target_run,) = runs
    assert target_run["jobName"] == "orders_daily__replace_target"
    assert gql.wait_run(target_run["runId"]) == "SUCCESS"
    target_checks = gql.check_executions(["orders_daily", "target"], "target_matches_approved_plan")
    assert sorted(target_checks) == [*WEEK, "2024-01-08"] and all(e["evaluation"]["success"] for e in target_checks.values())
    ledger = demo_db.execute(
        "SELECT partition, status FROM backfill_control.ledger WHERE plan_id = %s ORDER BY partition", (plan_id,)
    ).fetchall()
    assert ledger == [(p, "verified") for p in [*WEEK, "2024-01-08"]]
    stage_a = {p["partition"]: p["stage_a"]["content_hash"] for p in demo_db.execute(
        "SELECT plan -> 'partitions' FROM backfill_control.plans WHERE plan_id = %s", (plan_id,)).fetchone()[0]}
    assert target_day_hashes(demo_db) == stage_a
    before = target_day_hashes(demo_db)

    # The asset page shows the check status, in a real browser.
    gql("mutation { setNuxSeen }")
    page = f"http://127.0.0.1:{port}/assets/orders_daily/stage_b?view=checks"
    dom = chromium(page, tmp_path, "--dump-dom")
    assert "stages_match" in dom and "business_key_unique_and_not_null" in dom and "Succeeded" in dom
    chromium(page, tmp_path, f"--screenshot={tmp_path / 'stage_b_checks.png'}")
    shot = (tmp_path / "stage_b_checks.png").read_bytes()
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 20_000
    print(f"screenshot: {tmp_path / 'stage_b_checks.png'}")

    # 4. One partition's stages differ: a late source fix, and stage B skewed for that day.
    demo_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-02'")
    demo_db.execute(
        "CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN NEW.note := 'skewed'; END IF; RETURN NEW; END $$")
    demo_db.execute("CREATE TRIGGER skew BEFORE INSERT ON backfill_control.orders_daily__stage_b "
                    "FOR EACH ROW EXECUTE FUNCTION public.skew()")
    failed = gql.launch_backfill([*STAGES, ["orders_daily", "target"]], ["2024-01-02"])
    assert gql.wait_backfill(failed) in {"COMPLETED_FAILED", "FAILED"}
    assert not gql.check_executions(["orders_daily", "stage_b"], "stages_match")["2024-01-02"]["evaluation"]["success"]
    # 5. Re-executing the failed backfill from failure does not replace the target.
    data = gql("""mutation($params: ReexecutionParams) { reexecutePartitionBackfill(reexecutionParams: $params) {
                  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
               params={"parentRunId": failed, "strategy": "FROM_FAILURE"})
    assert data["reexecutePartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", data
    gql.wait_backfill(data["reexecutePartitionBackfill"]["backfillId"])
    # 6. Neither does materializing the target by hand.
    by_hand = gql.launch_run("orders_daily__replace_target", tags={"dagster/partition": "2024-01-02"})
    assert gql.wait_run(by_hand) == "FAILURE"
    assert target_day_hashes(demo_db) == before
