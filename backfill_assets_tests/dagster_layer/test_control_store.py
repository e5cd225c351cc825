"""The Dagster layer with a control store of its own: the resource reads both variables
through dagster.EnvVar when a run starts, and the stages, the approval gate and the target
keep each role's rows in its own database."""

from __future__ import annotations

import dagster as dg

from backfill_assets.core.pg.db import connect
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import resource_for
from backfill_assets_tests.support.flows import control_rows
from backfill_assets_tests.support.gate import approve_config, previewed
from backfill_assets_tests.support.specs import CONTROL_URL_ENV, URL_ENV, make_spec

DAYS = {RANGE_START: "2024-01-02", RANGE_END: "2024-01-03"}


def test_stages_gate_and_target_keep_plans_approvals_and_ledger_in_the_control_database(
        unmoved_db, db_url, control_db_url, monkeypatch):
    monkeypatch.setenv(URL_ENV, db_url.reveal())
    monkeypatch.setenv(CONTROL_URL_ENV, control_db_url.reveal())
    spec = make_spec(records_can_move=False, control_database_url_env=CONTROL_URL_ENV)
    keys = {n: dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
    resources = {f"pg_{spec.name}": resource_for(spec)}  # dagster.EnvVar, read when the run starts
    instance = dg.DagsterInstance.ephemeral()
    assets = spec_assets(spec)

    def materialize(names):
        return dg.materialize(assets, selection=[keys[n] for n in names], instance=instance,
                              resources=resources, tags=DAYS, raise_on_error=False)

    staged = materialize(["snapshot", "stage_a", "stage_b"])
    assert staged.success
    plan_id = next(e for e in staged.get_asset_check_evaluations()
                   if e.check_name == "stages_match").metadata["plan_id"].value
    assert previewed(staged)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    gate = build_definitions([spec]).resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged),
        resources=resources, instance=instance, raise_on_error=False,
    )
    assert gate.success
    applied = materialize(["target"])
    assert applied.success
    with connect(control_db_url, DEFAULT_LIMITS) as control:
        assert [control_rows(control, t) for t in ("plans", "approvals", "ledger")] == [1, 1, 2]
        assert control_rows(control, "stage_builds") == 0
    assert [control_rows(unmoved_db, t) for t in ("plans", "approvals", "ledger")] == [0, 0, 0]
    assert control_rows(unmoved_db, "stage_builds") == 4
