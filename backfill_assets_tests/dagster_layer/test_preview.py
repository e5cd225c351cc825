"""The change preview on the dashboard, the approval of exactly what was shown, and the board
of what waits: in process, real PostgreSQL, an ephemeral Dagster instance."""

from __future__ import annotations

import datetime as dt
import re
from urllib.parse import parse_qs, urlsplit

import dagster as dg
import pytest
import yaml

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.plan import make_plan
from backfill_assets.core.preview import waiting
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import RANGE_END, RANGE_START
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.gate import PREVIEW_CHECK, approve_config, previewed
from backfill_assets_tests.support.specs import make_spec

SPEC = make_spec()
KEYS = {n: dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b", "target", "approvals")}
WEEK = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-07"}
PLAN_DAYS = [f"2024-01-0{d}" for d in range(1, 9)]  # the moved record adds 2024-01-08


@pytest.fixture
def env(demo_db, db_url):
    defs = build_definitions([SPEC])
    resources = {"pg_orders_daily": PostgresResource(database_url=db_url.reveal(), variable="TEST_URL")}
    return defs, resources, dg.DagsterInstance.ephemeral()


def stage(env, tags=WEEK, selection=None):
    defs, resources, instance = env
    result = dg.materialize(spec_assets(SPEC), selection=selection or [KEYS[n] for n in ("snapshot", "stage_a", "stage_b")],
                            instance=instance, resources=resources, tags=tags, raise_on_error=False)
    assert result.success
    return result


def previews(result):
    return {e.partition: e for e in result.get_asset_check_evaluations() if e.check_name == PREVIEW_CHECK}


def gate(env, config):
    defs, resources, instance = env
    return defs.resolve_job_def("approve_backfill").execute_in_process(
        run_config=config, resources=resources, instance=instance, raise_on_error=False)


def gate_error(run) -> str:
    return run.failure_data_for_node("approve_plan_gate").error.cause.message


def approvals(db):
    return db.execute("SELECT plan_id, approved_by, review FROM backfill_control.approvals ORDER BY approval_id").fetchall()


def test_each_partition_of_a_ready_plan_shows_what_approving_it_changes_before_anyone_approves(env, demo_db):
    staged = stage(env)
    shown = previews(staged)
    assert sorted(shown) == PLAN_DAYS and all(e.passed for e in shown.values())
    assert all(e.severity == dg.AssetCheckSeverity.WARN and not e.blocking for e in shown.values())
    meta = {p: e.metadata for p, e in shown.items()}
    counts = {p: tuple(m[k].value for k in ("added", "removed", "changed", "unchanged")) for p, m in meta.items()}
    # The demo's target is stale: every day has rows to change; the 8th gains the moved record.
    assert all(sum(c[:3]) > 0 for c in counts.values())
    # The counts are the core's diff of stage A against the target (the `diff` command's).
    from backfill_assets.core.diff import diff_plan
    plan_id = meta["2024-01-01"]["plan_id"].value
    found = {d.partition: (d.added, d.removed, d.changed, d.unchanged)
             for d in diff_plan(SPEC, plan_id, _factory(env), against="target", limit=0).partitions}
    assert counts == found
    # The first differing keys name keys and columns only: no value leaves the database.
    first = meta["2024-01-02"]["first_keys"].value
    assert first.startswith("order_id=") and re.search(r": (changed in \w+|added|removed)", first)
    values = {r[0] for r in demo_db.execute(
        "SELECT note FROM backfill_control.orders_daily__stage_a WHERE note IS NOT NULL AND note <> ''").fetchall()}
    assert values and not any(v in first for v in values)
    # The approve link opens the gate's launchpad with the plan and the preview chosen, the
    # approver's name left blank: Dagster's /guess/<job>/playground/setup route.
    link = meta["2024-01-03"]["approve"].value
    url = urlsplit(link)
    assert url.path == "/guess/approve_backfill/playground/setup"
    config = yaml.safe_load(parse_qs(url.query)["config"][0])["ops"]["approve_plan_gate"]["config"]
    assert config == {"spec": "orders_daily", "plan_id": plan_id, "review_id": previewed(staged)["review_id"],
                      "approved_by": None}
    assert {m["review_id"].value for m in meta.values()} == {config["review_id"]}


def _factory(env):
    _, resources, _ = env
    return resources["pg_orders_daily"].factory(SPEC, "test")


def test_the_gate_needs_a_name_and_records_the_review_that_was_shown(env, demo_db):
    staged = stage(env)
    ids = previewed(staged)
    with pytest.raises(dg.DagsterInvalidConfigError, match='Missing required config entry "approved_by"'):
        gate(env, {"ops": {"approve_plan_gate": {"config": ids}}})
    blank = gate(env, approve_config(staged, approved_by="  "))
    assert not blank.success and "approver's name" in gate_error(blank)
    assert approvals(demo_db) == []
    done = gate(env, approve_config(staged, approved_by="alice"))
    assert done.success
    ((plan_id, by, review),) = approvals(demo_db)
    assert (plan_id, by) == (ids["plan_id"], "alice") and review["review_id"] == ids["review_id"]
    shown = {p: {k: e.metadata[k].value for k in ("added", "removed", "changed", "unchanged")}
             for p, e in previews(staged).items()}
    assert review["changes"] == shown and review["previewed_at"]


def test_a_target_changed_since_the_preview_is_refused_and_the_next_evaluation_shows_it_as_it_is(env, demo_db):
    staged = stage(env)
    demo_db.execute("UPDATE public.orders_daily SET note = 'hand fix' WHERE order_date = '2024-01-03'")
    refused = gate(env, approve_config(staged))
    assert not refused.success
    message = gate_error(refused)
    assert "the target changed in partition(s) 2024-01-03 since the change preview you were shown" in message
    assert "Look again" in message and approvals(demo_db) == []
    # The preview check alone, evaluated again: a new preview, which says the target changed.
    again = stage(env, selection=dg.AssetSelection.checks(dg.AssetCheckKey(KEYS["stage_a"], PREVIEW_CHECK)))
    now = previews(again)
    # A new preview replaces the plan's previous one, and its link approves every partition of
    # the plan: it is shown on all of them, not only on the run's (2024-01-01 to 2024-01-07).
    assert sorted(now) == PLAN_DAYS and now["2024-01-08"].metadata["plan_partitions"].value == 8
    assert "target_changed_since" in now["2024-01-03"].metadata
    assert "target_changed_since" not in now["2024-01-02"].metadata
    assert previewed(again)["review_id"] != previewed(staged)["review_id"]
    assert previewed(again)["plan_id"] == previewed(staged)["plan_id"]
    # The old link is refused for good; the new one approves.
    old = gate(env, approve_config(staged))
    assert not old.success and "no current change preview" in gate_error(old)
    assert gate(env, approve_config(again)).success
    ((_, _, review),) = approvals(demo_db)
    assert review["review_id"] == previewed(again)["review_id"]


def test_a_preview_of_another_plan_or_a_changed_stage_is_refused(env, demo_db):
    staged = stage(env)
    wrong = approve_config(staged)
    wrong["ops"]["approve_plan_gate"]["config"]["plan_id"] = "ab" * 32
    refused = gate(env, wrong)
    assert not refused.success and "is of plan" in gate_error(refused)
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'x' WHERE order_date = '2024-01-03'")
    changed = gate(env, approve_config(staged))
    assert not changed.success and "no longer has the planned fingerprint" in gate_error(changed)
    assert approvals(demo_db) == []


def test_the_board_lists_what_waits_with_its_age_and_marks_a_preview_stale_once(env, demo_db):
    defs, resources, instance = env
    sensor = defs.resolve_sensor_def("approvals_board")

    def tick(cursor=None):
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
            result = sensor.evaluate_tick(context)
        return result, result.cursor

    empty, cursor = tick()
    (observed,) = empty.asset_events
    assert observed.asset_key == KEYS["approvals"] and observed.metadata["plans_waiting"].value == 0
    # An older plan of one day, then the week's plan (which replaces it on the board).
    factory = _factory(env)
    old = make_plan(SPEC, PartitionRequest("2024-01-03"), factory)
    staged = stage(env)
    ids = previewed(staged)
    listed, cursor = tick(cursor)
    (observed,) = listed.asset_events
    board = observed.metadata["board"].value
    assert observed.metadata["plans_waiting"].value == 1 and ids["plan_id"][:16] in board
    assert old.plan_id[:16] not in board and "[approve](/guess/approve_backfill/playground/setup?" in board
    assert "| 0 min |" in board or "| 1 min |" in board  # its age
    same, cursor = tick(cursor)
    assert same.asset_events == []  # nothing changed: not observed again
    # The older plan approved and applied from the command line: the week's preview is stale
    # in 2024-01-03, marked once, and the board says so.
    with factory() as conn:
        approve_plan(conn, factory, SPEC, find_plan(conn, SPEC, old.plan_id), "bob")
    apply_plan(SPEC, old.plan_id, factory, run_id="cli-run")
    stale, cursor = tick(cursor)
    marks = [e for e in stale.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    replaced = old.labels  # 2024-01-03, and the partition its moved record comes from
    assert "2024-01-03" in replaced and "2024-01-01" not in replaced
    assert [(e.partition, e.passed, e.metadata["stale"].value) for e in marks] == [(d, False, True) for d in replaced]
    (observed,) = [e for e in stale.asset_events if isinstance(e, dg.AssetObservation)]
    assert f"**stale** in {', '.join(replaced)}" in observed.metadata["board"].value
    again, cursor = tick(cursor)
    assert not [e for e in again.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    refused = gate(env, approve_config(staged))
    assert not refused.success and f"{', '.join(replaced)} since the change preview" in gate_error(refused)
    # A new preview, approved: the board moves it to the approvals not yet applied.
    fresh = stage(env, selection=dg.AssetSelection.checks(dg.AssetCheckKey(KEYS["stage_a"], PREVIEW_CHECK)))
    assert gate(env, approve_config(fresh)).success
    waiting, cursor = tick(cursor)
    (observed,) = [e for e in waiting.asset_events if isinstance(e, dg.AssetObservation)]
    assert observed.metadata["plans_waiting"].value == 0 and observed.metadata["approvals_waiting"].value == 1
    assert "waiting for its runs" in observed.metadata["board"].value and "0 of 8" in observed.metadata["board"].value
    assert ids["plan_id"] == previewed(fresh)["plan_id"]


def test_the_board_leaves_out_plans_nobody_touched_within_approval_expires_after(env, demo_db):
    stage(env)
    factory = _factory(env)
    with factory() as conn, factory.control(conn) as store:
        (plan,) = waiting(store, SPEC).plans
        assert plan.review_id and plan.stale == [] and sorted(plan.partitions) == PLAN_DAYS
        later = plan.previewed_at + SPEC.approval_expires_after + dt.timedelta(seconds=1)
        assert waiting(store, SPEC, now=later).plans == []


def test_the_link_quotes_what_yaml_would_read_as_something_else():
    from backfill_assets.dagster_layer.names import approve_link

    url = urlsplit(approve_link("null", "0" * 64, "1e5" + "0" * 61))
    config = yaml.safe_load(parse_qs(url.query)["config"][0])["ops"]["approve_plan_gate"]["config"]
    assert config == {"spec": "null", "plan_id": "0" * 64, "review_id": "1e5" + "0" * 61, "approved_by": None}
