"""A transform over several inputs on engine postgres (core.spec_inputs): a fact joined with a
dimension read whole and with a second fact read for the same partitions through its own
column, every input read in the source's exported snapshot and pinned in the plan; a writer
changing an input during the builds reaches neither, a change after the plan gives another
plan; an undeclared relation is refused with its name."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest

from backfill_assets.core.errors import SourceDataError, SpecError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.inputs import COLUMNS, DAYS, INPUTS_SPEC, TRANSFORM, load_inputs
from backfill_assets_tests.support.windows import plan_approve_apply


def _naive(conn: psycopg.Connection) -> list[tuple]:
    """The same join over the tables as they are, newest wins per (day, order), by hand."""
    return conn.execute(
        "SELECT DISTINCT ON (s.order_date, s.order_id) s.order_date, s.order_id, s.customer_id, c.region, "
        "coalesce((SELECT sum(p.paid) FROM public.payments AS p WHERE p.order_id = s.order_id "
        "AND p.paid_on = s.order_date), 0), s.updated_at, s.seq, s.amount FROM public.orders_raw AS s "
        "LEFT JOIN public.customers AS c ON c.customer_id = s.customer_id "
        "WHERE s.order_date BETWEEN '2024-01-01' AND '2024-01-03' "
        "ORDER BY s.order_date, s.order_id, s.updated_at DESC, s.seq DESC").fetchall()


def _written(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute(f"SELECT {', '.join(COLUMNS)} FROM public.orders_enriched "
                        "ORDER BY order_date, order_id").fetchall()


def test_a_fact_joined_with_a_dimension_and_a_second_fact_equals_the_naive_join(conn, factory, url_env):
    load_inputs(conn)
    spec = spec_from_mapping(INPUTS_SPEC)
    plan, result = plan_approve_apply(conn, factory, spec, DAYS)
    assert plan.status == "ready", plan.problems
    assert {p["status"] for p in result.partitions} == {"verified"}
    assert _written(conn) == _naive(conn)
    assert [r[4] for r in _written(conn)] == [Decimal("5.00"), 0, Decimal("8.00"), 0]  # order 4's late payment
    pins = {p.name: p for p in plan.document.snapshot.inputs}
    assert (pins["customers"].table, pins["customers"].partition_key, pins["customers"].row_count) == (
        "public.customers", None, 3)
    assert (pins["payments"].partition_key, pins["payments"].row_count) == ("paid_on", 3)  # the plan's days only
    # The same inputs again: the same plan. A dimension changed since: another snapshot and plan.
    assert make_plan(spec, PartitionRequest(DAYS), factory).plan_id == plan.plan_id
    conn.execute("UPDATE public.customers SET region = 'east' WHERE customer_id = 12")
    conn.commit()
    again = make_plan(spec, PartitionRequest(DAYS), factory)
    assert again.document.snapshot.id != plan.document.snapshot.id and again.plan_id != plan.plan_id
    changed = {e.partition: e.stage_a.content_hash for e in again.document.partitions}
    before = {e.partition: e.stage_a.content_hash for e in plan.document.partitions}
    assert [d for d in changed if changed[d] != before[d]] == ["2024-01-02"]  # order 3's customer


def test_a_writer_changing_an_input_during_the_builds_reaches_neither(conn, factory, url_env, db_url):
    load_inputs(conn)
    spec = spec_from_mapping(INPUTS_SPEC)
    expected = make_plan(spec, PartitionRequest(DAYS), factory)
    wrote = []

    def write_once(event: ProgressEvent) -> None:
        if event.step == "stage a" and event.status == "built" and not wrote:
            with psycopg.connect(db_url.reveal(), autocommit=True) as other:
                other.execute("UPDATE public.customers SET region = 'moved'")
                other.execute("INSERT INTO public.payments VALUES ('2024-01-01', 2, 100.00)")
            wrote.append(True)

    plan = make_plan(spec, PartitionRequest(DAYS), factory, progress=write_once)
    assert wrote and plan.status == "ready", plan.problems
    assert plan.document.snapshot == expected.document.snapshot
    assert [e.stage_b for e in plan.document.partitions] == [e.stage_a for e in expected.document.partitions]


@pytest.mark.parametrize(("snapshot", "status"), [("exported", "exported"), ("copy", "copying")])
def test_a_truncate_of_an_input_once_the_snapshot_is_taken_waits_for_the_plan(conn, factory, url_env, db_url,
                                                                              snapshot, status):
    """TRUNCATE is not MVCC-safe: committed after the snapshot was taken and before the plan
    first read the input, the snapshot would see the input empty. Each input is locked as a
    SELECT locks it before the snapshot is taken, so a TRUNCATE just after it waits (with
    `snapshot: copy`, while the source is being copied, before any input is)."""
    load_inputs(conn)
    outcome = []

    def truncate_once(event: ProgressEvent) -> None:
        if event.step == "snapshot" and event.status == status and not outcome:
            with psycopg.connect(db_url.reveal(), autocommit=True) as other:
                other.execute("SET lock_timeout = '200ms'")
                try:
                    other.execute("TRUNCATE public.customers")
                    outcome.append("truncated")
                except psycopg.errors.LockNotAvailable:
                    outcome.append("waited")

    spec = spec_from_mapping({**INPUTS_SPEC, "source": {"table": "public.orders_raw", "snapshot": snapshot}})
    plan = make_plan(spec, PartitionRequest(DAYS), factory, progress=truncate_once)
    assert outcome == ["waited"] and plan.status == "ready"


@pytest.mark.parametrize(("transform", "refused"), [
    (TRANSFORM.replace("FROM payments", "FROM public.payments"), "it reads public.payments; a transform may read "
     "only the snapshot as 'source' and the spec's inputs (customers, payments)"),
    (TRANSFORM + " JOIN regions AS r ON r.region = c.region", "it reads regions"),
    ("WITH customers AS (SELECT 1 AS customer_id) " + TRANSFORM, "its own WITH names customers"),
])
def test_a_relation_that_is_not_a_declared_input_is_refused_with_its_name(conn, factory, url_env, transform,
                                                                           refused):
    load_inputs(conn)
    with pytest.raises(SpecError, match=refused.replace("(", r"\(").replace(")", r"\)")):
        make_plan(spec_from_mapping({**INPUTS_SPEC, "transform_sql": transform}), PartitionRequest(DAYS), factory)


def test_a_dimension_that_repeats_a_key_is_refused_as_a_tie(conn, factory, url_env):
    """A join with an input holding two rows for one customer doubles that customer's orders:
    rows that differ and tie on the whole ordering, which newest-wins cannot choose between."""
    load_inputs(conn)
    conn.execute("ALTER TABLE public.customers DROP CONSTRAINT customers_pkey")
    conn.execute("INSERT INTO public.customers VALUES (10, 'west')")
    conn.commit()
    with pytest.raises(SourceDataError, match="the transform's join repeats source rows, as input customers holds "
                       "customer_id=10 in 2 rows.*Join each input on a key it holds once") as err:
        make_plan(spec_from_mapping(INPUTS_SPEC), PartitionRequest(DAYS), factory)
    assert "partition 2024-01-01, key (order_id=1): 2 different rows" in str(err.value)


@pytest.mark.parametrize(("inputs", "refused"), [
    ({"source": {"table": "public.customers"}}, "'source' is the partitioned source's name"),
    ({"customers": {"table": "public.orders_raw"}}, "inputs read public.orders_raw more than once"),
    ({"customers": {"table": "public.customers", "after": "1d"}}, "they need the input's partition_key"),
])
def test_the_spec_refuses_inputs_it_cannot_read(inputs, refused):
    with pytest.raises(SpecError, match=refused):
        spec_from_mapping({**INPUTS_SPEC, "inputs": inputs})
    with pytest.raises(SpecError, match="are read by transform_sql"):
        spec_from_mapping({**{k: v for k, v in INPUTS_SPEC.items() if k != "transform_sql"}})
    with pytest.raises(SpecError, match="`snapshot: immutable` with inputs is not built yet"):
        spec_from_mapping({**INPUTS_SPEC, "source": {"table": "public.orders_raw", "snapshot": "immutable"}})


def test_inspect_names_each_input_it_cannot_read(conn, factory, url_env):
    from backfill_assets.core.resolve import inspect
    load_inputs(conn)
    conn.execute("ALTER TABLE public.payments ALTER COLUMN paid_on TYPE timestamptz")
    conn.commit()
    spec = spec_from_mapping({**INPUTS_SPEC, "inputs": {**INPUTS_SPEC["inputs"], "devices": {"table": "public.devices"}}})
    problems = inspect(spec, factory).problems
    assert problems == [
        "input payments: its partition_key paid_on is timestamp with time zone, the source's order_date is date; an "
        "input is read for the same partitions through a column of the same type (cast it in a view)",
        "input devices: table public.devices does not exist (or this role cannot see it)"]


def test_a_second_fact_read_per_window_reaches_after_it_by_its_offset(conn, factory, url_env):
    """Hours of events, each with the clicks in the hour after it: a click after its event's
    window is read because the input is widened by `after: 1h`, and is missed without it."""
    from backfill_assets_tests.support.windows import FALL, create_events, events_spec, utc
    create_events(conn, FALL)
    conn.execute("CREATE TABLE public.clicks (clicked_at timestamptz, event_id bigint)")
    conn.cursor().executemany("INSERT INTO public.clicks VALUES (%s, %s)", [
        (utc(2024, 11, 3, 4, 10), 1),  # before event 1's newest version (04:30): not its click
        (utc(2024, 11, 3, 5, 20), 1),  # 50 minutes after it, in the next window: read only when widened
        (utc(2024, 11, 3, 7, 50), 4)])  # another window's event
    conn.commit()
    transform = ("SELECT s.created_at, s.event_id, s.updated_at, s.seq, s.amount, (SELECT count(*) FROM clicks AS c "
                 "WHERE c.event_id = s.event_id AND c.clicked_at >= s.created_at "
                 "AND c.clicked_at - s.created_at < interval '1 hour')::text AS note FROM source AS s")
    hours = "2024-11-03T00:00-0400"

    def spec_for(after: str | None):
        given = {"table": "public.clicks", "partition_key": "clicked_at", **({"after": after} if after else {})}
        return events_spec(source={"table": "public.events_raw"}, inputs={"clicks": given}, transform_sql=transform,
                           name=f"events_clicks_{after or 'none'}")

    narrow = make_plan(spec_for(None), PartitionRequest(hours), factory)
    widened, result = plan_approve_apply(conn, factory, spec_for("1h"), hours)
    assert widened.document.snapshot.inputs[0].row_count == 2 and narrow.document.snapshot.inputs[0].row_count == 1
    assert widened.document.partitions[0].stage_a != narrow.document.partitions[0].stage_a
    assert [p["status"] for p in result.partitions] == ["verified"]
    assert conn.execute("SELECT note FROM public.events_hourly WHERE event_id = 1").fetchall() == [("1",)]


def test_the_source_sensor_requests_the_partitions_a_moved_input_feeds_once(conn, factory, url_env):
    """After the plan, a tick finds nothing; a dimension updated since makes the next tick
    request every partition that snapshot read it for, naming the input, and only once; the
    source's own gates are unchanged."""
    from backfill_assets.core.build import open_build_engine
    from backfill_assets_tests.support.source_writes import write
    load_inputs(conn)
    spec = spec_from_mapping(INPUTS_SPEC)
    assert make_plan(spec, PartitionRequest(DAYS), factory).status == "ready"

    def tick(state):
        with factory() as c, open_build_engine(c, factory, spec) as engine:
            return engine.source_moves(state, None)

    first = tick(None)
    assert first.changed == {}
    assert tick(first.state).changed == {}
    write(factory, conn, "UPDATE public.customers SET region = 'east' WHERE customer_id = 12")
    moved = tick(first.state)
    assert sorted(moved.changed) == ["2024-01-01", "2024-01-02", "2024-01-03"]
    assert {v.split()[:2] == ["input", "customers"] for v in moved.changed.values()} == {True}
    assert any("input customers (public.customers) moved" in n for n in moved.notes), moved.notes
    assert tick(moved.state).changed == {}  # reported once
    # A payment of a day outside the plan moves no pin; one on a planned day does.
    write(factory, conn, "INSERT INTO public.payments VALUES ('2024-01-09', 1, 1.00)")
    quiet = tick(moved.state)
    assert quiet.changed == {}
    write(factory, conn, "INSERT INTO public.payments VALUES ('2024-01-02', 3, 1.00)")
    assert sorted(tick(quiet.state).changed) == ["2024-01-01", "2024-01-02", "2024-01-03"]


