"""Multi-run backfills (a spec's ``parallel``): Dagster's own run machinery builds several
partition groups at once within the spec's build pool, replaces the target one run at a time,
and a run of an approval refuses to start after an earlier run of it failed a partition."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from backfill_assets.core.approve import approve_plan
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import (
    APPROVAL_TAG,
    RANGE_END,
    RANGE_START,
    build_pool,
    pool_limits,
    replace_pool,
)
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets.render import render_plan
from backfill_assets_tests.support.dagster_server import dagster_deployment
from backfill_assets_tests.support.flows import target_day_hashes
from backfill_assets_tests.support.gate import approve_config
from backfill_assets_tests.support.runs import (
    HELD_LOCK_TIMEOUT_MS,
    latest_ledger,
    most_at_once,
    run_ranges,
    snapshots_held,
    wait_running,
    wait_runs,
)
from backfill_assets_tests.support.specs import DEMO_SPEC

PARALLEL_SPEC = {**{k: v for k, v in DEMO_SPEC.items() if k != "records_can_move"},
                 "parallel": {"max_partitions_per_run": 2, "max_concurrent_builds": 2},
                 "lock_timeout_ms": HELD_LOCK_TIMEOUT_MS}  # runs wait out held_until_running
SPEC = spec_from_mapping(PARALLEL_SPEC)
SIX = [f"2024-01-0{d}" for d in range(1, 7)]
KEYS = {n: dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
TARGET_CHECK = "target_matches_approved_plan"


def run_range(first: str, last: str) -> dict[str, str]:
    return {RANGE_START: first, RANGE_END: last}


@pytest.fixture
def resources(unmoved_db, db_url):
    return {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}


def materialize(resources, instance, names, tags):
    return dg.materialize(spec_assets(SPEC), selection=[KEYS[n] for n in names], instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def refuse_the_first_day(conn) -> None:
    """The target refuses the rows of 2024-01-01, as a full disk or a broken constraint would."""
    conn.execute(
        "CREATE FUNCTION public.refuse_day() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-01' THEN RAISE EXCEPTION 'the target refused the row'; END IF; "
        "RETURN NEW; END $$")
    conn.execute("CREATE TRIGGER refuse_day BEFORE INSERT ON public.orders_daily "
                 "FOR EACH ROW EXECUTE FUNCTION public.refuse_day()")


def test_snapshots_of_other_partitions_do_not_wait_on_each_other(unmoved_db, factory):
    """One build holds its snapshot transaction open; another, of other partitions, takes its
    own snapshot meanwhile (a lock held to the first one's commit would time it out)."""
    import threading

    from backfill_assets.core.plan import snapshot_step

    quick = spec_from_mapping({**PARALLEL_SPEC, "lock_timeout_ms": 1000})
    snapshot_step(quick, ["2024-01-05"], factory)  # the control schema exists, as after any first run
    inside, release = threading.Event(), threading.Event()

    def hold(event) -> None:  # called inside the first snapshot's transaction
        if event.status == "copied":
            inside.set()
            release.wait(30)

    first = threading.Thread(target=lambda: snapshot_step(quick, ["2024-01-01", "2024-01-02"], factory, progress=hold))
    first.start()
    try:
        assert inside.wait(30)
        started = time.monotonic()
        other = snapshot_step(quick, ["2024-01-03", "2024-01-04"], factory)
        assert other.snapshot_id and time.monotonic() - started < 5
    finally:
        release.set()
        first.join(30)


def test_a_run_of_an_approval_refuses_to_start_after_an_earlier_run_of_it_failed_a_partition(resources, unmoved_db):
    instance = dg.DagsterInstance.ephemeral()
    stages = materialize(resources, instance, ["snapshot", "stage_a", "stage_b"], run_range("2024-01-01", "2024-01-04"))
    assert stages.success
    plan_id = next(e.metadata["plan_id"].value for e in stages.get_asset_check_evaluations())
    approve = build_definitions([SPEC]).resolve_job_def("approve_backfill").execute_in_process(
        run_config=approve_config(stages),
        resources=resources, instance=instance)
    assert approve.success
    # Two runs of one approval, as a multi-run backfill of the target makes them: the first fails
    # its first partition.
    refuse_the_first_day(unmoved_db)
    first = materialize(resources, instance, ["target"], run_range("2024-01-01", "2024-01-02"))
    assert not first.success
    assert latest_ledger(unmoved_db, plan_id) == {"2024-01-01": "failed", "2024-01-02": "not-attempted"}
    before = target_day_hashes(unmoved_db)
    second = materialize(resources, instance, ["target"], run_range("2024-01-03", "2024-01-04"))
    assert not second.success
    error = second.failure_data_for_node("orders_daily__target").error.cause.message
    assert f"approval 1 of plan {plan_id[:16]} stopped after a failure: partition(s) 2024-01-01 (run dagster-" in error
    assert "the target refused the row" in error and "Nothing was written." in error
    checks = {e.partition: e for e in second.get_asset_check_evaluations() if e.check_name == TARGET_CHECK}
    assert sorted(checks) == ["2024-01-03", "2024-01-04"] and not any(c.passed for c in checks.values())
    assert checks["2024-01-03"].metadata["error"].value in error
    assert target_day_hashes(unmoved_db) == before
    assert set(latest_ledger(unmoved_db, plan_id)) == {"2024-01-01", "2024-01-02"}  # the second run wrote nothing
    # The cause fixed, the failed run again retries its partition first; then the rest follows.
    unmoved_db.execute("DROP TRIGGER refuse_day ON public.orders_daily")
    assert materialize(resources, instance, ["target"], run_range("2024-01-01", "2024-01-02")).success
    assert materialize(resources, instance, ["target"], run_range("2024-01-03", "2024-01-04")).success
    assert latest_ledger(unmoved_db, plan_id) == {d: "verified" for d in SIX[:4]}


def test_the_plan_says_apply_stops_launching_new_partitions_after_the_first_failure(resources, unmoved_db, factory):
    plan = make_plan(SPEC, PartitionRequest("2024-01-01..2024-01-02"), factory)
    text = render_plan(plan, SPEC.parallel)
    assert "runs of at most 2 partition(s), up to 2 building the stages at once" in text
    assert "Apply stops launching new partitions after the first failure" in text
    assert "Apply stops" not in render_plan(plan)  # one run: nothing to say


def test_a_multi_run_spec_refuses_to_build_on_an_instance_that_would_not_limit_its_pool(resources, tmp_path):
    with dg.DagsterInstance.local_temp(tempdir=str(tmp_path)) as instance:
        result = materialize(resources, instance, ["snapshot"], run_range("2024-01-01", "2024-01-02"))
        assert not result.success
        error = result.failure_data_for_node("orders_daily__snapshot").error.cause
        assert error.cls_name == "SpecError"
        assert ("the Dagster pool backfill_assets.orders_daily.build has no limit on this instance" in error.message
                and "`dagster instance concurrency set backfill_assets.orders_daily.build 2`" in error.message)
        instance.event_log_storage.set_concurrency_slots(build_pool(SPEC), 3)
        result = materialize(resources, instance, ["snapshot"], run_range("2024-01-01", "2024-01-02"))
        assert "is limited to 3" in result.failure_data_for_node("orders_daily__snapshot").error.cause.message
        instance.event_log_storage.set_concurrency_slots(build_pool(SPEC), 2)
        assert materialize(resources, instance, ["snapshot"], run_range("2024-01-01", "2024-01-02")).success
    assert pool_limits(SPEC) == {build_pool(SPEC): 2, replace_pool(SPEC): 1}


def test_the_approval_sensor_launches_an_approval_as_runs_of_at_most_max_partitions_per_run(resources, unmoved_db, factory):
    plan = make_plan(SPEC, PartitionRequest("2024-01-01..2024-01-05"), factory)
    approval_id = approve_plan(unmoved_db, factory, SPEC, find_plan(unmoved_db, SPEC, plan.plan_id), "alice")
    defs = build_definitions([SPEC])
    sensor = defs.resolve_sensor_def("approval_sensor")
    with dg.build_sensor_context(instance=dg.DagsterInstance.ephemeral(), resources=resources,
                                 definitions=defs) as context:
        requests = sensor.evaluate_tick(context).run_requests
    assert [(r.tags.get(RANGE_START), r.tags.get(RANGE_END), r.partition_key) for r in requests] == [
        ("2024-01-01", "2024-01-02", None), ("2024-01-03", "2024-01-04", None), (None, None, "2024-01-05")]
    assert {r.tags[APPROVAL_TAG] for r in requests} == {str(approval_id)}
    assert [r.run_key for r in requests] == [f"approval-orders_daily-{approval_id}-{n}" for n in range(3)]


@pytest.mark.slow
def test_a_multi_run_backfill_builds_groups_at_once_within_the_pool_and_replaces_one_run_at_a_time(
    admin_url, db_url, unmoved_db, factory, tmp_path,
):
    # The target is launched below as a backfill, by hand.
    with dagster_deployment(admin_url, db_url.reveal(), tmp_path, PARALLEL_SPEC,
                            stopped_sensors=("approval_sensor",)) as (gql, _):
        gql.set_pool_limit(build_pool(SPEC), 2)
        # The target's runs wait in the queue (their pool admits none yet) until the plan is
        # approved: both backfills are submitted at once, so the test waits for one tick of
        # Dagster's backfill daemon, not two.
        gql.set_pool_limit(replace_pool(SPEC), 0)
        # The first two build runs are held until both run: the pool's two at once are seen
        # however fast a run is.
        with snapshots_held(db_url.reveal()):
            stages = gql.launch_backfill([["orders_daily", n] for n in ("snapshot", "stage_a", "stage_b")], SIX)
            target = gql.launch_backfill([["orders_daily", "target"]], SIX)
            wait_running(gql, {"dagster/backfill": stages}, 2)
        # 1. Six days of stages: three runs of two days, two at a time.
        runs = wait_runs(gql, {"dagster/backfill": stages}, 3)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 3
        assert run_ranges(runs) == [("2024-01-01", "2024-01-02"), ("2024-01-03", "2024-01-04"), ("2024-01-05", "2024-01-06")]
        assert most_at_once(runs) == 2
        matched = gql.check_executions(["orders_daily", "stage_b"], "stages_match")
        assert sorted(matched) == SIX and all(e["evaluation"]["success"] for e in matched.values())
        held = wait_runs(gql, {"dagster/backfill": target}, 3, done=False)
        assert [r["status"] for r in held] == ["QUEUED"] * 3  # their pool admits none yet
        # 2. One plan of the six days, approved once; the target's three runs apply it, one at a time.
        plan = make_plan(SPEC, PartitionRequest("2024-01-01..2024-01-06"), factory)
        approve_plan(unmoved_db, factory, SPEC, find_plan(unmoved_db, SPEC, plan.plan_id), "e2e")
        gql.set_pool_limit(replace_pool(SPEC), 1)
        runs = wait_runs(gql, {"dagster/backfill": target}, 3)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 3 and most_at_once(runs) == 1
    assert latest_ledger(unmoved_db, plan.plan_id) == {d: "verified" for d in SIX}
    assert unmoved_db.execute("SELECT count(DISTINCT run_id) FROM backfill_control.ledger WHERE plan_id = %s",
                              (plan.plan_id,)).fetchone()[0] == 3
    hashes = target_day_hashes(unmoved_db)
    assert {d: hashes[d] for d in SIX} == {p.partition: p.stage_a.content_hash for p in plan.document.partitions}


def test_a_multi_run_duckdb_backfill_builds_its_runs_one_at_a_time_and_replaces_them_in_turn(
    admin_url, db_url, conn, factory, tmp_path,
):
    """engine duckdb with ``parallel``: a backfill of four days is two runs of two days; their
    builds go one after another (the build pool holds one, as the DuckDB file admits one
    writer), each run plans its own days, and the target's runs apply one plan of all four."""
    from backfill_assets_tests.support.duck_lakes import delta_source, duck_spec
    spec = duck_spec(tmp_path, delta_source(tmp_path), parallel={"max_partitions_per_run": 2,
                                                                 "max_concurrent_builds": 1})
    mapping = spec.model_dump(mode="json", exclude_none=True)
    four = SIX[:4]
    with dagster_deployment(admin_url, db_url.reveal(), tmp_path, mapping,
                            stopped_sensors=("approval_sensor",)) as (gql, _):
        gql.set_pool_limit(build_pool(spec), 1)
        gql.set_pool_limit(replace_pool(spec), 0)
        stages = gql.launch_backfill([["orders_daily", n] for n in ("snapshot", "stage_a", "stage_b")], four)
        target = gql.launch_backfill([["orders_daily", "target"]], four)
        runs = wait_runs(gql, {"dagster/backfill": stages}, 2)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 2
        assert run_ranges(runs) == [("2024-01-01", "2024-01-02"), ("2024-01-03", "2024-01-04")]
        assert most_at_once(runs) == 1
        matched = gql.check_executions(["orders_daily", "stage_b"], "stages_match")
        assert sorted(matched) == four and all(e["evaluation"]["success"] for e in matched.values())
        plan = make_plan(spec, PartitionRequest("2024-01-01..2024-01-04"), factory)
        with factory() as c:
            approve_plan(c, factory, spec, find_plan(c, spec, plan.plan_id), "e2e")
        gql.set_pool_limit(replace_pool(spec), 1)
        runs = wait_runs(gql, {"dagster/backfill": target}, 2)
        assert [r["status"] for r in runs] == ["SUCCESS"] * 2 and most_at_once(runs) == 1
    assert latest_ledger(conn, plan.plan_id) == {d: "verified" for d in four}


def test_a_duckdb_spec_builds_one_run_at_a_time(tmp_path):
    from backfill_assets.core.errors import SpecError
    from backfill_assets_tests.support.duck_lakes import duck_spec
    with pytest.raises(SpecError, match="max_concurrent_builds must be 1 on engine duckdb"):
        duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path)},
                  parallel={"max_partitions_per_run": 2, "max_concurrent_builds": 2})
