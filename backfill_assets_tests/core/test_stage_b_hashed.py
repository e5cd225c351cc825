"""Stage B hashed as it is built, against a real PostgreSQL: kept only where it differs from
stage A (to show the differing keys) or where its columns are converted on the way in, and
every reader of stage B (the stage checks, `diff --against stage_b`) answers as before."""

from __future__ import annotations

import psycopg
import pytest

from backfill_assets.core.diff import diff_plan
from backfill_assets.core.errors import DeterminismError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.stages import read_stages
from backfill_assets_tests.support.flows import ALL_DAYS
from backfill_assets_tests.support.specs import make_spec

pytestmark = pytest.mark.postgres

EXPORTED = make_spec(records_can_move=False, source={"table": "public.orders_raw"})
COPY = make_spec(records_can_move=False)
MOVING = make_spec(records_can_move=True)
STAGE = "backfill_control.orders_daily__stage_{}"


def _rows(conn: psycopg.Connection, variant: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {STAGE.format(variant)}").fetchone()[0]


def _kept(conn: psycopg.Connection, variant: str) -> dict[str, bool | None]:
    return dict(conn.execute(
        "SELECT partition, kept FROM backfill_control.stage_builds WHERE spec_name = 'orders_daily' "
        "AND variant = %s", (variant,)).fetchall())


@pytest.mark.parametrize("spec", [EXPORTED, COPY, MOVING], ids=["exported", "copy", "records_can_move"])
def test_stages_that_agree_leave_stage_b_unwritten_and_every_reader_answers(unmoved_db, factory, spec):
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "ready"
    assert _rows(unmoved_db, "a") > 0 and _rows(unmoved_db, "b") == 0
    assert set(_kept(unmoved_db, "b").values()) == {False} and set(_kept(unmoved_db, "a").values()) == {True}
    # The stage checks read stage B from its build: both stages match, as planned.
    states = read_stages(spec, plan.labels, factory)
    assert all(s.match and s.plan_id == plan.plan_id for s in states), [s.problems for s in states]
    assert [s.b for s in states] == [p.stage_b for p in plan.document.partitions]
    # Against stage B, nothing differs: the fingerprints are equal.
    against_b = diff_plan(spec, plan.plan_id, factory, against="stage_b")
    assert not any(p.differs for p in against_b.partitions)
    assert [p.unchanged for p in against_b.partitions] == [p.stage_a.row_count for p in plan.document.partitions]


def test_a_row_written_into_an_unwritten_stage_b_is_seen_by_the_stage_checks(unmoved_db, factory):
    plan = make_plan(EXPORTED, ALL_DAYS, factory)
    day = plan.labels[0]
    unmoved_db.execute(f"INSERT INTO {STAGE.format('b')} SELECT * FROM {STAGE.format('a')} "
                       "WHERE order_date = %s LIMIT 1", (day,))
    unmoved_db.commit()
    states = {s.partition: s for s in read_stages(EXPORTED, plan.labels, factory)}
    assert not states[day].match and "stage B changed since its latest build" in " ".join(states[day].problems)
    assert all(s.match for label, s in states.items() if label != day)
    # `diff --against stage_b` reads that partition's rows, not the build's record.
    against_b = {p.partition: p for p in diff_plan(EXPORTED, plan.plan_id, factory, against="stage_b").partitions}
    assert against_b[day].differs and not any(p.differs for label, p in against_b.items() if label != day)


def test_a_column_converted_on_the_way_in_keeps_stage_b(unmoved_db, factory):
    # numeric without a scale into numeric(12,2): the INSERT's assignment cast rounds, which a
    # SELECT would not spell the same way; stage B is written, as before.
    transform = ("SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount * 1 AS amount, "
                 "status, note FROM source")
    spec = make_spec(records_can_move=False, source={"table": "public.orders_raw"}, transform_sql=transform)
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "ready"
    assert _rows(unmoved_db, "b") == _rows(unmoved_db, "a") > 0
    assert set(_kept(unmoved_db, "b").values()) == {True}
    assert all(s.match for s in read_stages(spec, plan.labels, factory))


@pytest.mark.parametrize("snapshot", ["exported", "copy"])
def test_only_the_partitions_whose_builds_differ_are_written_to_show_their_keys(unmoved_db, factory, snapshot):
    unmoved_db.execute(
        "CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$"
    )
    transform = ("SELECT order_date, order_id, customer_id + CASE WHEN order_date = '2024-01-02' "
                 "THEN jitter() ELSE 0 END AS customer_id, updated_at, ingest_seq, amount, status, note FROM source")
    source = {"table": "public.orders_raw", "snapshot": snapshot}
    spec = make_spec(records_can_move=False, source=source, transform_sql=transform,
                     trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}])
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "refused" and isinstance(plan.refusal(), DeterminismError)
    named = [p for p in plan.problems if p.startswith("partition 2024-01-02: first differing key(s)")]
    assert len(named) == 1 and "differs in customer_id" in named[0]
    assert [p.partition for p in plan.document.partitions if not p.match] == ["2024-01-02"]
    # The differing partition was written (then removed with stage A's, as a refused plan's
    # are); the others were hashed only.
    kept = _kept(unmoved_db, "b")
    assert kept.pop("2024-01-02") is True and set(kept.values()) == {False}
    assert _rows(unmoved_db, "b") == 0


def test_a_stage_b_left_by_an_earlier_version_does_not_stop_the_keys_being_shown(unmoved_db, factory):
    """Stage B rows written before the plan began (an earlier version kept every stage B): the
    hashed build empties them and commits; the rebuild that shows the keys imports the plan's
    older snapshot, in which those rows still exist, and must not try to delete them again."""
    make_plan(EXPORTED, ALL_DAYS, factory)
    unmoved_db.execute(f"INSERT INTO {STAGE.format('b')} SELECT * FROM {STAGE.format('a')}")
    unmoved_db.commit()
    unmoved_db.execute(
        "CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$"
    )
    unmoved_db.commit()
    transform = ("SELECT order_date, order_id, customer_id + CASE WHEN order_date = '2024-01-02' "
                 "THEN jitter() ELSE 0 END AS customer_id, updated_at, ingest_seq, amount, status, note FROM source")
    spec = make_spec(records_can_move=False, source={"table": "public.orders_raw"}, transform_sql=transform,
                     trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}])
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "refused" and isinstance(plan.refusal(), DeterminismError)
    assert any(p.startswith("partition 2024-01-02: first differing key(s)") for p in plan.problems), plan.problems