def test_a_pin_is_read_again_for_every_partition_its_snapshot_read(conn, factory, url_env):
    """Days 1-3 planned, then day 3 again alone: the first snapshot is still the newest of days
    1 and 2, and its pin of payments covers days 1-3, so it is read again over days 1-3, not
    over the two days alone (which would differ from the pin with nothing moved); a payment on
    day 1 then requests days 1 and 2 only."""
    from backfill_assets.core.build import open_build_engine
    from backfill_assets_tests.support.source_writes import write
    load_inputs(conn)
    conn.execute("INSERT INTO public.payments VALUES ('2024-01-03', 4, 9.00)")  # day 3 has a payment too
    conn.commit()
    spec = spec_from_mapping(INPUTS_SPEC)
    assert make_plan(spec, PartitionRequest(DAYS), factory).status == "ready"
    assert make_plan(spec, PartitionRequest("2024-01-03"), factory).status == "ready"

    def tick(state):
        with factory() as c, open_build_engine(c, factory, spec) as engine:
            return engine.source_moves(state, None)

    first = tick(None)
    assert first.changed == {}
    write(factory, conn, "INSERT INTO public.payments VALUES ('2024-01-20', 1, 1.00)")
    quiet = tick(first.state)
    assert quiet.changed == {}
    write(factory, conn, "INSERT INTO public.payments VALUES ('2024-01-01', 1, 1.00)")
    assert sorted(tick(quiet.state).changed) == ["2024-01-01", "2024-01-02"]


