"""The UI path, end to end, against dagster-webserver and dagster-daemon on loopback with a
dagster-postgres instance.

A person, in a real browser (headless Debian Chromium driven by Playwright), launches the
stages backfill, finds the plan on the approvals board, opens the change preview, follows its
approve link, enters a name and launches; approval_sensor runs the target and its checks pass.
Every text typed into the browser is recorded, and the test fails if any of it is an id. Each
step's screenshot is kept under ``BACKFILL_TEST_ARTIFACTS`` (default ``test-artifacts/``), in
``ui/``. Then, over GraphQL as the UI sends it: stages that differ fail the blocking check, and
neither re-executing the failed backfill nor materializing the target by hand replaces it; and
a spec of hourly time windows beside it stages a day of hours as one backfill.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from backfill_assets.core.windows import UTC, windows_between, zone
from backfill_assets_tests.support.dagster_server import LOCATION, dagster_deployment
from backfill_assets_tests.support.flows import target_day_hashes
from backfill_assets_tests.support.specs import DEMO_SPEC, REPO
from backfill_assets_tests.support.windows import EVENTS_SPEC, FALL, create_events

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM_FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]
DAYS = [f"2024-01-0{d}" for d in range(1, 9)]
ARTIFACTS = Path(os.environ.get("BACKFILL_TEST_ARTIFACTS", REPO / "test-artifacts")) / "ui"
# An id as a person would have to copy one: a plan, review or run id, or a prefix of one.
AN_ID = re.compile(r"[0-9a-f]{8,}|[0-9a-f]{8}-[0-9a-f]{4}")


@pytest.fixture
def dagster_ui(admin_url, db_url, tmp_path):
    with dagster_deployment(admin_url, db_url.reveal(), tmp_path, DEMO_SPEC, also=(EVENTS_SPEC,)) as deployment:
        yield deployment


class Person:
    """The browser as a person uses it: clicks, and typed text that is never an id."""

    def __init__(self, page, base: str) -> None:
        self.page, self.base, self.typed, self.steps = page, base, [], 0

    def open(self, path: str) -> None:
        self.page.goto(self.base + path)
        self.page.wait_for_load_state("networkidle")

    def type(self, text: str) -> None:
        assert not AN_ID.search(text), f"the approval path made the person type an id: {text!r}"
        self.typed.append(text)
        self.page.keyboard.type(text)

    def shot(self, name: str, height: int | None = None) -> Path:
        """A screenshot of the page (``height``: of a taller window, for a long page)."""
        self.steps += 1
        path = ARTIFACTS / f"{self.steps}-{name}.png"
        if height:
            self.page.set_viewport_size({"width": 1440, "height": height})
        self.page.screenshot(path=str(path))
        if height:
            self.page.set_viewport_size({"width": 1440, "height": 900})
        return path


def until(what: str, probe, timeout: float = 240, every: float = 2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_a_person_approves_the_preview_they_saw_then_differing_stages_are_never_applied(dagster_ui, demo_db):
    from playwright.sync_api import sync_playwright

    gql, port = dagster_ui
    gql("mutation { setNuxSeen }")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is needed for the browser test (make test installs it)"
    before = target_day_hashes(demo_db)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
            page.set_default_timeout(60_000)
            person = Person(page, f"http://127.0.0.1:{port}")
            try:
                _walk(person, gql, demo_db)
            except BaseException:
                person.shot("failed")
                (ARTIFACTS / "failed.html").write_text(page.content(), encoding="utf-8")
                raise
        finally:
            browser.close()
    assert person.typed == ["Ada Lovelace"]  # the name, and nothing else
    (plan_id,) = demo_db.execute("SELECT plan_id FROM backfill_control.approvals").fetchone()
    ledger = demo_db.execute(
        "SELECT partition, status FROM backfill_control.ledger WHERE plan_id = %s ORDER BY partition", (plan_id,)
    ).fetchall()
    assert ledger == [(p, "verified") for p in DAYS]
    stage_a = {p["partition"]: p["stage_a"]["content_hash"] for p in demo_db.execute(
        "SELECT plan -> 'partitions' FROM backfill_control.plans WHERE plan_id = %s", (plan_id,)).fetchone()[0]}
    assert target_day_hashes(demo_db) == stage_a != before
    _differing_stages_are_never_applied(gql, demo_db)
    _hours_are_one_backfill(gql, demo_db)


def _walk(person: Person, gql, demo_db) -> None:
    page = person.page
    # 1. Launch the stages backfill: the stages job's page, "Materialize all", every partition.
    person.open(f"/locations/{LOCATION}/jobs/orders_daily__build_stages")
    page.locator("button", has_text="Materialize all").first.click()
    page.locator("button", has_text=re.compile(r"^All$")).first.click()  # every partition
    launch = page.locator("button", has_text=re.compile(r"Launch( \d+-run)? backfill")).first
    launch.wait_for()
    person.shot("launch-stages-backfill")
    launch.click()
    backfill = until("the stages backfill", lambda: _newest_backfill(gql))
    assert gql.wait_backfill(backfill) == "COMPLETED_SUCCESS"
    person.open(f"/runs/b/{backfill}?tab=partitions")
    person.shot("stages-backfill-done")

    # 2. The plan waits on the approvals board, with its preview's counts and an approve link.
    def board_lists(plans: int, approvals: int):
        def probe() -> bool:
            person.open("/assets/orders_daily/approvals")
            body = person.page.inner_text("body")
            return f"Plans ready, not approved ({plans})" in body and f"Approved, not yet applied ({approvals})" in body
        return probe
    # The board is observed every 10 s: one observation may list the plan before its preview
    # is recorded (no approve link yet), so wait for the one that has both.
    approve_link = 'a[href*="/guess/approve_backfill/playground/setup"]'
    until("the board listing the plan with its approve link",
          lambda: board_lists(1, 0)() and page.locator(approve_link).count() == 1, timeout=120, every=5)
    person.shot("approvals-board-waiting", height=1250)

    # 3. The change preview on the dashboard: stage_a's checks, the preview of one partition.
    person.open("/assets/orders_daily/stage_a?view=checks")
    page.get_by_text("target_change_preview").first.click()
    page.wait_for_load_state("networkidle")
    approve = page.locator(approve_link).first
    approve.wait_for()
    body = page.inner_text("body")
    assert "first_keys" in body and "review_id" in body and "previewed_at" in body  # the evaluation's metadata
    person.shot("change-preview")

    # 4. Its approve link: the gate's launchpad with the plan and the preview chosen.
    with page.context.expect_page() as opened:
        approve.click()
    launchpad = opened.value
    launchpad.set_default_timeout(60_000)
    person.page = launchpad
    launchpad.wait_for_load_state("networkidle")
    editor = launchpad.locator(".CodeMirror").first
    editor.wait_for()
    text = editor.inner_text()
    assert "review_id" in text and "plan_id" in text and "approved_by" in text
    launchpad.get_by_text("approved_by").first.click()
    launchpad.keyboard.press("Control+End")
    person.type("Ada Lovelace")
    person.shot("launchpad-name-entered")
    launchpad.locator("button", has_text="Launch Run").first.click()
    launchpad.wait_for_url(re.compile(r"/runs/"))
    run_id = launchpad.url.rsplit("/runs/", 1)[1].split("?")[0]
    assert gql.wait_run(run_id) == "SUCCESS"
    person.shot("approval-run")
    (approved,) = demo_db.execute("SELECT plan_id, approved_by, review FROM backfill_control.approvals").fetchall()
    assert approved[1] == "Ada Lovelace" and approved[2]["review_id"]

    # 5. approval_sensor runs the target; its checks pass, on the dashboard.
    plan_id = approved[0]
    target = until("the target run", lambda: gql.runs({"backfill_assets/plan_id": plan_id}))
    assert gql.wait_run(target[0]["runId"]) == "SUCCESS"
    checks = gql.check_executions(["orders_daily", "target"], "target_matches_approved_plan")
    assert sorted(checks) == DAYS and all(e["evaluation"]["success"] for e in checks.values())
    person.open("/assets/orders_daily/target?view=checks")
    page = person.page
    page.get_by_text("target_matches_approved_plan").first.wait_for()
    person.shot("target-checks")

    # 6. The board: nothing waits any more.
    until("the board emptied", board_lists(0, 0), timeout=120, every=5)
    person.shot("approvals-board-empty", height=1250)


def _newest_backfill(gql) -> str | None:
    data = gql("query { partitionBackfillsOrError(limit: 1) { ... on PartitionBackfills { results { id } } } }")
    found = data["partitionBackfillsOrError"]["results"]
    return found[0]["id"] if found else None


STAGES = [["orders_daily", "snapshot"], ["orders_daily", "stage_a"], ["orders_daily", "stage_b"]]


def _differing_stages_are_never_applied(gql, demo_db) -> None:
    before = target_day_hashes(demo_db)
    # One partition's stages differ: a late source fix, and stage A skewed for that day.
    demo_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-02'")
    demo_db.execute(
        "CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN NEW.note := 'skewed'; END IF; RETURN NEW; END $$")
    demo_db.execute("CREATE TRIGGER skew BEFORE INSERT ON backfill_control.orders_daily__stage_a "
                    "FOR EACH ROW EXECUTE FUNCTION public.skew()")
    failed = gql.launch_backfill([*STAGES, ["orders_daily", "target"]], ["2024-01-02"])
    assert gql.wait_backfill(failed) in {"COMPLETED_FAILED", "FAILED"}
    assert not gql.check_executions(["orders_daily", "stage_b"], "stages_match")["2024-01-02"]["evaluation"]["success"]
    # Re-executing the failed backfill from failure does not replace the target.
    data = gql("""mutation($params: ReexecutionParams) { reexecutePartitionBackfill(reexecutionParams: $params) {
                  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }""",
               params={"parentRunId": failed, "strategy": "FROM_FAILURE"})
    assert data["reexecutePartitionBackfill"]["__typename"] == "LaunchBackfillSuccess", data
    gql.wait_backfill(data["reexecutePartitionBackfill"]["backfillId"])
    # Neither does materializing the target by hand.
    by_hand = gql.launch_run("orders_daily__replace_target", tags={"dagster/partition": "2024-01-02"})
    assert gql.wait_run(by_hand) == "FAILURE"
    assert target_day_hashes(demo_db) == before


def _hours_are_one_backfill(gql, demo_db) -> None:
    """A spec of hourly windows beside it: the 25 hours of the night New York's clocks fall
    back, launched as one backfill of its stages (the range the UI's partition picker sends),
    each window staged and checked on its own."""
    create_events(demo_db, FALL)
    hours = [w.label for w in windows_between(dt.datetime(2024, 11, 3, 4, tzinfo=UTC), dt.datetime(2024, 11, 4, 5, tzinfo=UTC),
                                              "hour", zone("America/New_York"))]
    assert len(hours) == 25
    backfill = gql.launch_backfill([["events_hourly", n] for n in ("snapshot", "stage_a", "stage_b")], hours)
    assert gql.wait_backfill(backfill) == "COMPLETED_SUCCESS"
    assert len(gql.runs({"dagster/backfill": backfill})) == 1  # one run for the range
    checks = gql.check_executions(["events_hourly", "stage_b"], "stages_match")
    assert sorted(checks) == sorted(hours) and all(e["evaluation"]["success"] for e in checks.values())
