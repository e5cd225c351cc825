"""approval_sensor on a fresh Dagster instance, and where the stages find their snapshot."""

from __future__ import annotations

import datetime as dt
import json

import dagster as dg
import pytest

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import APPROVAL_TAG, PLAN_TAG, RANGE_END, RANGE_START, UNLAUNCHABLE_JOB
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.source_writes import INDEX, NEXT_SEQ, settle, source_reads, write
from backfill_assets_tests.support.specs import make_spec

SPEC = make_spec()
WEEK = PartitionRequest("2024-01-01..2024-01-07")
KEYS = {n: dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b")}


@pytest.fixture
def resources(demo_db, db_url):
    return {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}


def approve(conn, factory, spec=SPEC, request=WEEK):
    """Plan and approve through the core, as the CLI does."""
    plan = make_plan(spec, request, factory)
    return plan, approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "alice")


def tick(defs, resources, cursor=None):
    sensor = defs.resolve_sensor_def("approval_sensor")
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources=resources,
                                 cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def test_a_fresh_instance_launches_only_the_approval_not_yet_applied(resources, demo_db, factory):
    plan, first = approve(demo_db, factory)
    apply_plan(SPEC, plan.plan_id, factory, run_id="cli-run")  # applied by the CLI, before any UI
    again, second = approve(demo_db, factory)  # the moved keys are home: another plan
    third = approve_plan(demo_db, factory, SPEC, find_plan(demo_db, SPEC, again.plan_id), "bob")
    assert again.plan_id != plan.plan_id and (first, second, third) == (1, 2, 3)
    result = tick(build_definitions([SPEC]), resources)
    # Approval 1 is applied, 2 is superseded by 3 (apply takes a plan's newest approval).
    assert [r.tags[APPROVAL_TAG] for r in result.run_requests] == ["3"]
    (request,) = result.run_requests
    assert request.job_name == "orders_daily__replace_target" and request.tags[PLAN_TAG] == again.plan_id
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("2024-01-01", "2024-01-08")
    assert json.loads(result.cursor) == {"orders_daily": 3}


def test_a_fresh_instance_after_the_cli_applied_everything_launches_nothing(resources, demo_db, factory):
    for _ in range(2):  # `make demo`: two plans, each approved and applied
        plan, _ = approve(demo_db, factory)
        apply_plan(SPEC, plan.plan_id, factory, run_id=f"cli-{plan.plan_id[:8]}")
    result = tick(build_definitions([SPEC]), resources)
    assert result.run_requests == [] and json.loads(result.cursor) == {"orders_daily": 2}


def test_an_approval_the_sensor_cannot_launch_is_a_failed_run_with_the_reason(resources, demo_db, factory):
    plan, approval_id = approve(demo_db, factory)  # 2024-01-01..08, planned by the CLI
    narrow = make_spec(partitions={"type": "daily", "start": "2024-01-01", "end": "2024-01-05"})
    defs = build_definitions([narrow])  # a code location whose partitions end on 2024-01-04
    result = tick(defs, resources)
    (request,) = result.run_requests
    assert request.job_name == UNLAUNCHABLE_JOB
    assert request.run_key == f"approval-orders_daily-{approval_id}-not-launched"
    assert request.tags.items() >= {PLAN_TAG: plan.plan_id, APPROVAL_TAG: str(approval_id)}.items()
    assert json.loads(result.cursor) == {"orders_daily": approval_id}  # later approvals are not held up
    instance = dg.DagsterInstance.ephemeral()
    run = defs.resolve_job_def(UNLAUNCHABLE_JOB).execute_in_process(
        run_config=request.run_config, instance=instance, tags=request.tags, raise_on_error=False)
    assert not run.success
    failure = run.failure_data_for_node("report_approval_not_launched").user_failure_data
    assert f"approval {approval_id} of plan {plan.plan_id[:16]}" in failure.description
    assert "2024-01-05, 2024-01-06, 2024-01-07, 2024-01-08 are outside the Dagster partitions" in failure.description
    (record,) = instance.get_run_records(dg.RunsFilter(tags={APPROVAL_TAG: str(approval_id)}))
    assert record.dagster_run.status == dg.DagsterRunStatus.FAILURE