COPY_SPEC = {**INPUTS_SPEC, "source": {"table": "public.orders_raw", "snapshot": "copy"}}


def test_with_snapshot_copy_each_input_is_copied_sealed_and_read_from_its_copy_in_a_later_step(conn, factory, url_env):
    """`snapshot: copy`: the snapshot step copies each input beside the source (the rows the
    builds read: the dimension whole, the payments of the plan's days), seals it and names it
    in the pins; a dimension changed before the stages step reaches neither stage; a copy
    changed by hand is refused by the stages step and by approval."""
    from backfill_assets.core.approve import approve_plan
    from backfill_assets.core.errors import ApprovalError, SnapshotError
    from backfill_assets.core.plan import snapshot_step, stages_step
    load_inputs(conn)
    spec = spec_from_mapping(COPY_SPEC)
    expected = make_plan(spec, PartitionRequest(DAYS), factory)
    assert expected.status == "ready", expected.problems
    pins = {p.name: p for p in expected.document.snapshot.inputs}
    assert pins["customers"].copied_to.startswith("backfill_control.snap_") and pins["payments"].row_count == 3
    assert _written_after_apply(conn, factory, spec, expected) == _naive(conn)

    snap = snapshot_step(spec, PartitionRequest(DAYS), factory)
    conn.execute("UPDATE public.customers SET region = 'moved'")
    conn.execute("INSERT INTO public.payments VALUES ('2024-01-01', 2, 100.00)")
    conn.commit()
    _, plan, _, _ = stages_step(spec, snap.snapshot_id, factory)
    assert plan.plan_id == expected.plan_id  # built from the copies, as before the change

    conn.execute(f"UPDATE {pins['customers'].copied_to} SET region = 'tampered' WHERE customer_id = 10")
    conn.commit()
    with pytest.raises(SnapshotError, match="of input customers changed since it was taken"):
        stages_step(spec, snap.snapshot_id, factory)
    with factory() as c, pytest.raises(ApprovalError, match="of input customers changed since it was taken"):
        approve_plan(c, factory, spec, plan, "tester")


def _written_after_apply(conn, factory, spec, plan) -> list[tuple]:
    from backfill_assets.core.apply import apply_plan
    from backfill_assets.core.approve import approve_plan
    with factory() as c:
        approve_plan(c, factory, spec, plan, "tester")
    assert {p["status"] for p in apply_plan(spec, plan.plan_id, factory, run_id="copy-1").partitions} == {"verified"}
    return _written(conn)
