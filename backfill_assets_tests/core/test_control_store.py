"""A control store of its own (``control_database_url_env``): plans, approvals, the ledger and
the runs' locks live there, and the data database keeps the source, the snapshot, the stages
and the target. Two real databases on one server; the whole process through the core, the
command line (the Dagster layer: dagster_layer/test_control_store.py)."""

from __future__ import annotations

import json

import psycopg
import pytest

from backfill_assets.cli import demo
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.context import spec_lock
from backfill_assets.core.diff import diff_plan
from backfill_assets.core.errors import ConcurrentRunError
from backfill_assets.core.pg.db import DatabaseUrl, connect, connection_factory
from backfill_assets.core.plan import make_plan
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, PartitionRequest
from backfill_assets_tests.support.cli_runs import run as cli
from backfill_assets_tests.support.cli_runs import write_spec
from backfill_assets_tests.support.flows import approved, control_rows, expected_hash, newest_wins, run, target_hashes
from backfill_assets_tests.support.lakes import Lake, expected_rows, lake_spec
from backfill_assets_tests.support.specs import CONTROL_URL_ENV, URL_ENV, make_spec

ROLES = {  # the control schema's tables, by the role whose rows they hold
    "control": ("plans", "approvals", "ledger"),
    "data": ("snapshot_copies", "stage_builds"),
}


def _spec(**changes):
    return make_spec(records_can_move=False, control_database_url_env=CONTROL_URL_ENV, **changes)


@pytest.fixture
def control(control_db_url: DatabaseUrl, db_url: DatabaseUrl, monkeypatch):
    """The control store's connection, with both variables exported as a user would."""
    monkeypatch.setenv(URL_ENV, db_url.reveal())
    monkeypatch.setenv(CONTROL_URL_ENV, control_db_url.reveal())
    with connect(control_db_url, DEFAULT_LIMITS) as conn:
        yield conn


@pytest.fixture
def both(db_url: DatabaseUrl, control_db_url: DatabaseUrl):
    return connection_factory(db_url, DEFAULT_LIMITS, control_url=control_db_url)


def _tables(conn: psycopg.Connection) -> set[str]:
    return {r[0] for r in conn.execute(
        "SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = 'backfill_control' AND c.relkind = 'r'").fetchall()}


def test_each_role_keeps_its_rows_in_its_own_database_through_plan_approve_apply_and_a_rerun(
        unmoved_db, control, both):
    spec = _spec()
    plan = approved(unmoved_db, both, spec)
    first = run(spec, plan, both)
    assert {p["status"] for p in first.partitions} == {"verified"}
    expected = newest_wins(demo.source_rows(moved=False), per_day=True)
    assert target_hashes(unmoved_db) == {d.isoformat(): expected_hash(unmoved_db, expected.get(d, []))
                                         for d in demo.DEMO_DAYS}
    # The control store holds the plan (and the snapshot it refers to), the approval and the
    # ledger; none of them is in the data database, which holds the stages and snapshot copy.
    assert [control_rows(control, t) for t in ROLES["control"]] == [1, 1, len(plan.labels)]
    assert [control_rows(unmoved_db, t) for t in ROLES["control"]] == [0, 0, 0]
    assert control_rows(control, "snapshots") == 1 and [control_rows(control, t) for t in ROLES["data"]] == [0, 0]
    assert control_rows(unmoved_db, "stage_builds") == 2 * len(plan.labels) and control_rows(unmoved_db, "snapshot_copies") == 1
    assert not any(t.startswith(("orders_daily__stage", "snap_")) for t in _tables(control))
    assert {"orders_daily__stage_a", "orders_daily__stage_b"} <= _tables(unmoved_db)
    # A rerun judges the approval against the control store's ledger: nothing left to write.
    again = run(spec, plan, both)
    assert {p["status"] for p in again.partitions} == {"skipped-already-verified"}
    assert control_rows(control, "ledger") == 2 * len(plan.labels) and control_rows(unmoved_db, "ledger") == 0
    # diff finds the plan in the control store and compares stage and target in the data.
    assert {d.changed + d.added + d.removed for d in diff_plan(spec, plan.plan_id, both).partitions} == {0}


