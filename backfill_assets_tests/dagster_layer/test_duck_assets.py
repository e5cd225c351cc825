"""A DuckDB spec in the Dagster layer: the same assets, checks and approval gate, with the
source, snapshot and stages in DuckDB and the Delta source pinned at its version."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pyarrow as pa

from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.duck_lakes import COLUMNS, delta_rows, duck_spec, newest, source_table, write_delta
from backfill_assets_tests.support.gate import approve_config, previewed

DAYS = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-03"}


def test_a_duckdb_spec_is_staged_checked_gated_and_applied(db_url, tmp_path):
    write_delta(tmp_path / "orders_raw", source_table())
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")})
    keys = {n: dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
    defs = build_definitions([spec])
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance = dg.DagsterInstance.ephemeral()
    assets = spec_assets(spec)
    kinds = {s.key: s.kinds for a in assets for s in (a.specs if isinstance(a, dg.AssetsDefinition) else [a])}
    assert all(kinds[keys[n]] == {"duckdb"} for n in ("snapshot", "stage_a", "stage_b"))

    def materialize(names, tags):
        return dg.materialize(assets, selection=[keys[n] for n in names], instance=instance,
                              resources=resources, tags=tags, raise_on_error=False)

    refused = materialize(["target"], DAYS)
    assert not refused.success and not (tmp_path / "orders_daily").exists()
    staged = materialize(["snapshot", "stage_a", "stage_b"], DAYS)
    assert staged.success
    checks = [e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"]
    assert len(checks) == 3 and all(e.passed for e in checks)
    # The stage checks alone, evaluated again on the DuckDB stages as they are.
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
        assert delta_rows(tmp_path / "orders_daily", day) == newest(rows, day)


def _source_tick(defs, resources, cursor=None):
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources=resources,
                                 definitions=defs, cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def test_the_source_sensor_restages_the_partitions_whose_lake_files_changed(db_url, tmp_path):
    from deltalake import DeltaTable, write_deltalake

    from backfill_assets.core.lake.delta import delta_predicate
    write_delta(tmp_path / "orders_raw", source_table())
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")})
    defs = build_definitions([spec])
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    keys = [dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b")]
    staged = dg.materialize(spec_assets(spec), selection=keys, instance=dg.DagsterInstance.ephemeral(),
                            resources=resources, tags=DAYS, raise_on_error=False)
    assert staged.success
    assert _source_tick(defs, resources).run_requests == []
    # Another writer replaces 2024-01-02 of the source: its stages are requested, and only its.
    day = source_table().filter(pa.compute.equal(source_table()["order_date"], pa.scalar(dt.date(2024, 1, 2))))
    write_deltalake(DeltaTable(str(tmp_path / "orders_raw")), day, mode="overwrite",
                    predicate=delta_predicate("order_date", [dt.date(2024, 1, 2)]))
    first = _source_tick(defs, resources)
    (request,) = first.run_requests
    assert request.job_name == f"{spec.name}__build_stages" and request.partition_key == "2024-01-02"
    # Requested once: the next tick, with the cursor, requests nothing for the same change.
    assert _source_tick(defs, resources, first.cursor).run_requests == []
    # Without the cursor (reset in the UI) it is requested again, under the same run key.
    assert [r.run_key for r in _source_tick(defs, resources).run_requests] == [request.run_key]
    # Another change of the same day is a new request.
    write_deltalake(DeltaTable(str(tmp_path / "orders_raw")), day.slice(0, 3), mode="overwrite",
                    predicate=delta_predicate("order_date", [dt.date(2024, 1, 2)]))
    (changed_again,) = _source_tick(defs, resources, first.cursor).run_requests
    assert changed_again.partition_key == "2024-01-02" and changed_again.run_key != request.run_key


def test_a_tie_in_the_lake_source_fails_the_stages_and_plans_nothing(db_url, tmp_path):
    t = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rows = [(dt.date(2024, 1, 1), 1, 1, t, 5, None, "a", None), (dt.date(2024, 1, 1), 1, 1, t, 5, None, "b", None)]
    write_delta(tmp_path / "orders_raw", source_table(rows))
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")})
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    keys = [dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b")]
    run = dg.materialize(spec_assets(spec), selection=keys, instance=dg.DagsterInstance.ephemeral(),
                         resources=resources, tags={RANGE_START: "2024-01-01", RANGE_END: "2024-01-01"},
                         raise_on_error=False)
    assert not run.success
    failure = next(e for e in run.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    assert error.cause.cls_name == "TiedRowsError" and "tie on every ordering column" in error.cause.message
    assert not [e for e in run.get_asset_check_evaluations() if e.check_name == "stages_match"]


def test_moved_records_widen_the_stages_in_dagster_too(db_url, tmp_path):
    """records_can_move: the snapshot step closes the scope; the stages step, in its own run,
    builds it from the snapshot's record."""
    import decimal
    t0, t1 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2024, 1, 5, tzinfo=dt.timezone.utc)
    rows = [(dt.date(2024, 1, 1), 5, 1, t0, 1, decimal.Decimal("1.00"), "placed", None),
            (dt.date(2024, 1, 3), 5, 1, t1, 2, decimal.Decimal("1.00"), "re-dated", None)]
    write_delta(tmp_path / "orders_raw", source_table(rows))
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")}, records_can_move=True)
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance, assets = dg.DagsterInstance.ephemeral(), spec_assets(spec)
    one_day = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-01"}
    snap = dg.materialize(assets, selection=[dg.AssetKey([spec.name, "snapshot"])], instance=instance,
                          resources=resources, tags=one_day, raise_on_error=False)
    assert snap.success
    staged = dg.materialize(assets, selection=[dg.AssetKey([spec.name, n]) for n in ("stage_a", "stage_b")],
                            instance=instance, resources=resources, tags=one_day, raise_on_error=False)
    assert staged.success
    checks = {e.partition for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"}
    assert checks == {"2024-01-01", "2024-01-03"}  # the partition the moved key enters is built too


def test_the_gate_refuses_a_plan_whose_pinned_version_was_vacuumed(db_url, tmp_path):
    from deltalake import DeltaTable
    write_delta(tmp_path / "orders_raw", source_table())
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")})
    defs = build_definitions([spec])
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance = dg.DagsterInstance.ephemeral()
    staged = dg.materialize(spec_assets(spec), selection=[dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b")],
                            instance=instance, resources=resources, tags=DAYS, raise_on_error=False)
    plan_id = next(e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match").metadata["plan_id"].value
    assert previewed(staged)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    write_delta(tmp_path / "orders_raw", source_table())  # a new version ...
    DeltaTable(str(tmp_path / "orders_raw")).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged),
        resources=resources, instance=instance, raise_on_error=False,
    )
    assert not approved.success
    failure = next(e for e in approved.all_events if e.event_type_value == "STEP_FAILURE")
    error = failure.event_specific_data.error
    message = error.cause.message if error.cause is not None else error.message
    assert "can no longer be read" in message and "plan again" in message
    refused = dg.materialize(spec_assets(spec), selection=[dg.AssetKey([spec.name, "target"])], instance=instance,
                             resources=resources, tags=DAYS, raise_on_error=False)
    assert not refused.success and not (tmp_path / "orders_daily").exists()


def test_a_duckdb_spec_of_cron_windows_from_delta_is_staged_gated_applied_and_watched(db_url, tmp_path):
    """Hours from minute 30 of New York (`cron: 30 * * * *`) over the fall-back day, read from a
    Delta source and written to a Delta table, in Dagster: each window checked, approved and
    replaced; then a late row restages its window alone."""
    from deltalake import write_deltalake

    from backfill_assets.core.spec import spec_from_mapping
    from backfill_assets_tests.support.windows import EVENTS_SPEC, FALL, events_table

    def rows(found):  # the NULL-key row would be alone in its window (02:30-03:30 EST): left out
        return events_table([r for r in found if r[0] is not None])

    write_deltalake(str(tmp_path / "events_raw"), rows(FALL))
    spec = spec_from_mapping({
        **EVENTS_SPEC, "engine": {"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
        "source": {"format": "delta", "location": str(tmp_path / "events_raw")},
        "target": {"format": "delta", "location": str(tmp_path / "events")},
        "partition_window": {"cron": "30 * * * *", "time_zone": "America/New_York"},
        "partitions": {"type": "window", "start": "2024-11-03", "end": "2024-11-04"}})
    keys = {n: dg.AssetKey([spec.name, n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
    defs = build_definitions([spec])
    resources = {f"pg_{spec.name}": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    instance = dg.DagsterInstance.ephemeral()
    day = {RANGE_START: "2024-11-03T00:30-0400", RANGE_END: "2024-11-03T23:30-0500"}

    def materialize(names, tags):
        return dg.materialize(spec_assets(spec), selection=[keys[n] for n in names], instance=instance,
                              resources=resources, tags=tags, raise_on_error=False)

    staged = materialize(["snapshot", "stage_a", "stage_b"], day)
    assert staged.success
    checks = {e.partition: e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"}
    assert len(checks) == 25 and all(e.passed for e in checks.values())
    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged), resources=resources, instance=instance, raise_on_error=False)
    assert approved.success
    run = materialize(["target"], day)
    assert run.success
    verified = [e for e in run.get_asset_check_evaluations() if e.check_name == "target_matches_approved_plan"]
    assert len(verified) == 25 and all(e.passed for e in verified)

    late = [(8, dt.datetime(2024, 11, 3, 9, 45, tzinfo=dt.timezone.utc), dt.datetime(2024, 11, 6, tzinfo=dt.timezone.utc),
             1, "12.00", "late")]
    write_deltalake(str(tmp_path / "events_raw"), rows(late), mode="append")
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs) as context:
        (request,) = sensor.evaluate_tick(context).run_requests
    assert request.partition_key == "2024-11-03T04:30-0500"  # that window alone, of the 25 verified
