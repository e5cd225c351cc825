"""Crash injection: apply is killed with SIGKILL at every step of a replace, and the
PostgreSQL server is shut down immediately mid-apply. After each, every partition carries
exactly its old or its new fingerprint, the ledger shows the interrupted run, and running
the same approved plan again converges to the state of an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import yaml
from psycopg import sql

from backfill_assets.cli.crash_hook import PAUSE_ENV, PAUSE_FILE_ENV
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.pg.db import DatabaseUrl, connection_factory
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets_tests.support.flows import ALL_DAYS, DAYS8, all_target_rows, target_hashes
from backfill_assets_tests.support.specs import DEMO_SPEC, REPO, URL_ENV, make_spec

VICTIM = "2024-01-02"  # the partition apply is killed in
ORDER = [d.isoformat() for d in DAYS8]
# Where the victim's target stands once apply is killed at each step.
STEPS = {"locked": "old", "deleted": "old", "inserted": "old", "before-commit": "old",
         "committed": "new", "verified": "new"}


def start_paused_apply(spec_file: Path, url: str, plan_id: str, step: str, tmp_path: Path) -> subprocess.Popen:
    marker = tmp_path / f"paused-{step}"
    env = {**os.environ, URL_ENV: url, PAUSE_ENV: f"{step}:{VICTIM}", PAUSE_FILE_ENV: str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "backfill_assets.cli", "apply", "--spec", str(spec_file),
                             "--plan", plan_id, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():  # the hook writes the marker when apply reaches the step
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"apply never reached {step}: {proc.communicate()[1][-2000:]!r}")
        time.sleep(0.05)
    return proc


def check_old_or_new(conn, old: dict[str, str], new: dict[str, str], victim_state: str) -> None:
    now = target_hashes(conn, DAYS8)
    for label in ORDER:
        assert now[label] in (old[label], new[label]), label  # never a mix, never half-written
    assert now["2024-01-01"] == new["2024-01-01"]  # verified before the kill: stays
    assert now[VICTIM] == (new if victim_state == "new" else old)[VICTIM]
    assert all(now[label] == old[label] for label in ORDER[2:])  # never reached


def ledger_of_interrupted_run(conn, plan_id: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT partition, status FROM backfill_control.ledger WHERE plan_id = %s AND run_id IN "
        "(SELECT run_id FROM backfill_control.ledger WHERE plan_id = %s ORDER BY run_started_at LIMIT 1)",
        (plan_id, plan_id),
    ).fetchall()
    return dict(rows)


@pytest.fixture
def approved_plan(demo_db, factory, tmp_path, db_url):
    spec = make_spec()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(DEMO_SPEC), encoding="utf-8")
    old = target_hashes(demo_db, DAYS8)
    plan = make_plan(spec, ALL_DAYS, factory)
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, plan.plan_id), "crash-test")
    new = {p["partition"]: p["stage_a"]["content_hash"] for p in plan.as_json()["partitions"]}
    return spec, spec_file, plan, old, new


@pytest.mark.parametrize("step", list(STEPS))
def test_sigkill_at_each_step_leaves_old_or_new_and_a_rerun_converges(step, approved_plan, demo_db, factory, db_url, tmp_path):
    spec, spec_file, plan, old, new = approved_plan
    proc = start_paused_apply(spec_file, db_url.reveal(), plan.plan_id, step, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    check_old_or_new(demo_db, old, new, STEPS[step])
    ledger = ledger_of_interrupted_run(demo_db, plan.plan_id)
    assert ledger["2024-01-01"] == "verified" and ledger[VICTIM] == "started"
    assert {ledger[label] for label in ORDER[2:]} == {"pending"}
    rerun = apply_plan(spec, plan.plan_id, factory, run_id=f"rerun-{step}")
    statuses = {p["partition"]: p["status"] for p in rerun.partitions}
    assert statuses["2024-01-01"] == "skipped-already-verified"
    assert statuses[VICTIM] == ("skipped-already-verified" if STEPS[step] == "new" else "verified")
    assert target_hashes(demo_db, DAYS8) == new


@pytest.mark.postgres  # starts a server of its own
def test_an_immediate_server_shutdown_mid_apply_leaves_old_or_new_and_a_rerun_converges(tmp_path, server_dir):
    import pgserver

    pgdata = server_dir / "crash-pg"  # outside pytest's temporary root (conftest, server_dir)
    server = pgserver.get_server(pgdata, cleanup_mode="stop")
    admin = server.get_uri()
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("crash")))
    url = DatabaseUrl(admin.replace("/postgres?", "/crash?"), source="the crash-test server")
    factory = connection_factory(url, DEFAULT_LIMITS)
    from backfill_assets.cli import demo

    spec = make_spec()
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(DEMO_SPEC), encoding="utf-8")
    with factory() as conn:
        demo.load(conn)
        old = target_hashes(conn, DAYS8)
        plan = make_plan(spec, ALL_DAYS, factory)
        approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "crash-test")
    new = {p["partition"]: p["stage_a"]["content_hash"] for p in plan.as_json()["partitions"]}

    proc = start_paused_apply(spec_file, url.reveal(), plan.plan_id, "inserted", tmp_path)
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGQUIT)  # PostgreSQL's immediate shutdown: no checkpoint
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    while (pgdata / "postmaster.pid").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    server.ensure_postgres_running()  # crash recovery
    try:
        with factory() as conn:
            check_old_or_new(conn, old, new, "old")
            ledger = ledger_of_interrupted_run(conn, plan.plan_id)
            assert ledger[VICTIM] == "started" and ledger["2024-01-01"] == "verified"
            # The unlogged snapshot copy and stages do not survive a crash: apply refuses (the
            # copy's seal fails first), a new plan copies and rebuilds them byte for byte,
            # under the same plan id, so the approval still holds.
            with pytest.raises(ApprovalError, match="changed since it was taken; plan again"):
                apply_plan(spec, plan.plan_id, factory, run_id="after-crash")
            assert make_plan(spec, ALL_DAYS, factory).plan_id == plan.plan_id
            apply_plan(spec, plan.plan_id, factory, run_id="converge")
            assert target_hashes(conn, DAYS8) == new
            rows = all_target_rows(conn)
            assert len(rows) == len({r[1] for r in rows})
    finally:
        server.cleanup()