def stages(resources, instance, partitions):
    tags = ({"dagster/partition": partitions[0]} if len(partitions) == 1
            else {RANGE_START: partitions[0], RANGE_END: partitions[-1]})
    return dg.materialize(spec_assets(SPEC), selection=[KEYS["stage_a"], KEYS["stage_b"]], instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def snapshot(resources, partitions):
    tags = ({"dagster/partition": partitions[0]} if len(partitions) == 1
            else {RANGE_START: partitions[0], RANGE_END: partitions[-1]})
    result = dg.materialize(spec_assets(SPEC), selection=[KEYS["snapshot"]], instance=dg.DagsterInstance.ephemeral(),
                            resources=resources, tags=tags)
    return result.asset_materializations_for_node("orders_daily__snapshot")[0].metadata["snapshot_id"].value


def built_from(result):
    return {m.metadata["snapshot_id"].value for m in result.asset_materializations_for_node("orders_daily__stages")}


WEEK7 = ["2024-01-01", "2024-01-07"]


def test_the_stages_find_their_snapshot_in_the_control_schema_not_in_dagsters_event_log(resources, demo_db):
    first = stages(resources, dg.DagsterInstance.ephemeral(), WEEK7)
    assert not first.success
    assert "partition 2024-01-01 has no snapshot yet" in first.failure_data_for_node(
        "orders_daily__stages").error.cause.message
    week = snapshot(resources, WEEK7)
    fresh = dg.DagsterInstance.ephemeral()  # has never seen a snapshot materialization
    assert built_from(stages(resources, fresh, WEEK7)) == {week}
    # The day alone again, with the same data: the week's snapshot still holds it as it is.
    assert snapshot(resources, ["2024-01-02"]) != week
    assert built_from(stages(resources, fresh, WEEK7)) == {week}
    # The day's source changes and only the day is snapshotted: the week was snapshotted separately.
    demo_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-02'")
    day = snapshot(resources, ["2024-01-02"])
    refused = stages(resources, fresh, WEEK7)
    assert not refused.success
    message = refused.failure_data_for_node("orders_daily__stages").error.cause.message
    assert "were snapshotted separately" in message and day in message and week in message
    assert built_from(stages(resources, fresh, ["2024-01-02"])) == {day}
    again = snapshot(resources, WEEK7)  # the week together again
    assert again not in (week, day) and built_from(stages(resources, fresh, WEEK7)) == {again}


# --- source_snapshot_sensor ----------------------------------------------------------------

WATCHING = make_spec(source={**SPEC.source.model_dump(), "change_column": "ingest_seq"})


def source_tick(resources, cursor=None, spec=WATCHING):
    defs = build_definitions([spec])
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources=resources,
                                 cursor=cursor, definitions=defs) as context:
        return sensor.evaluate_tick(context)


