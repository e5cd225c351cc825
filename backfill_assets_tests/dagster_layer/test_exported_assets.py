"""The Dagster layer with `snapshot: exported` (the default): the stages step takes the
snapshot and builds from it in one step, materializing the snapshot with both stages; the
gate, the target and the source sensor work as with a copy. Real PostgreSQL, an ephemeral
Dagster instance."""

from __future__ import annotations

import dagster as dg
import pytest

from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.flows import target_hashes
from backfill_assets_tests.support.gate import approve_config
from backfill_assets_tests.support.specs import make_spec

pytestmark = [pytest.mark.postgres, pytest.mark.dagster]

SPEC = make_spec(records_can_move=False, source={"table": "public.orders_raw"})
KEYS = {n: dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
WEEK = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-07"}


@pytest.fixture
def env(unmoved_db, db_url):
    defs = build_definitions([SPEC])
    resources = {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    return defs, resources, dg.DagsterInstance.ephemeral()


def materialize(env, names, tags):
    _, resources, instance = env
    return dg.materialize(spec_assets(SPEC), selection=[KEYS[n] for n in names], instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def test_one_step_takes_the_snapshot_builds_both_stages_and_materializes_all_three(env, unmoved_db):
    defs, _, _ = env
    nodes = {node.name for node in defs.resolve_job_def("orders_daily__build_stages").graph.node_defs}
    assert nodes == {"orders_daily__stages"}  # no snapshot step of its own
    result = materialize(env, ["snapshot", "stage_a", "stage_b"], WEEK)
    assert result.success
    snaps = {m.partition: m.metadata for m in result.asset_materializations_for_node("orders_daily__stages")
             if m.asset_key == KEYS["snapshot"]}
    assert sorted(snaps) == [f"2024-01-0{d}" for d in range(1, 8)]
    assert {m["mode"].value for m in snaps.values()} == {"exported"}
    matched = {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == "stages_match"}
    assert len(matched) == 7 and all(e.passed for e in matched.values())
    stage_a = [m.metadata for m in result.asset_materializations_for_node("orders_daily__stages")
               if m.asset_key == KEYS["stage_a"]]
    assert {m["snapshot_id"].value for m in stage_a} == {m["snapshot_id"].value for m in snaps.values()}


def test_the_snapshot_alone_is_refused_naming_what_to_select(env):
    result = materialize(env, ["snapshot"], WEEK)
    assert not result.success
    assert "select both stages with it" in str(result.get_step_failure_events()[0].event_specific_data.error)


def test_approve_then_the_target_verifies_and_the_sensor_restages_a_moved_source(env, unmoved_db):
    defs, resources, instance = env
    staged = materialize(env, ["snapshot", "stage_a", "stage_b"], WEEK)
    assert staged.success
    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged), resources=resources, instance=instance, raise_on_error=False)
    assert approved.success
    run = materialize(env, ["target"], WEEK)
    assert run.success
    verified = {m.partition: m.metadata for m in run.asset_materializations_for_node("orders_daily__target")}
    assert {m["status"].value for m in verified.values()} == {"verified"}
    assert target_hashes(unmoved_db) == {k: v["content_hash"].value for k, v in verified.items()}
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        assert sensor.evaluate_tick(context).run_requests == []
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date IN ('2024-01-03', '2024-01-04')")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        (request,) = sensor.evaluate_tick(context).run_requests
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("2024-01-03", "2024-01-04")
