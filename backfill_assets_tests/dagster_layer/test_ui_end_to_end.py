"""The UI path, end to end: dagster-webserver and dagster-daemon on loopback with the
dagster-postgres instance, driven over GraphQL exactly as the UI does."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from backfill_assets_tests.support.dagster_server import dagster_deployment
from backfill_assets_tests.support.flows import target_day_hashes
from backfill_assets_tests.support.specs import DEMO_SPEC

pytestmark = pytest.mark.slow

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


@pytest.fixture
def dagster_ui(admin_url, db_url, tmp_path):
    """A webserver and a daemon on 127.0.0.1 with a dagster-postgres instance."""
    with dagster_deployment(admin_url, db_url.reveal(), tmp_path, DEMO_SPEC) as deployment:
        yield deployment


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
