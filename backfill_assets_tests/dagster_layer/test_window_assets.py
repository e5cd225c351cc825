"""Time windows in the Dagster code location: the partitions of a window spec are its windows,
keyed by their labels in its zone (Dagster's own time-window partitions); a range of hours over
the night New York's clocks fall back is staged, checked, previewed, approved and replaced as
one backfill, the approval sensor launching exactly those windows. Real PostgreSQL, an ephemeral
Dagster instance, public APIs."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.windows import GRAINS, UTC, windows_between, zone
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import PLAN_TAG, RANGE_END, RANGE_START
from backfill_assets.dagster_layer.partitions import partitions_def
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.gate import approve_config, previewed
from backfill_assets_tests.support.windows import EVENTS_SPEC, FALL, create_events

WINDOW_SPEC = EVENTS_SPEC
SPEC = spec_from_mapping(WINDOW_SPEC)
KEYS = {n: dg.AssetKey(["events_hourly", n]) for n in ("snapshot", "stage_a", "stage_b", "target")}


@pytest.mark.parametrize("grain", GRAINS)
@pytest.mark.parametrize("zone_name", ["America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Sydney", "UTC"])
def test_the_dagster_keys_of_a_window_spec_are_the_labels_of_its_windows(grain, zone_name):
    """Over two years with every daylight-saving change in them, Dagster's partitions of the
    spec's windows are core.windows' windows: the same keys, the same instants."""
    start, end = (dt.date(2023, 1, 1), dt.date(2025, 1, 1)) if grain != "hour" else (dt.date(2024, 3, 1), dt.date(2024, 4, 15))
    spec = spec_from_mapping({**WINDOW_SPEC, "partition_window": {"every": grain, "time_zone": zone_name},
                              "partitions": {"type": "window", "start": start.isoformat(), "end": end.isoformat()}})
    parts = partitions_def(spec)
    tz = zone(zone_name)
    ours = windows_between(dt.datetime.combine(start, dt.time(), tz).astimezone(UTC),
                           dt.datetime.combine(end, dt.time(), tz).astimezone(UTC), grain, tz)
    keys = parts.get_partition_keys()
    assert keys == [w.label for w in ours]
    for w in ours[:: max(1, len(ours) // 50)]:
        span = parts.time_window_for_partition_key(w.label)
        assert (span.start.astimezone(UTC), span.end.astimezone(UTC)) == (w.start, w.end)


@pytest.mark.parametrize("cron", ["15 * * * *", "30 6 * * *", "30 1 * * *", "0 2 * * *", "45 23 * * *",
                                  "0 6 * * 0", "30 2 * * 6", "0 6 15 * *", "30 1 1 * *"])
@pytest.mark.parametrize("zone_name", ["America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Sydney",
                                       "America/Santiago", "UTC"])
def test_the_dagster_keys_of_a_cron_window_spec_are_the_labels_of_its_windows(cron, zone_name):
    """Windows between the ticks of a cron schedule, over every daylight-saving change of two
    years (a day from 01:30 or 02:00 where the clocks skip or repeat it): Dagster's partitions
    and core.windows' are the same keys and the same instants."""
    hourly = cron.split()[1] == "*"
    start, end = (dt.date(2024, 3, 1), dt.date(2024, 4, 15)) if hourly else (dt.date(2023, 1, 1), dt.date(2025, 1, 1))
    spec = spec_from_mapping({**WINDOW_SPEC, "partition_window": {"cron": cron, "time_zone": zone_name},
                              "partitions": {"type": "window", "start": start.isoformat(), "end": end.isoformat()}})
    window = spec.partition_window
    assert window is not None and window.every is not None
    parts = partitions_def(spec)
    tz = zone(zone_name)
    ours = windows_between(dt.datetime.combine(start, dt.time(), tz).astimezone(UTC),
                           dt.datetime.combine(end, dt.time(), tz).astimezone(UTC), window.every, tz, window.offset)
    keys = parts.get_partition_keys()
    assert keys == [w.label for w in ours]
    for w in ours:
        span = parts.time_window_for_partition_key(w.label)
        assert (span.start.astimezone(UTC), span.end.astimezone(UTC)) == (w.start, w.end), w.label