@pytest.fixture
def watched_week(db_url, conn, factory):
    """The demo source loaded on a connection that has exited (its inserts are counted; the
    test's ``conn`` only reads statistics), the index gate 2 reads, the week snapshotted
    through Dagster, and a first tick (every partition fingerprinted once, nothing changed).
    Returns the resources and the first tick's cursor."""
    from backfill_assets.cli import demo

    with factory() as loader:
        demo.load(loader)
    write(factory, conn, INDEX)
    resources = {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    snapshot(resources, WEEK7)
    first = source_tick(resources)
    assert first.run_requests == []
    return resources, first.cursor


def test_the_source_sensor_over_an_unchanged_source_reads_no_row_and_requests_nothing(conn, watched_week):
    resources, cursor = watched_week
    settle(conn)
    before = source_reads(conn)
    result = source_tick(resources, cursor)
    settle(conn)
    assert result.run_requests == [] and source_reads(conn) == before
    assert json.loads(result.cursor) == json.loads(cursor)  # nothing moved, nothing new to keep


def test_the_source_sensor_requests_the_stages_of_a_changed_partition_once(conn, factory, watched_week):
    resources, cursor = watched_week
    write(factory, conn, "UPDATE public.orders_raw SET note = 'changed', ingest_seq = " + NEXT_SEQ
          + " WHERE order_id = 738887002 AND status = 'placed'")
    result = source_tick(resources, cursor)
    (request,) = result.run_requests
    assert request.job_name == "orders_daily__build_stages" and request.partition_key == "2024-01-02"
    assert request.run_key.startswith("source-orders_daily-2024-01-02-2024-01-02-")
    again = source_tick(resources, result.cursor)
    assert again.run_requests == []  # reported once (its run key would dedupe it anyway)


def test_the_source_sensor_with_an_unreadable_cursor_checks_everything_again(conn, factory, watched_week):
    resources, _ = watched_week
    write(factory, conn, "DELETE FROM public.orders_raw WHERE order_id = 738891003 AND status = 'shipped'")
    for cursor in ("not json", json.dumps([1, 2]), json.dumps({"orders_daily": {"format": 0}})):
        result = source_tick(resources, cursor)
        assert [r.partition_key for r in result.run_requests] == ["2024-01-06"]
        assert json.loads(result.cursor)["orders_daily"]["format"] == 1


# --- approvals that expire, and a bounded first tick -------------------------------------------


def clocked_sensor(now):
    """The approval sensor of SPEC with its clock stopped at ``now``."""
    from backfill_assets.dagster_layer.names import target_job_name
    from backfill_assets.dagster_layer.sensors import approval_sensor

    defs = build_definitions([SPEC])
    jobs = [defs.resolve_job_def(target_job_name(SPEC)), defs.resolve_job_def(UNLAUNCHABLE_JOB)]
    return approval_sensor([SPEC], jobs, clock=lambda: now)


def clocked_tick(sensor, resources, cursor=None):
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources=resources,
                                 cursor=cursor) as context:
        return sensor.evaluate_tick(context)


