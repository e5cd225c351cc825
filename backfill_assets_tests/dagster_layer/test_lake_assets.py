"""A lake target in the Dagster layer: the same assets, checks and approval gate as for
PostgreSQL, with the target's kind and the lake table's version in its metadata."""

from __future__ import annotations

import dagster as dg
import pytest

from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.gate import approve_config, previewed
from backfill_assets_tests.support.lakes import Lake, expected_rows, lake_spec

WEEK = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-07"}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_lake_target_is_gated_replaced_checked_and_carries_its_version(unmoved_db, db_url, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    keys = {n: dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
    defs = build_definitions([spec])
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance = dg.DagsterInstance.ephemeral()
    assets = spec_assets(spec)
    kinds = {s.key: s.kinds for a in assets for s in (a.specs if isinstance(a, dg.AssetsDefinition) else [a])}
    assert kinds[keys["target"]] == {fmt}  # the source, snapshot and stages are PostgreSQL tables
    assert all(kinds[keys[n]] == {"postgres"} for n in ("snapshot", "stage_a", "stage_b"))

    def materialize(names, tags):
        return dg.materialize(assets, selection=[keys[n] for n in names], instance=instance,
                              resources=resources, tags=tags, raise_on_error=False)

    # Without an approval the gate refuses the target, and nothing is written to the lake.
    refused = materialize(["target"], WEEK)
    assert not refused.success
    assert Lake(fmt, spec, unmoved_db).table.open() is None
    staged = materialize(["snapshot", "stage_a", "stage_b"], WEEK)
    assert staged.success
    checks = [e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"]
    assert checks and all(e.passed for e in checks)
    plan_id = checks[0].metadata["plan_id"].value
    assert previewed(staged)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged),
        resources=resources, instance=instance, raise_on_error=False,
    )
    assert approved.success
    run = materialize(["target"], WEEK)
    assert run.success
    target = {m.partition: m.metadata for m in run.asset_materializations_for_node(f"{spec.name}__target")
              if m.asset_key == keys["target"]}
    assert target["2024-01-02"]["status"].value == "verified"
    assert target["2024-01-02"]["table_version"].value != target["2024-01-03"]["table_version"].value
    target_checks = [e for e in run.get_asset_check_evaluations() if e.check_name == "target_matches_approved_plan"]
    assert len(target_checks) == 7 and all(e.passed for e in target_checks)
    assert Lake(fmt, spec, unmoved_db).rows() == expected_rows(unmoved_db)
