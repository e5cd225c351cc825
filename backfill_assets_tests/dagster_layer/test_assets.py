"""The Dagster layer in process: real PostgreSQL, an ephemeral Dagster instance, public APIs.
The audit too: the target's ``target_still_verified`` check holds after apply; the audit
schedule's run (read-only) fails it for a partition a hand fix changed, with what changed and a
link that plans it again; the approvals board lists that partition; the audit's counts are
observed on the target, to be plotted over time."""

from __future__ import annotations

import datetime as dt

import dagster as dg
import psycopg
import pytest

from backfill_assets.core.errors import SpecError, TransientDatabaseError, VerificationError
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import PLAN_TAG, RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource, transient_retry
from backfill_assets_tests.support.flows import DAYS8, target_day_hashes
from backfill_assets_tests.support.gate import approve_config, previewed
from backfill_assets_tests.support.specs import make_spec

SPEC = make_spec()
KEYS = {n: dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b", "target")}
WEEK = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-07"}


@pytest.fixture
def dagster_env(demo_db, db_url):
    defs = build_definitions([SPEC])
    resources = {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    return defs, resources, dg.DagsterInstance.ephemeral()


def materialize(defs, resources, instance, names, tags):
    assets = [a for a in spec_assets(SPEC)]
    return dg.materialize(assets, selection=[KEYS[n] for n in names], instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def evaluations(result, check_name):
    return {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == check_name}


def materializations(result, name):
    node = "orders_daily__stages" if name.startswith("stage_") else f"orders_daily__{name}"
    return {m.partition: m.metadata for m in result.asset_materializations_for_node(node)
            if m.asset_key == KEYS[name]}


def stage_week(defs, resources, instance):
    result = materialize(defs, resources, instance, ["snapshot", "stage_a", "stage_b"], WEEK)
    assert result.success
    return result


def approve(defs, resources, instance, staged):
    """Approve the change preview the stages run ``staged`` showed, as its approve link does."""
    job = defs.resolve_job_def("approve_backfill")
    return job.execute_in_process(
        run_config=approve_config(staged),
        resources=resources, instance=instance, raise_on_error=False,
    )


def test_stages_report_fingerprints_and_per_partition_checks(dagster_env):
    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    matched = evaluations(result, "stages_match")
    # The moved record adds 2024-01-08 to the week's plan.
    assert sorted(matched) == [d.isoformat() for d in DAYS8]
    assert all(e.passed for e in matched.values())
    plan_ids = {e.metadata["plan_id"].value for e in matched.values()}
    assert len(plan_ids) == 1
    stage_b = materializations(result, "stage_b")
    assert stage_b["2024-01-05"]["dagster/row_count"].value == 0
    assert stage_b["2024-01-01"]["plan_id"].value in plan_ids
    assert "| 2024-01-08 |" in stage_b["2024-01-01"]["plan"].value
    assert [c.name for c in stage_b["2024-01-01"]["dagster/column_schema"].value.columns][:2] == ["order_date", "order_id"]
    keys_ok = evaluations(result, "business_key_unique_and_not_null")
    assert all(e.passed for e in keys_ok.values()) and len(keys_ok) == 8
    # Every check result of both stages leads to the plan.
    stage_checks = [e for e in result.get_asset_check_evaluations() if e.asset_key in (KEYS["stage_a"], KEYS["stage_b"])]
    assert len(stage_checks) == 8 * 4  # two key checks, stages_match and the change preview
    assert {e.metadata["plan_id"].value for e in stage_checks} == plan_ids
    snapshot_ids = {m["snapshot_id"].value for m in materializations(result, "snapshot").values()}
    assert len(snapshot_ids) == 1
    for side in ("stage_a", "stage_b"):
        built = materializations(result, side)
        assert sorted(built) == sorted(matched)
        assert {m["snapshot_id"].value for m in built.values()} == snapshot_ids
        assert {m["plan_id"].value for m in built.values()} == plan_ids


def test_per_partition_progress_is_logged_at_most_every_two_seconds_and_the_last_line_kept(dagster_env):
    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    lines = [e.user_message for e in instance.all_logs(result.run_id) if e.dagster_event is None]
    per_partition = [m for m in lines if m.startswith("stage ")]
    assert 2 <= len(per_partition) < 16  # 8 partitions, two stages, built in well under 2 s
    for stream in ("stage a", "stage b"):  # each step's first (its announcement) and last line are kept
        own = [m for m in per_partition if m.startswith(stream + ":")]
        assert own[0].startswith(f"{stream}: 0/8") and own[-1].startswith(f"{stream}: 8/8 2024-01-08")
    assert lines.index(per_partition[-1]) < next(i for i, m in enumerate(lines) if m.startswith("plan: "))


def test_one_stage_alone_is_refused_with_the_reason(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    assert materialize(defs, resources, instance, ["snapshot"], WEEK).success
    alone = materialize(defs, resources, instance, ["stage_a"], WEEK)
    assert not alone.success
    failure = alone.failure_data_for_node("orders_daily__stages")
    assert "are built together" in failure.error.cause.message
    assert demo_db.execute("SELECT count(*) FROM backfill_control.plans").fetchone() == (0,)


def test_the_target_refuses_partitions_without_an_approval(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    stage_week(defs, resources, instance)
    before = target_day_hashes(demo_db)
    result = materialize(defs, resources, instance, ["target"], WEEK)
    assert not result.success
    failed = evaluations(result, "target_matches_approved_plan")
    assert failed and not any(e.passed for e in failed.values())
    assert "have no approved plan" in failed["2024-01-01"].metadata["error"].value
    assert target_day_hashes(demo_db) == before


def test_approval_gate_then_sensor_launches_exactly_the_approved_partitions(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    plan_id = evaluations(result, "stages_match")["2024-01-01"].metadata["plan_id"].value
    assert previewed(result)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    approved = approve(defs, resources, instance, result)
    assert approved.success and approved.output_for_node("approve_plan_gate") >= 1
    sensor = defs.resolve_sensor_def("approval_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        tick = sensor.evaluate_tick(context)
        cursor = tick.cursor
        assert cursor == "{\"orders_daily\": 1}"
    (request,) = tick.run_requests
    assert request.job_name == "orders_daily__replace_target"
    assert request.tags[RANGE_START] == "2024-01-01" and request.tags[RANGE_END] == "2024-01-08"
    assert request.tags[PLAN_TAG] == plan_id and request.run_key.startswith("approval-orders_daily-")
    with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
        assert sensor.evaluate_tick(context).run_requests == []  # nothing new
    run = materialize(defs, resources, instance, ["target"], request.tags)
    assert run.success
    checks = evaluations(run, "target_matches_approved_plan")
    assert sorted(checks) == [d.isoformat() for d in DAYS8] and all(e.passed for e in checks.values())
    target = materializations(run, "target")
    assert target["2024-01-08"]["status"].value == "verified"
    hashes = target_day_hashes(demo_db)
    assert all(hashes[k] == target[k]["content_hash"].value for k in hashes)


def test_the_approval_gate_logs_the_core_review_and_checks_the_data_once(dagster_env, demo_db, monkeypatch):
    from backfill_assets.core.engines.postgres import review as approve_module

    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    plan_id = evaluations(result, "stages_match")["2024-01-01"].metadata["plan_id"].value
    calls = []
    real = approve_module.check_data_unchanged
    monkeypatch.setattr(approve_module, "check_data_unchanged", lambda *a, **k: calls.append(1) or real(*a, **k))
    approved = approve(defs, resources, instance, result)
    assert approved.success and len(calls) == 1
    logged = [e.user_message for e in instance.all_logs(approved.run_id) if "Approving will REPLACE" in e.user_message]
    assert len(logged) == 1 and f"plan {plan_id}" in logged[0] and "The target now" in logged[0]
    assert "what the replacement changes" in logged[0] and "unchanged" in logged[0]  # core.diff's counts


def test_approve_backfill_refuses_a_plan_that_no_longer_matches(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    plan_id = evaluations(result, "stages_match")["2024-01-01"].metadata["plan_id"].value
    assert previewed(result)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'x' WHERE order_date = '2024-01-03'")
    refused = approve(defs, resources, instance, result)
    assert not refused.success
    assert demo_db.execute("SELECT count(*) FROM backfill_control.approvals").fetchone()[0] == 0


def test_stages_that_differ_fail_the_blocking_check_and_the_target_is_not_replaced(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    first = stage_week(defs, resources, instance)
    plan_id = evaluations(first, "stages_match")["2024-01-01"].metadata["plan_id"].value
    assert approve(defs, resources, instance, first).success
    assert materialize(defs, resources, instance, ["target"], {**WEEK, PLAN_TAG: plan_id}).success
    before = target_day_hashes(demo_db)
    # The source gets a late correction, and stage A is skewed for one day (stage B is hashed, and written only where it differs).
    demo_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date = '2024-01-02'")
    demo_db.execute(
        "CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN NEW.note := 'skewed'; END IF; RETURN NEW; END $$"
    )
    demo_db.execute("CREATE TRIGGER skew BEFORE INSERT ON backfill_control.orders_daily__stage_a "
                    "FOR EACH ROW EXECUTE FUNCTION public.skew()")
    day = {"dagster/partition": "2024-01-02"}
    run = dg.materialize(spec_assets(SPEC), selection=[KEYS[n] for n in ("snapshot", "stage_a", "stage_b", "target")],
                         instance=instance, resources=resources, tags=day, raise_on_error=False)
    assert not run.success
    failed = evaluations(run, "stages_match")["2024-01-02"]
    assert not failed.passed
    # The failed check names the first differing keys and columns (no values copied out).
    assert "differs in note" in failed.metadata["differing_keys"].value
    assert "skewed" not in failed.metadata["differing_keys"].value
    assert not materializations(run, "target")  # the blocking check skipped the target step
    # Materialized by hand, the target refuses: the newest approved plan no longer matches stage A.
    by_hand = materialize(defs, resources, instance, ["target"], day)
    assert not by_hand.success
    error = evaluations(by_hand, "target_matches_approved_plan")["2024-01-02"].metadata["error"].value
    assert "no longer has the planned fingerprint" in error
    assert target_day_hashes(demo_db) == before


def test_transient_failures_are_retried_a_bounded_number_of_times_and_others_never(factory):
    spec = make_spec()
    with pytest.raises(dg.RetryRequested) as retry:
        with transient_retry(factory, spec):
            raise TransientDatabaseError("lock timeout")
    assert retry.value.max_retries == 3
    with pytest.raises(VerificationError):
        with transient_retry(factory, spec):
            raise VerificationError("2024-01-01", "verification before commit", "a", "b")


def test_a_held_lock_is_retried_then_fails_with_nothing_changed(dagster_env, demo_db, db_url):
    _, resources, instance = dagster_env
    spec = make_spec(lock_timeout_ms=200)
    plan_id_result = dg.materialize(spec_assets(spec), selection=[KEYS[n] for n in ("snapshot", "stage_a", "stage_b")],
                                    instance=instance, resources=resources, tags=WEEK, raise_on_error=False)
    plan_id = evaluations(plan_id_result, "stages_match")["2024-01-01"].metadata["plan_id"].value
    defs = build_definitions([spec])
    assert approve(defs, resources, instance, plan_id_result).success
    before = target_day_hashes(demo_db)
    with psycopg.connect(db_url.reveal()) as writer:
        writer.execute("UPDATE public.orders_daily SET note = note WHERE order_date = '2024-01-20'")
        run = dg.materialize(spec_assets(spec), selection=[KEYS["target"]], instance=instance,
                             resources=resources, tags={**WEEK, PLAN_TAG: plan_id}, raise_on_error=False)
        writer.rollback()
    assert not run.success
    attempts = demo_db.execute(
        "SELECT count(DISTINCT run_id) FROM backfill_control.ledger WHERE status = 'failed' AND error LIKE %s",
        ("%lock timeout%",),
    ).fetchone()[0]
    assert attempts == 4  # the first try and three retries
    assert target_day_hashes(demo_db) == before


def test_source_snapshot_sensor_restages_changed_partitions(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    sensor = defs.resolve_sensor_def("source_snapshot_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        assert sensor.evaluate_tick(context).run_requests == []
    stage_week(defs, resources, instance)
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        assert sensor.evaluate_tick(context).run_requests == []
    demo_db.execute("UPDATE public.orders_raw SET note = 'late' WHERE order_date IN ('2024-01-02', '2024-01-03')")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        (request,) = sensor.evaluate_tick(context).run_requests
    assert request.job_name == "orders_daily__build_stages"
    assert (request.tags[RANGE_START], request.tags[RANGE_END]) == ("2024-01-02", "2024-01-03")


def test_the_target_gate_says_why_an_approval_no_longer_covers_a_partition(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    result = stage_week(defs, resources, instance)
    plan_id = evaluations(result, "stages_match")["2024-01-01"].metadata["plan_id"].value
    assert previewed(result)["plan_id"] == plan_id  # the preview shows the plan stages_match shows
    assert approve(defs, resources, instance, result).success
    demo_db.execute("UPDATE public.orders_daily SET note = 'hand fix' WHERE order_date = '2024-01-03'")
    before = target_day_hashes(demo_db)
    for tags in ({**WEEK, PLAN_TAG: plan_id}, {"dagster/partition": "2024-01-03"}):  # the sensor's run, by hand
        run = materialize(defs, resources, instance, ["target"], tags)
        assert not run.success
        checks = evaluations(run, "target_matches_approved_plan")
        assert not checks["2024-01-03"].passed
        reason = checks["2024-01-03"].metadata["reason"].value
        assert reason.startswith("target changed since approval 1: it now has ")
        assert reason.endswith("changed outside backfill_assets")
        error = run.failure_data_for_node("orders_daily__target").error.cause.message
        assert "no longer covers partition(s) 2024-01-03" in error and reason in error
        assert not materializations(run, "target")
    assert target_day_hashes(demo_db) == before


def skew_stage_a(conn, day: str = "2024-01-02") -> None:
    """Stage A writes another note on one day: the two builds differ there (a trigger on
    stage A: stage B is hashed as it is built, and written only where it differs)."""
    conn.execute("CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                 "IF NEW.order_date = TG_ARGV[0]::date THEN NEW.note := 'skewed'; END IF; RETURN NEW; END $$")
    conn.execute(psycopg.sql.SQL("CREATE TRIGGER skew BEFORE INSERT ON backfill_control.orders_daily__stage_a "
                                 "FOR EACH ROW EXECUTE FUNCTION public.skew({})").format(psycopg.sql.Literal(day)))


def test_a_refused_plan_records_no_stage_materialization_only_its_checks(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    stage_week(defs, resources, instance)  # creates the stage tables
    materialized_before = {key: len(instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=KEYS[key]), limit=100).records) for key in ("stage_a", "stage_b")}
    skew_stage_a(demo_db)
    run = materialize(defs, resources, instance, ["snapshot", "stage_a", "stage_b"], WEEK)
    assert not run.success
    failure = run.failure_data_for_node("orders_daily__stages").error.cause
    assert "DeterminismError" in failure.cls_name and "stages A and B differ" in failure.message
    assert not materializations(run, "stage_a") and not materializations(run, "stage_b")
    assert {key: len(instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=KEYS[key]), limit=100).records) for key in ("stage_a", "stage_b")} == materialized_before
    matched = evaluations(run, "stages_match")
    assert sorted(matched) == [d.isoformat() for d in DAYS8]
    assert not matched["2024-01-02"].passed and all(e.passed for k, e in matched.items() if k != "2024-01-02")
    assert "**differs**" in matched["2024-01-02"].metadata["readings"].value
    keys_ok = [e for e in run.get_asset_check_evaluations() if e.check_name == "business_key_unique_and_not_null"]
    assert len(keys_ok) == 2 * 8


STAGE_CHECKS = [dg.AssetCheckKey(KEYS["stage_a"], "business_key_unique_and_not_null"),
                dg.AssetCheckKey(KEYS["stage_b"], "business_key_unique_and_not_null"),
                dg.AssetCheckKey(KEYS["stage_b"], "stages_match")]


def check_again(resources, instance, checks, tags):
    return dg.materialize(spec_assets(SPEC), selection=dg.AssetSelection.checks(*checks), instance=instance,
                          resources=resources, tags=tags, raise_on_error=False)


def test_the_stage_checks_alone_check_the_stages_as_they_are_without_building(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    plan_id = evaluations(stage_week(defs, resources, instance), "stages_match")["2024-01-01"].metadata["plan_id"].value
    plans = demo_db.execute("SELECT count(*) FROM backfill_control.plans").fetchone()
    again = check_again(resources, instance, STAGE_CHECKS, WEEK)
    assert again.success
    matched = evaluations(again, "stages_match")
    assert sorted(matched) == [d.isoformat() for d in DAYS8[:7]] and all(e.passed for e in matched.values())
    assert {e.metadata["plan_id"].value for e in matched.values()} == {plan_id}
    assert len([e for e in again.get_asset_check_evaluations() if e.check_name == "business_key_unique_and_not_null"]) == 14
    assert not materializations(again, "stage_a") and not materializations(again, "stage_b")
    assert demo_db.execute("SELECT count(*) FROM backfill_control.plans").fetchone() == plans  # nothing planned
    # Only the selected check is evaluated; a stage changed since its build fails it.
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'x' WHERE order_date = '2024-01-03'")
    one = check_again(resources, instance, STAGE_CHECKS[2:], {"dagster/partition": "2024-01-03"})
    (evaluation,) = one.get_asset_check_evaluations()
    assert evaluation.check_name == "stages_match" and not evaluation.passed
    problems = evaluation.metadata["problems"].value
    assert "stage A changed since its latest build" in problems and "stages A and B differ on content_hash" in problems
    # After a refused plan (its differing partitions deleted, so both stages are empty alike).
    skew_stage_a(demo_db)
    assert not materialize(defs, resources, instance, ["snapshot", "stage_a", "stage_b"], WEEK).success
    refused = evaluations(check_again(resources, instance, STAGE_CHECKS, WEEK), "stages_match")
    assert not refused["2024-01-02"].passed and refused["2024-01-01"].passed
    assert "a refused plan removes the partitions whose stages differ" in refused["2024-01-02"].metadata["problems"].value


def test_one_stage_alone_is_refused_naming_what_to_select(dagster_env):
    defs, resources, instance = dagster_env
    stage_week(defs, resources, instance)
    alone = dg.materialize(spec_assets(SPEC), selection=dg.AssetSelection.assets(KEYS["stage_a"]) | dg.AssetSelection.checks(
        *STAGE_CHECKS), instance=instance, resources=resources, tags=WEEK, raise_on_error=False)
    assert not alone.success
    message = alone.failure_data_for_node("orders_daily__stages").error.cause.message
    assert "select both, or only their checks to check the stages again without building them" in message


AUDIT_CHECK = "target_still_verified"


def test_a_hand_fix_fails_the_scheduled_audit_check_and_shows_on_the_board(dagster_env, demo_db):
    defs, resources, instance = dagster_env
    staged = stage_week(defs, resources, instance)
    assert approve(defs, resources, instance, staged).success
    sensor = defs.resolve_sensor_def("approval_sensor")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        (request,) = sensor.evaluate_tick(context).run_requests
    applied = materialize(defs, resources, instance, ["target"], request.tags)
    assert applied.success
    just = evaluations(applied, AUDIT_CHECK)  # what apply verified holds, by its own verification
    assert sorted(just) == [d.isoformat() for d in DAYS8] and all(e.passed for e in just.values())
    assert {e.metadata["seen_by"].value for e in just.values()} == {"apply's verification"}

    # A hand fix after the backfill.
    demo_db.execute("UPDATE public.orders_daily SET amount = amount + 1 "
                    "WHERE order_date = '2024-01-03' AND order_id = (SELECT min(order_id) FROM public.orders_daily "
                    "WHERE order_date = '2024-01-03')")
    demo_db.commit()
    before = target_day_hashes(demo_db)

    schedule = defs.resolve_schedule_def("orders_daily__audit_schedule")
    assert schedule.cron_schedule == "0 6 * * *" and schedule.execution_timezone == "UTC"
    at = dt.datetime(2026, 12, 6, 6, tzinfo=dt.timezone.utc)
    with dg.build_schedule_context(instance=instance, scheduled_execution_time=at) as context:
        (run,) = schedule.evaluate_tick(context).run_requests
    assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (
        "2024-01-01", "2024-01-08")
    audited = defs.resolve_job_def("orders_daily__audit_target").execute_in_process(
        tags=run.tags, resources=resources, instance=instance, raise_on_error=False)
    assert audited.success
    checks = {e.partition: e for e in audited.get_asset_check_evaluations()}
    assert sorted(checks) == [d.isoformat() for d in DAYS8]
    assert [label for label, e in checks.items() if not e.passed] == ["2024-01-03"]
    drifted = checks["2024-01-03"]
    assert drifted.severity == dg.AssetCheckSeverity.ERROR and drifted.metadata["result"].value == "drifted"
    assert "0 row(s) added, 0 removed, 1 changed" in drifted.metadata["changes"].value
    assert "| amount |" in drifted.metadata["changes"].value
    link = drifted.metadata["plan_again"].value
    assert link.endswith("/assets/orders_daily/stage_a?view=partitions&partition=2024-01-03")
    assert checks["2024-01-01"].metadata["seen_by"].value == "fingerprint"  # the first audit reads the rows
    (observed,) = [e for e in audited.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    counts = observed.event_specific_data.asset_observation.metadata
    assert (counts["audit/holds"].value, counts["audit/drifted"].value) == (7, 1)
    assert target_day_hashes(demo_db) == before  # read-only

    board = defs.resolve_sensor_def("approvals_board")
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        result = board.evaluate_tick(context)
    (observation,) = [e for e in result.asset_events if e.asset_key == dg.AssetKey(["orders_daily", "approvals"])]
    assert observation.metadata["partitions_drifted"].value == 1
    assert "Drifted since verified (1)" in observation.metadata["board"].value
    assert "partition=2024-01-03" in observation.metadata["board"].value
    assert drifted.asset_key == KEYS["target"]


def test_the_audit_schedule_is_the_specs_and_a_bad_one_is_refused_at_load():
    from backfill_assets.dagster_layer.definitions import build_definitions
    defs = build_definitions([make_spec(audit_schedule="30 2 * * 1")])
    assert defs.resolve_schedule_def("orders_daily__audit_schedule").cron_schedule == "30 2 * * 1"
    with pytest.raises(SpecError, match="audit_schedule 'daily' is not a cron expression of five fields"):
        make_spec(audit_schedule="daily")