def test_the_runs_lock_is_taken_in_the_control_store(unmoved_db, control, both):
    spec = _spec()
    with spec_lock(unmoved_db, spec):  # the same lock in the data database keeps nothing out
        plan = make_plan(spec, PartitionRequest("2024-01-02"), both)
    assert plan.status == "ready"
    with spec_lock(control, spec), pytest.raises(ConcurrentRunError, match="orders_daily"):
        make_plan(spec, PartitionRequest("2024-01-02"), both)
    with spec_lock(control, spec), pytest.raises(ConcurrentRunError):
        apply_plan(spec, plan.plan_id, both, run_id="held")
    assert control_rows(control, "ledger") == 0


def test_the_command_line_reads_both_variables_and_status_reads_the_control_store(unmoved_db, control, tmp_path,
                                                                                    capsys):
    path = str(write_spec(tmp_path, records_can_move=False, control_database_url_env=CONTROL_URL_ENV))
    code, out, _ = cli(capsys, "plan", "--spec", path, "--partitions", "2024-01-02..2024-01-03", "--json")
    plan_id = json.loads(out)["plan_id"]
    assert code == 0 and control_rows(control, "plans") == 1 and control_rows(unmoved_db, "plans") == 0
    assert cli(capsys, "approve", "--spec", path, "--plan", plan_id, "--by", "carol", "--yes")[0] == 0
    assert cli(capsys, "apply", "--spec", path, "--plan", plan_id)[0] == 0
    code, out, _ = cli(capsys, "status", "--spec", path, "--json")
    assert code == 0 and {p["status"] for p in json.loads(out)["partitions"]} == {"verified"}
    assert control_rows(unmoved_db, "ledger") == 0 and control_rows(control, "ledger") == 2


def test_read_only_commands_need_no_control_variable(unmoved_db, db_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(URL_ENV, db_url.reveal())
    monkeypatch.delenv(CONTROL_URL_ENV, raising=False)
    path = str(write_spec(tmp_path, records_can_move=False, control_database_url_env=CONTROL_URL_ENV))
    assert cli(capsys, "inspect", "--spec", path)[0] == 0


def test_an_unset_control_variable_is_a_clear_error_before_anything_is_written(unmoved_db, db_url, tmp_path,
                                                                                capsys, monkeypatch):
    monkeypatch.setenv(URL_ENV, db_url.reveal())
    monkeypatch.delenv(CONTROL_URL_ENV, raising=False)
    path = str(write_spec(tmp_path, records_can_move=False, control_database_url_env=CONTROL_URL_ENV))
    code, _, err = cli(capsys, "plan", "--spec", path, "--partitions", "2024-01-02")
    assert code != 0 and f"environment variable {CONTROL_URL_ENV} is not set" in err
    assert "backfill_control" not in {r[0] for r in unmoved_db.execute("SELECT nspname FROM pg_namespace")}


def test_without_a_control_variable_the_control_store_is_the_data_connection_itself(factory):
    assert not factory.separate
    with factory() as data, factory.control(data) as store:
        assert store is data


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_lake_target_with_a_control_store_of_its_own(unmoved_db, control, both, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path, control_database_url_env=CONTROL_URL_ENV)
    plan = approved(unmoved_db, both, spec, PartitionRequest("2024-01-02..2024-01-03"))
    assert {p["status"] for p in run(spec, plan, both).partitions} == {"verified"}
    assert Lake(fmt, spec, unmoved_db).rows() == [r for r in expected_rows(unmoved_db)
                                                  if r[0].isoformat() in ("2024-01-02", "2024-01-03")]
    assert [control_rows(control, t) for t in ROLES["control"]] == [1, 1, 2]
    assert [control_rows(unmoved_db, t) for t in ROLES["control"]] == [0, 0, 0]


def test_a_wait_on_the_control_store_ends_in_its_lock_timeout_and_names_what_holds_it(
        unmoved_db, control, control_db_url, both, tmp_path, capsys):
    spec = _spec(lock_timeout_ms=200)
    plan = approved(unmoved_db, both, spec, PartitionRequest("2024-01-02"))
    path = str(write_spec(tmp_path, records_can_move=False, control_database_url_env=CONTROL_URL_ENV,
                          lock_timeout_ms=200))
    with connect(control_db_url, DEFAULT_LIMITS) as holder, holder.transaction():
        holder.execute("LOCK TABLE backfill_control.plans IN ACCESS EXCLUSIVE MODE")
        pid = holder.info.backend_pid
        code, _, err = cli(capsys, "apply", "--spec", path, "--plan", plan.plan_id)
    assert code == 8, err
    assert f"backfill_control.plans (ACCESS EXCLUSIVE lock held by server process {pid})" in err
    assert "it is safe to retry" in err and control_rows(control, "ledger") == 0
