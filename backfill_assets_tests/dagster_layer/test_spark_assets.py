"""A Spark spec in the Dagster layer: the same assets, checks, approval gate and source sensor,
with the session from the code location's Spark resource, a Parquet source pinned by its files
and a Parquet folder target."""

from __future__ import annotations

import datetime as dt

import dagster as dg

from backfill_assets.core.supports import SUPPORTS
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource, engine_resource_class
from backfill_assets_tests.support.duck_lakes import COLUMNS, newest, source_table
from backfill_assets_tests.support.gate import approve_config, previewed
from backfill_assets_tests.support.spark_lakes import spark_spec, target_rows, write_parquet_source

# The Spark resource, as the engine declares it in its folder (core/engines/spark/supports.toml).
SPARK_RESOURCE = SUPPORTS["spark"].resource["key"]
SparkResource = engine_resource_class("spark")
DAYS = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-03"}


def test_a_spark_spec_is_staged_checked_gated_applied_and_watched(spark, db_url, tmp_path):
    folder = tmp_path / "orders_raw"
    spec = spark_spec(tmp_path, write_parquet_source(folder))
    keys = {n: dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
    defs = build_definitions([spec])
    assert isinstance(defs.resources[SPARK_RESOURCE], SparkResource)
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL"),
                 SPARK_RESOURCE: SparkResource(master="local[2]")}
    instance = dg.DagsterInstance.ephemeral()
    assets = spec_assets(spec)
    kinds = {s.key: s.kinds for a in assets for s in (a.specs if isinstance(a, dg.AssetsDefinition) else [a])}
    assert all(kinds[keys[n]] == {"spark"} for n in ("snapshot", "stage_a", "stage_b"))

    def materialize(names, tags):
        return dg.materialize(assets, selection=[keys[n] for n in names], instance=instance,
                              resources=resources, tags=tags, raise_on_error=False)

    refused = materialize(["target"], DAYS)
    assert not refused.success and not (tmp_path / "orders_daily").exists()
    staged = materialize(["snapshot", "stage_a", "stage_b"], DAYS)
    assert staged.success
    checks = [e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"]
    assert len(checks) == 3 and all(e.passed for e in checks)
    again = dg.materialize(assets, selection=dg.AssetSelection.checks_for_assets(keys["stage_b"]), instance=instance,
                           resources=resources, tags=DAYS, raise_on_error=False)
    assert again.success and all(e.passed for e in again.get_asset_check_evaluations())
    plan_id = checks[0].metadata["plan_id"].value
    assert previewed(staged)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged),
        resources=resources, instance=instance, raise_on_error=False,
    )
    assert approved.success
    run = materialize(["target"], DAYS)
    assert run.success
    target_checks = [e for e in run.get_asset_check_evaluations() if e.check_name == "target_matches_approved_plan"]
    assert len(target_checks) == 3 and all(e.passed for e in target_checks)
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    # The source sensor: a file of 2024-01-02 rewritten restages that partition, and only it.
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")

    def tick():
        with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs) as context:
            return sensor.evaluate_tick(context).run_requests

    assert tick() == []
    (victim,) = (folder / "order_date=2024-01-02").glob("*.parquet")
    victim.write_bytes(next((folder / "order_date=2024-01-01").glob("*.parquet")).read_bytes())
    (request,) = tick()
    assert request.job_name == f"{spec.name}__build_stages" and request.partition_key == "2024-01-02"
