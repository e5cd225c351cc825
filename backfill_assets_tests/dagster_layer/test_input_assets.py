"""A spec with other inputs in the Dagster code location: each input is an asset upstream of the
snapshot beside the source; the stages step builds from all of them in one snapshot; a
dimension changed since is found by the source sensor, which restages the partitions it fed
and says which input moved. Real PostgreSQL, an ephemeral Dagster instance, public APIs."""

from __future__ import annotations

import dagster as dg

from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.inputs import INPUTS_SPEC, load_inputs
from backfill_assets_tests.support.source_writes import write

SPEC = spec_from_mapping({**INPUTS_SPEC, "partitions": {"type": "daily", "start": "2024-01-01", "end": "2024-01-05"}})
KEY = {n: dg.AssetKey(["orders_enriched", n]) for n in ("source", "input_customers", "input_payments", "snapshot",
                                                        "stage_a", "stage_b")}


def test_each_input_is_upstream_of_the_snapshot_and_a_moved_one_restages_what_it_fed(conn, db_url, factory):
    load_inputs(conn)
    defs = build_definitions([SPEC])
    graph = defs.resolve_asset_graph()
    assert graph.get(KEY["snapshot"]).parent_keys == {KEY["source"], KEY["input_customers"], KEY["input_payments"]}
    assert graph.get(KEY["input_customers"]).metadata["table"] == "public.customers"

    resources = {"pg_orders_enriched": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance = dg.DagsterInstance.ephemeral()
    staged = dg.materialize(spec_assets(SPEC), selection=[KEY[n] for n in ("snapshot", "stage_a", "stage_b")],
                            instance=instance, resources=resources, raise_on_error=False,
                            tags={RANGE_START: "2024-01-01", RANGE_END: "2024-01-03"})
    assert staged.success
    matched = {e.partition: e.passed for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"}
    assert matched == {"2024-01-01": True, "2024-01-02": True, "2024-01-03": True}
    snapshots = [m for m in staged.get_asset_materialization_events() if m.asset_key == KEY["snapshot"]]
    pinned = snapshots[-1].materialization.metadata["inputs"].value  # each input's pin, in the UI
    assert set(pinned) == {"customers", "payments"} and pinned["customers"]["row_count"] == 3

    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs) as context:
        first = sensor.evaluate_tick(context)
    assert first.run_requests == []
    write(factory, conn, "UPDATE public.customers SET region = 'east' WHERE customer_id = 12")
    with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs,
                                 cursor=first.cursor) as context:
        moved = sensor.evaluate_tick(context)
    (request,) = moved.run_requests
    assert request.job_name == "orders_enriched__build_stages"
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("2024-01-01", "2024-01-03")