def test_a_fresh_instance_reads_only_unexpired_approvals_at_most_a_hundred_a_tick(db_url, conn, capfd):
    """250 approvals, 61 of them expired (the oldest 60, and one given out of order among the
    others): the first tick of a fresh instance reads 100 approvals not yet expired, the next
    the remaining 89, the third none; the expired ones are neither launched nor read."""
    from backfill_assets.core.context import utc_now
    from backfill_assets_tests.support.approvals import synthetic_approvals

    now = utc_now()
    times = [now - dt.timedelta(days=30) + dt.timedelta(minutes=n) for n in range(60)]
    times += [now - dt.timedelta(days=6) + dt.timedelta(minutes=n) for n in range(190)]
    times[119] = now - dt.timedelta(days=20)  # approval 120, given out of order: expired
    synthetic_approvals(conn, SPEC.name, times, ["2024-01-01", "2024-01-02"])
    resources = {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    sensor = clocked_sensor(now)
    unexpired = [n for n in range(61, 251) if n != 120]
    first = clocked_tick(sensor, resources)
    assert [int(r.tags[APPROVAL_TAG]) for r in first.run_requests] == unexpired[:100]
    assert {r.job_name for r in first.run_requests} == {"orders_daily__replace_target"}
    assert json.loads(first.cursor) == {"orders_daily": unexpired[99]}
    log = capfd.readouterr().err
    assert "orders_daily: no cursor yet: reading only approvals given after" in log
    assert f"read 100 approvals, the most one tick reads; the next tick goes on after approval {unexpired[99]}" in log
    second = clocked_tick(sensor, resources, first.cursor)
    assert [int(r.tags[APPROVAL_TAG]) for r in second.run_requests] == unexpired[100:]
    assert json.loads(second.cursor) == {"orders_daily": 250}
    third = clocked_tick(sensor, resources, second.cursor)
    assert third.run_requests == [] and json.loads(third.cursor) == {"orders_daily": 250}
    assert "expired" not in capfd.readouterr().err  # the expired approvals were not even read


def test_an_approval_that_expired_before_the_sensor_saw_it_is_a_failed_run_saying_so(
        resources, demo_db, factory, capfd):
    """The sensor was stopped while an approval was given and expired: the next tick (the
    instance has a cursor) does not launch it, says 'expired' in its log, and reports it as a
    failed run of approval_not_launched, as it reports every approval it cannot launch. A fresh
    instance does not read it at all."""
    from backfill_assets.core.context import utc_now

    given = utc_now() - dt.timedelta(days=8)
    plan = make_plan(SPEC, WEEK, factory)
    approval_id = approve_plan(demo_db, factory, SPEC, find_plan(demo_db, SPEC, plan.plan_id), "alice",
                               clock=lambda: given)
    defs = build_definitions([SPEC])
    result = tick(defs, resources, cursor=json.dumps({"orders_daily": 0}))
    (request,) = result.run_requests
    assert request.job_name == UNLAUNCHABLE_JOB
    assert request.run_key == f"approval-orders_daily-{approval_id}-not-launched"
    assert json.loads(result.cursor) == {"orders_daily": approval_id}
    assert f"approval {approval_id} of plan {plan.plan_id[:16]} expired; not launched: it expired at" in (
        capfd.readouterr().err)
    run = defs.resolve_job_def(UNLAUNCHABLE_JOB).execute_in_process(
        run_config=request.run_config, instance=dg.DagsterInstance.ephemeral(), tags=request.tags,
        raise_on_error=False)
    failure = run.failure_data_for_node("report_approval_not_launched").user_failure_data
    assert failure.description.startswith(f"approval {approval_id} of plan {plan.plan_id[:16]} (orders_daily) "
                                          "was not launched: it expired at ")
    assert "approval_expires_after: 7d); review the plan and approve the plan again" in failure.description
    fresh = tick(defs, resources)
    assert fresh.run_requests == [] and json.loads(fresh.cursor) == {}


def test_a_target_run_launched_in_time_that_starts_after_the_expiry_is_refused(resources, demo_db, factory):
    """The sensor launched the approval in time; the run started after the approval expired
    (it waited in the queue): the target run refuses it, writing nothing."""
    from backfill_assets.core.context import utc_now
    from backfill_assets.dagster_layer.assets import spec_assets
    from backfill_assets_tests.support.flows import ledger_rows, target_day_hashes

    given = utc_now() - dt.timedelta(days=8)
    plan = make_plan(SPEC, WEEK, factory)
    approve_plan(demo_db, factory, SPEC, find_plan(demo_db, SPEC, plan.plan_id), "alice", clock=lambda: given)
    (request,) = clocked_tick(clocked_sensor(given + dt.timedelta(hours=1)), resources).run_requests
    assert request.job_name == "orders_daily__replace_target"
    before = target_day_hashes(demo_db)
    target = dg.AssetKey(["orders_daily", "target"])
    run = dg.materialize(spec_assets(SPEC), selection=[target], instance=dg.DagsterInstance.ephemeral(),
                         resources=resources, tags=request.tags, raise_on_error=False)
    assert not run.success
    error = run.failure_data_for_node("orders_daily__target").error.cause.message
    assert f"approval 1 of plan {plan.plan_id[:16]} (by alice at " in error
    assert "Nothing was written." in error and "approve the plan again" in error
    checks = [e for e in run.get_asset_check_evaluations() if e.check_name == "target_matches_approved_plan"]
    assert checks and not any(e.passed for e in checks)
    assert target_day_hashes(demo_db) == before and ledger_rows(demo_db) == 0