def test_a_window_spec_keys_its_dagster_partitions_by_its_windows_or_is_refused():
    with pytest.raises(SpecError, match="write `partitions: {type: window, start: <date>}`"):
        spec_from_mapping({**WINDOW_SPEC, "partitions": {"type": "daily", "start": "2024-11-01"}})
    with pytest.raises(SpecError, match="partitions.type window needs partition_window"):
        spec_from_mapping({**WINDOW_SPEC, "partition_window": None, "partitions": {"type": "window", "start": "2024-11-01"}})


@pytest.fixture
def dagster_env(conn, db_url):
    create_events(conn, FALL)
    conn.execute("INSERT INTO public.events_hourly VALUES ('2024-11-03 06:30+00', 99, now(), 1, 1, 'stale')")
    defs = build_definitions([SPEC])
    resources = {"pg_events_hourly": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    return defs, resources, dg.DagsterInstance.ephemeral()


def _materialize(resources, instance, names, tags):
    return dg.materialize(spec_assets(SPEC), selection=[KEYS[n] for n in names], instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def test_a_week_of_hours_over_the_fall_back_is_one_backfill_checked_approved_replaced_and_watched(dagster_env, conn):
    """A week of New York's hours (169: the clocks fall back on the 3rd) as one backfill: each
    window staged, checked, approved and replaced on its own; then a row that lands late in one
    of them restages that window alone (no lookback to guess)."""
    defs, resources, instance = dagster_env
    week = {RANGE_START: "2024-11-01T00:00-0400", RANGE_END: "2024-11-07T23:00-0500"}
    staged = _materialize(resources, instance, ["snapshot", "stage_a", "stage_b"], week)
    assert staged.success
    matched = {e.partition: e for e in staged.get_asset_check_evaluations() if e.check_name == "stages_match"}
    assert len(matched) == 169 and all(e.passed for e in matched.values())  # one check per window
    assert {"2024-11-03T01:00-0400", "2024-11-03T01:00-0500"} <= set(matched)  # the repeated hour, twice
    plan_id = matched["2024-11-03T01:00-0500"].metadata["plan_id"].value
    assert previewed(staged)["plan_id"] == plan_id

    approved = defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(staged), resources=resources, instance=instance, raise_on_error=False)
    assert approved.success
    sensor = defs.resolve_sensor_def("approval_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        (request,) = sensor.evaluate_tick(context).run_requests
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == (week[RANGE_START], week[RANGE_END])
    assert request.tags[PLAN_TAG] == plan_id

    run = _materialize(resources, instance, ["target"], request.tags)
    assert run.success
    checks = {e.partition: e for e in run.get_asset_check_evaluations() if e.check_name == "target_matches_approved_plan"}
    assert len(checks) == 169 and all(e.passed for e in checks.values())
    assert checks["2024-11-03T01:00-0500"].metadata["status"].value == "verified"  # the stale row's window
    replaced = {m.partition for m in run.asset_materializations_for_node("events_hourly__target") if m.asset_key == KEYS["target"]}
    assert len(replaced) == 169
    assert conn.execute("SELECT count(*) FROM public.events_hourly WHERE event_id = 99").fetchone()[0] == 0

    source = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        assert source.evaluate_tick(context).run_requests == []
    conn.execute("INSERT INTO public.events_raw VALUES ('2024-11-01 13:40+00', 500, now(), 1, 2.50, 'late')")
    with dg.build_sensor_context(instance=instance, resources=resources, definitions=defs) as context:
        (late,) = source.evaluate_tick(context).run_requests
    assert late.job_name == "events_hourly__build_stages"
    assert late.partition_key == "2024-11-01T09:00-0400"  # that window alone, of the 169 verified
