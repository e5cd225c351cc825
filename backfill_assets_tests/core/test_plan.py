"""The plan against a real PostgreSQL: snapshot, two builds, fingerprints, the stored plan."""

from __future__ import annotations

import datetime as dt
import re
import threading

import psycopg
import pytest
from psycopg import sql

from backfill_assets.cli import demo
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import ApprovalError, ConcurrentRunError, SnapshotError, SourceDataError, SpecError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest, TableRef
from backfill_assets_tests.support.flows import ALL_DAYS, check_against_newest_wins, expected_hash, target_hashes
from backfill_assets_tests.support.specs import make_spec

STATIC = make_spec(records_can_move=False)  # keys stay in their partition










def control_schema_exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regnamespace('backfill_control') IS NOT NULL").fetchone()[0]


def test_plan_builds_both_stages_equal_to_an_independent_newest_wins(unmoved_db, factory):
    before = target_hashes(unmoved_db)
    plan = make_plan(STATIC, ALL_DAYS, factory)
    assert plan.status == "ready" and plan.problems == ()
    rows = demo.source_rows(moved=False)
    check_against_newest_wins(unmoved_db, plan, rows, per_day=True, days=demo.DEMO_DAYS)
    # The source side: every row read is kept, dropped for a NULL key, or collapsed.
    day1 = plan.as_json()["partitions"][0]["source"]
    raw = [r for r in rows if r[0] == dt.date(2024, 1, 1)]
    assert day1["rows_read"] == len(raw)
    assert day1["null_key_rows_dropped"] == sum(1 for r in raw if r[1] is None)
    kept = plan.as_json()["partitions"][0]["stage_a"]["row_count"]
    assert day1["duplicates_collapsed"] == len(raw) - day1["null_key_rows_dropped"] - kept > 0
    # Plan never writes to the target.
    assert target_hashes(unmoved_db) == before


def test_moved_records_add_their_old_and_new_partitions_with_reasons(demo_db, factory):
    plan = make_plan(make_spec(), ALL_DAYS, factory)
    assert plan.status == "ready"
    days = [*demo.DEMO_DAYS, dt.date(2024, 1, 8)]
    check_against_newest_wins(demo_db, plan, demo.source_rows(), per_day=False, days=days)
    (added,) = plan.as_json()["added_partitions"]
    moved_out = demo.MOVES[1][0]
    assert added == {"partition": "2024-01-08",
                     "reasons": [f"key (order_id={moved_out}) moves here from 2024-01-07"]}
    assert plan.as_json()["requested_partitions"] == [d.isoformat() for d in demo.DEMO_DAYS]
    # Partitions linked by a moved key are replaced together.
    groups = plan.as_json()["replace_groups"]
    assert ["2024-01-03", "2024-01-04"] in groups and ["2024-01-07", "2024-01-08"] in groups
    assert ["2024-01-01"] in groups


def test_empty_partition_is_planned_as_empty(demo_db, factory):
    plan = make_plan(make_spec(), PartitionRequest(demo.EMPTY_DAY.isoformat()), factory)
    (entry,) = plan.as_json()["partitions"]
    assert entry["stage_a"]["row_count"] == 0 and entry["stage_a"]["total"] == "0"
    assert entry["stage_a"]["content_hash"] == expected_hash(demo_db, [])


def test_second_plan_gives_the_same_plan_id_and_the_same_snapshot(demo_db, factory):
    first = make_plan(make_spec(), ALL_DAYS, factory)
    second = make_plan(make_spec(), ALL_DAYS, factory)
    assert first.plan_id == second.plan_id and first.document == second.document
    assert demo_db.execute("SELECT count(*) FROM backfill_control.plans").fetchone()[0] == 1
    assert demo_db.execute("SELECT count(*) FROM backfill_control.snapshots").fetchone()[0] == 1
    stored = find_plan(demo_db, make_spec(), first.plan_id)
    assert stored.status == "ready" and stored.as_json()["plan_id"] == first.plan_id


def test_plan_id_changes_with_the_source_and_the_transform_version(demo_db, factory):
    base = make_plan(make_spec(), ALL_DAYS, factory)
    assert make_plan(make_spec(transform_version="v2"), ALL_DAYS, factory).plan_id != base.plan_id
    demo_db.execute("UPDATE public.orders_raw SET note = 'changed' WHERE order_id = %s", (dt.date(2024, 1, 2).toordinal() * 1000,))
    changed = make_plan(make_spec(), ALL_DAYS, factory)
    assert changed.plan_id != base.plan_id
    assert changed.as_json()["snapshot"]["id"] != base.as_json()["snapshot"]["id"]
    moved = {p["partition"] for p, q in zip(changed.as_json()["partitions"], base.as_json()["partitions"]) if p != q}
    assert moved == {"2024-01-02"}


def test_the_snapshot_copy_isolates_the_builds_from_later_source_changes(demo_db, factory):
    plan = make_plan(make_spec(), ALL_DAYS, factory)
    snap = plan.as_json()["snapshot"]["fingerprint"][:16]
    demo_db.execute("DELETE FROM public.orders_raw")
    rows = demo_db.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier("backfill_control", f"snap_{snap}"))
    ).fetchone()[0]
    assert rows == len([r for r in demo.source_rows()])


def _copy_of(plan) -> sql.Identifier:
    return sql.Identifier("backfill_control", f"snap_{plan.as_json()['snapshot']['fingerprint'][:16]}")


def test_a_later_plan_reuses_an_intact_copy_and_copies_again_when_its_seal_broke(demo_db, factory):
    first = make_plan(make_spec(), ALL_DAYS, factory)
    events: list[ProgressEvent] = []
    make_plan(make_spec(), ALL_DAYS, factory, progress=events.append)
    assert any(e.step == "snapshot" and e.status == "reused" for e in events)
    demo_db.execute(sql.SQL("UPDATE {} SET amount = amount + 1 WHERE order_date = %s").format(_copy_of(first)),
                    (dt.date(2024, 1, 3),))
    events.clear()
    again = make_plan(make_spec(), ALL_DAYS, factory, progress=events.append)
    assert any(e.step == "snapshot" and e.status == "copied" and e.rows for e in events)
    assert not any(e.status == "reused" for e in events)  # the broken copy was replaced
    assert again.plan_id == first.plan_id  # built from the source's rows, not the altered ones
    total = sql.SQL("SELECT sum(amount) FROM {} WHERE order_date = %s")
    day = (dt.date(2024, 1, 3),)
    assert demo_db.execute(total.format(_copy_of(first)), day).fetchone() == demo_db.execute(
        total.format(sql.Identifier("public", "orders_raw")), day).fetchone()


@pytest.mark.parametrize("change", [
    "UPDATE {copy} SET note = note WHERE order_id = (SELECT min(order_id) FROM {copy})",  # same value, new version
    "DELETE FROM {copy} WHERE order_id = (SELECT min(order_id) FROM {copy})",
    "INSERT INTO {copy} SELECT * FROM {copy} LIMIT 1",
    "WITH gone AS (DELETE FROM {copy} WHERE order_id = (SELECT min(order_id) FROM {copy}) RETURNING *) "
    "INSERT INTO {copy} SELECT * FROM gone",  # same rows, same count, rewritten
    "ALTER TABLE {copy} DROP COLUMN note; ALTER TABLE {copy} ADD COLUMN note text",
    "ALTER TABLE {copy} ALTER COLUMN amount TYPE numeric(14,4)",
])
def test_any_change_to_a_copy_breaks_its_seal(demo_db, factory, change):
    from backfill_assets.core.engines.postgres.copies import copy_intact
    from backfill_assets.core.engines.postgres.resolve import resolve

    plan = make_plan(make_spec(), ALL_DAYS, factory)
    copy = TableRef("backfill_control", f"snap_{plan.as_json()['snapshot']['fingerprint'][:16]}")
    ctx = resolve(demo_db, make_spec(), [p["partition"] for p in plan.as_json()["partitions"]])
    fingerprint = plan.as_json()["snapshot"]["fingerprint"]
    demo_db.execute(b"VACUUM FREEZE backfill_control." + copy.name.encode())  # freezing is no change
    assert copy_intact(demo_db, ctx, copy, fingerprint)
    for statement in change.split("; "):
        demo_db.execute(sql.SQL(statement).format(copy=sql.Identifier(copy.schema, copy.name)))
    assert not copy_intact(demo_db, ctx, copy, fingerprint)


def test_a_copy_altered_after_the_plan_is_refused_by_approval_and_by_the_stages_step(demo_db, factory):
    from backfill_assets.core.errors import SnapshotError
    from backfill_assets.core.plan import snapshot_step, stages_step

    plan = make_plan(make_spec(), ALL_DAYS, factory)
    demo_db.execute(sql.SQL("UPDATE {} SET note = 'x' WHERE order_date = %s").format(_copy_of(plan)),
                    (dt.date(2024, 1, 2),))
    with pytest.raises(ApprovalError, match="changed since it was taken; plan again"):
        approve_plan(demo_db, factory, make_spec(), find_plan(demo_db, make_spec(), plan.plan_id), "alice")
    with pytest.raises(SnapshotError, match="changed since it was taken; take the snapshot again"):
        stages_step(make_spec(), plan.as_json()["snapshot"]["id"], factory)
    snapshot = snapshot_step(make_spec(), ALL_DAYS, factory)  # copies again
    assert stages_step(make_spec(), snapshot.snapshot_id, factory)[1].plan_id == plan.plan_id


def test_ties_on_every_ordering_column_are_refused_and_nothing_is_written(unmoved_db, factory):
    demo_db = unmoved_db
    order_id = dt.date(2024, 1, 3).toordinal() * 1000 + 5
    demo_db.execute(
        "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount + 1, 'tie', note "
        "FROM public.orders_raw WHERE order_id = %s ORDER BY ingest_seq DESC LIMIT 1", (order_id,)
    )
    with pytest.raises(SourceDataError) as err:
        make_plan(STATIC, ALL_DAYS, factory)
    assert f"partition 2024-01-03, key (order_id={order_id})" in str(err.value)
    assert "tiebreak" in str(err.value)
    assert not control_schema_exists(demo_db)


def test_ties_between_partitions_are_refused_when_records_can_move(demo_db, factory):
    # Another version of a moved order, on its old day, tying with the newest one.
    order_id, old, _ = demo.MOVES[0]
    demo_db.execute(
        "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "SELECT %s, order_id, customer_id, updated_at, ingest_seq, amount, status, note "
        "FROM public.orders_raw WHERE order_id = %s ORDER BY ingest_seq DESC LIMIT 1", (old, order_id)
    )
    with pytest.raises(SourceDataError, match=rf"key \(order_id={order_id}\): 2 different rows"):
        make_plan(make_spec(), ALL_DAYS, factory)
    assert not control_schema_exists(demo_db)


def test_exact_duplicate_rows_are_not_ties(demo_db, factory):
    # The demo already re-ingests exact duplicates (same ingest_seq); add one more.
    demo_db.execute(
        "INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note "
        "FROM public.orders_raw WHERE order_id IS NOT NULL ORDER BY ingest_seq LIMIT 1"
    )
    assert make_plan(make_spec(), ALL_DAYS, factory).status == "ready"


def test_nulls_in_an_ordering_column_need_a_declared_placement(demo_db, factory):
    demo_db.execute("ALTER TABLE public.orders_raw ALTER COLUMN updated_at DROP NOT NULL")
    demo_db.execute("UPDATE public.orders_raw SET updated_at = NULL WHERE ingest_seq = 7")
    with pytest.raises(SourceDataError, match="updated_at: 1 row"):
        make_plan(make_spec(), ALL_DAYS, factory)
    assert not control_schema_exists(demo_db)
    declared = make_spec(ordering=[
        {"column": "updated_at", "direction": "desc", "nulls": "last"},
        {"column": "ingest_seq", "direction": "desc"},
    ])
    assert make_plan(declared, ALL_DAYS, factory).status == "ready"


@pytest.mark.parametrize(
    "changes, partitions, message",
    [
        ({"source": {"table": "public.missing", "snapshot": "copy"}}, "2024-01-01", "does not exist"),
        ({"records_can_move": False, "transform_sql": "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
                           "status, note || now()::text AS note FROM source"}, "2024-01-01", "not IMMUTABLE"),
        ({}, "2024-02-30", "is not a date"),
        ({}, "yesterday", "is not a date"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(demo_db, factory, changes, partitions, message):
    with pytest.raises(SpecError, match=message):
        make_plan(make_spec(**changes), PartitionRequest(partitions), factory)
    assert not control_schema_exists(demo_db)


def test_missing_grain_constraint_is_refused_before_anything_is_written(demo_db, factory):
    demo_db.execute("ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key")
    with pytest.raises(SpecError, match='ADD CONSTRAINT "orders_daily_order_id_key" UNIQUE'):
        make_plan(make_spec(), ALL_DAYS, factory)
    assert not control_schema_exists(demo_db)


def test_a_transform_is_applied_to_both_stages(unmoved_db, factory):
    demo_db = unmoved_db
    transform = ("SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
                 "upper(status) AS status, note FROM source WHERE status <> 'draft'")
    spec = make_spec(transform_sql=transform, transform_version="upper-v1", records_can_move=False)
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "ready"
    statuses = {r[0] for r in demo_db.execute(
        "SELECT DISTINCT status FROM backfill_control.orders_daily__stage_a").fetchall()}
    assert statuses <= {"PLACED", "CORRECTED", "SHIPPED"} and "PLACED" in statuses
    assert plan.as_json()["transform_sql_sha256"] is not None


def test_builds_that_disagree_refuse_the_plan_and_leave_nothing_to_apply(unmoved_db, factory):
    demo_db = unmoved_db
    # A function that lies about being IMMUTABLE, trusted by the spec, passes the guard;
    # building twice catches it.
    demo_db.execute(
        "CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$"
    )
    transform = ("SELECT order_date, order_id, customer_id + jitter() AS customer_id, updated_at, "
                 "ingest_seq, amount, status, note FROM source")
    spec = make_spec(transform_sql=transform, records_can_move=False,
                     trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}])
    plan = make_plan(spec, PartitionRequest("2024-01-01,2024-01-05"), factory)
    assert plan.status == "refused"
    assert any("2024-01-01: stages A and B differ on content_hash" in p for p in plan.problems)
    by_day = {p["partition"]: p for p in plan.as_json()["partitions"]}
    assert not by_day["2024-01-01"]["match"] and by_day["2024-01-05"]["match"]
    left = demo_db.execute(
        "SELECT count(*) FROM backfill_control.orders_daily__stage_a WHERE order_date = '2024-01-01'"
    ).fetchone()[0]
    assert left == 0
    assert find_plan(demo_db, spec, plan.plan_id).status == "refused"


def test_immutable_source_changed_during_the_plan_is_refused(unmoved_db, factory, db_url):
    spec = make_spec(source={"table": "public.orders_raw", "snapshot": "immutable"}, records_can_move=False)
    writer = psycopg.connect(db_url.reveal(), autocommit=True)
    changed = threading.Event()

    def progress(event: ProgressEvent) -> None:
        # A writer sneaks in after the source was pinned, while the stages are built.
        if event.step.startswith("stage") and event.partition is not None and not changed.is_set():
            changed.set()
            writer.execute("UPDATE public.orders_raw SET amount = amount + 1 WHERE order_date = '2024-01-02'")

    with writer, pytest.raises(SnapshotError, match="changed during the plan in partition.s. 2024-01-02"):
        make_plan(spec, ALL_DAYS, factory, progress=progress)


def test_immutable_source_plan_reads_the_source_directly(unmoved_db, factory):
    demo_db = unmoved_db
    spec = make_spec(source={"table": "public.orders_raw", "snapshot": "immutable"}, records_can_move=False)
    plan = make_plan(spec, ALL_DAYS, factory)
    copy_plan = make_plan(STATIC, ALL_DAYS, factory)
    assert plan.status == "ready" and plan.as_json()["snapshot"]["mode"] == "immutable"
    assert [p["stage_a"] for p in plan.as_json()["partitions"]] == [p["stage_a"] for p in copy_plan.as_json()["partitions"]]
    tables = demo_db.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill_control' AND tablename ~ '^snap_[0-9a-f]{16}$'"
    ).fetchone()[0]
    assert tables == 1  # only the copy plan made a snapshot table


def test_a_second_concurrent_plan_of_the_same_spec_is_refused(demo_db, factory, db_url):
    with psycopg.connect(db_url.reveal(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                      ("backfill_assets:plan:backfill_control:orders_daily",))
        with pytest.raises(ConcurrentRunError, match="already running"):
            make_plan(make_spec(), ALL_DAYS, factory)


def test_integer_and_text_partition_keys(conn, factory):
    conn.execute("CREATE TABLE public.ev (region text, batch int, k text, v numeric, seq int)")
    conn.execute("CREATE TABLE public.ev_by_region (region text, k text, v numeric, seq int, UNIQUE (region, k))")
    conn.execute("CREATE TABLE public.ev_by_batch (batch int, k text, v numeric, seq int, UNIQUE (batch, k))")
    conn.execute(
        "INSERT INTO public.ev (region, batch, k, v, seq) VALUES "
        "('eu', 1, 'a', 1, 1), ('eu', 1, 'a', 2, 2), ('us', 2, 'a', 5, 3), ('eu', 2, 'Z', 1, 4), "
        "('us', 3, 'é', 1.5, 5)"
    )
    common = dict(business_key=["k"], ordering=[{"column": "seq", "direction": "desc"}], total="v",
                  records_can_move=False)
    by_region = make_spec(source={"table": "public.ev", "snapshot": "copy"}, target={"table": "public.ev_by_region"},
                          partition_key="region", columns=["region", "k", "v", "seq"], **common)
    plan = make_plan(by_region, PartitionRequest("eu,us,none"), factory)
    assert [(p["partition"], p["stage_a"]["row_count"], p["stage_a"]["total"]) for p in plan.as_json()["partitions"]] == [
        ("eu", 2, "3"), ("none", 0, "0"), ("us", 2, "6.5")]
    by_batch = make_spec(name="by_batch", source={"table": "public.ev", "snapshot": "copy"},
                         target={"table": "public.ev_by_batch"}, partition_key="batch",
                         columns=["batch", "k", "v", "seq"], **common)
    plan = make_plan(by_batch, PartitionRequest("1..3"), factory)
    assert [p["partition"] for p in plan.as_json()["partitions"]] == ["1", "2", "3"]
    assert all(p["match"] for p in plan.as_json()["partitions"])


def test_the_step_by_step_path_gives_the_same_plan_as_make_plan(demo_db, factory):
    from backfill_assets.core.plan import snapshot_step, stages_step

    whole = make_plan(make_spec(), ALL_DAYS, factory)
    snapshot = snapshot_step(make_spec(), ALL_DAYS, factory)
    assert snapshot.snapshot_id == whole.as_json()["snapshot"]["id"]
    assert snapshot.requested == [d.isoformat() for d in demo.DEMO_DAYS]
    ctx, plan, a, b = stages_step(make_spec(), snapshot.snapshot_id, factory)
    assert list(a) == list(b) == ctx.labels == [p["partition"] for p in whole.as_json()["partitions"]]
    assert plan.plan_id == whole.plan_id


def test_the_stages_step_refuses_a_snapshot_that_does_not_exist(unmoved_db, factory):
    from backfill_assets.core.errors import SnapshotError
    from backfill_assets.core.plan import stages_step

    make_plan(STATIC, PartitionRequest("2024-01-01"), factory)  # the control schema exists
    with pytest.raises(SnapshotError, match="snapshot copy-0123456789abcdef does not exist"):
        stages_step(STATIC, "copy-0123456789abcdef", factory)


def test_source_changes_name_the_partitions_whose_source_moved_on(unmoved_db, factory, conn):
    from backfill_assets.core.engines.postgres.snapshot import source_changes

    assert source_changes(conn, STATIC) == {}
    make_plan(STATIC, PartitionRequest("2024-01-01..2024-01-03"), factory)
    assert source_changes(conn, STATIC) == {}
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'late fix' WHERE order_date = '2024-01-02'")
    assert list(source_changes(conn, STATIC)) == ["2024-01-02"]


def test_a_source_that_comes_back_to_an_earlier_state_is_snapshotted_as_the_newest(unmoved_db, factory, conn):
    """A -> B -> A: the third snapshot has the first one's id (content-addressed) and is the
    newest, so the sensor sees no change and the stages step builds from it, not from B."""
    from backfill_assets.core.engines.postgres.snapshot import source_changes
    from backfill_assets.core.plan import snapshot_step
    from backfill_assets.core.store import control

    day = PartitionRequest("2024-01-02")
    (seq, note) = unmoved_db.execute(
        "SELECT ingest_seq, note FROM public.orders_raw WHERE order_date = '2024-01-02' "
        "ORDER BY ingest_seq LIMIT 1").fetchone()
    first = snapshot_step(STATIC, day, factory)
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'late fix' WHERE ingest_seq = %s", (seq,))
    changed = snapshot_step(STATIC, day, factory)
    assert list(source_changes(conn, STATIC)) == []
    unmoved_db.execute("UPDATE public.orders_raw SET note = %s WHERE ingest_seq = %s", (note, seq))
    assert list(source_changes(conn, STATIC)) == ["2024-01-02"]  # back to A, newest is B
    again = snapshot_step(STATIC, day, factory)
    assert changed.snapshot_id != first.snapshot_id and again.snapshot_id == first.snapshot_id
    assert source_changes(conn, STATIC) == {}
    newest = control.newest_snapshots(conn, "backfill_control", str(STATIC.source_ref), STATIC.partition_key, ["2024-01-02"])
    assert newest["2024-01-02"][0] == first.snapshot_id


def test_a_control_schema_from_an_older_version_is_upgraded_in_place(unmoved_db, factory, conn):
    from backfill_assets.core.store import control

    make_plan(STATIC, PartitionRequest("2024-01-01"), factory)
    conn.execute("ALTER TABLE backfill_control.snapshots DROP COLUMN scope")
    conn.execute("DROP TABLE backfill_control.stage_builds")
    assert control.control_ready(conn, "backfill_control")
    assert conn.execute("SELECT to_regclass('backfill_control.stage_builds') IS NOT NULL").fetchone()[0]
    conn.execute("DROP TABLE backfill_control.previews")
    assert control.control_ready(conn, "backfill_control")
    assert conn.execute("SELECT to_regclass('backfill_control.previews') IS NOT NULL").fetchone()[0]
    tables = {"builds": "stage_builds", "copies": "snapshot_copies"}
    for role, column in control._ADDED_COLUMNS:  # every column added after its table, each found missing
        table = tables.get(role, role)
        conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(
            sql.Identifier("backfill_control", table), sql.Identifier(column)))
        assert control.control_ready(conn, "backfill_control")
        assert conn.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s "
                            "AND NOT attisdropped", (f"backfill_control.{table}", column)).fetchone()[0] == 1
    assert make_plan(STATIC, PartitionRequest("2024-01-01"), factory).status == "ready"


def test_a_partition_whose_rows_all_lack_a_business_key_is_refused(unmoved_db, factory):
    unmoved_db.execute("UPDATE public.orders_raw SET order_id = NULL WHERE order_date = '2024-01-03'")
    with pytest.raises(SourceDataError, match=r"every source row .* NULL business key .*partition 2024-01-03: 42 row"):
        make_plan(STATIC, ALL_DAYS, factory)
    assert not control_schema_exists(unmoved_db)


def _versions_spec(conn: psycopg.Connection, rows: list[tuple], *, version_written: bool):
    """A source whose rows are ordered by a numeric ``version``, written to the target or not."""
    written = ["version"] if version_written else []
    target_columns = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
        for name, kind in [("d", "int"), ("k", "int"), *[("version", "numeric")] * version_written, ("v", "int")]
    )
    conn.execute("CREATE TABLE public.ev (d int, k int, version numeric, v int)")
    conn.execute(sql.SQL("CREATE TABLE public.ev_out ({}, UNIQUE (d, k))").format(target_columns))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.ev (d, k, version, v) VALUES (%s, %s, %s::numeric, %s)", rows)
    return make_spec(source={"table": "public.ev", "snapshot": "copy"}, target={"table": "public.ev_out"},
                     partition_key="d", business_key=["k"], ordering=[{"column": "version", "direction": "desc"}],
                     columns=["d", "k", *written, "v"], total="v", records_can_move=False)


def test_rows_that_tie_as_values_but_differ_in_text_form_are_refused(conn, factory):
    # 1.5 = 1.50 as numerics, so newest-wins cannot choose between these rows, yet they
    # would be written (and hashed) differently: a tie, though every other column is equal.
    rows = [(1, 1, "1.5", 7), (1, 1, "1.50", 7), (1, 2, "1", 7), (1, 2, "2", 7)]
    spec = _versions_spec(conn, rows, version_written=True)
    with pytest.raises(SourceDataError) as err:
        make_plan(spec, PartitionRequest("1"), factory)
    assert "partition 1, key (k=1): 2 different rows" in str(err.value)


def test_rows_that_differ_only_in_the_text_of_a_column_not_written_are_not_a_tie(conn, factory):
    # version orders the rows but is not written: whichever wins, the target row is the same.
    spec = _versions_spec(conn, [(1, 1, "1.5", 7), (1, 1, "1.50", 7)], version_written=False)
    plan = make_plan(spec, PartitionRequest("1"), factory)
    assert plan.status == "ready" and plan.as_json()["partitions"][0]["stage_a"]["row_count"] == 1


def test_nobody_can_change_the_copy_while_the_stages_are_built_from_it(demo_db, factory):
    from backfill_assets.core.plan import snapshot_step, stages_step

    snapshot = snapshot_step(make_spec(), ALL_DAYS, factory)
    copy = sql.Identifier(snapshot.relation.schema, snapshot.relation.name)
    refused: list[str] = []

    def try_to_write(event: ProgressEvent) -> None:
        if refused or not event.step.startswith("stage "):
            return
        with factory() as writer:
            writer.execute(b"SET lock_timeout = '200ms'")
            try:
                writer.execute(sql.SQL("UPDATE {} SET note = 'late' WHERE order_date = %s").format(copy),
                               (dt.date(2024, 1, 3),))
            except psycopg.errors.LockNotAvailable as err:
                refused.append(type(err).__name__)

    ctx, plan, a, b = stages_step(make_spec(), snapshot.snapshot_id, factory, progress=try_to_write)
    assert refused and set(refused) == {"LockNotAvailable"}  # each build thread may try once
    assert plan.status == "ready"


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_write_the_copy_lock_waited_for_is_seen_under_any_default_isolation(demo_db, factory, db_url, isolation):
    # The lock waits for a writer already changing the copy; the seal check after it must see
    # that write even when the server's default isolation would fix an older snapshot.
    from backfill_assets.core.plan import snapshot_step, stages_step

    snapshot = snapshot_step(make_spec(), ALL_DAYS, factory)
    name = psycopg.conninfo.conninfo_to_dict(db_url.reveal())["dbname"]
    demo_db.execute(sql.SQL("ALTER DATABASE {} SET default_transaction_isolation = {}").format(
        sql.Identifier(name), sql.Literal(isolation)))
    copy = sql.Identifier(snapshot.relation.schema, snapshot.relation.name)
    with factory() as writer:
        writer.execute(b"BEGIN")
        writer.execute(sql.SQL("UPDATE {} SET amount = amount + 1000 WHERE order_date = %s").format(copy),
                       (dt.date(2024, 1, 3),))
        outcome: dict[str, object] = {}

        def stages() -> None:
            try:
                outcome["plan"] = stages_step(make_spec(), snapshot.snapshot_id, factory)
            except SnapshotError as err:
                outcome["refused"] = str(err)

        thread = threading.Thread(target=stages)
        thread.start()
        thread.join(timeout=1.0)  # the guard is now waiting for the writer's lock
        writer.execute(b"COMMIT")
        thread.join()
    assert "changed since it was taken" in str(outcome.get("refused")), outcome


def test_the_copy_guard_outlives_a_short_idle_in_transaction_timeout(demo_db, factory, db_url):
    import time

    name = psycopg.conninfo.conninfo_to_dict(db_url.reveal())["dbname"]
    demo_db.execute(sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = '200ms'").format(
        sql.Identifier(name)))
    slow_builds = lambda e: time.sleep(0.5) if (e.step, e.done) == ("stage a", 1) else None  # noqa: E731
    assert make_plan(make_spec(), ALL_DAYS, factory, progress=slow_builds).status == "ready"


@pytest.mark.parametrize(("change", "reason"), [
    ("DELETE FROM backfill_control.snapshot_copies", "has no seal (an earlier version made it)"),
    ("UPDATE backfill_control.snapshot_copies SET writer_txid = writer_txid - 2147483648",
     "is too old for its seal to be trusted"),
    ("ALTER TABLE {copy} RENAME TO gone; CREATE VIEW {copy} AS SELECT * FROM backfill_control.gone",
     "is no longer a plain table"),
    ("DROP TABLE {copy}", "is gone"),
])
def test_approval_names_why_a_copy_is_not_trusted(demo_db, factory, change, reason):
    plan = make_plan(make_spec(), ALL_DAYS, factory)
    for statement in change.split("; "):
        demo_db.execute(sql.SQL(statement).format(copy=_copy_of(plan)))
    with pytest.raises(ApprovalError, match=re.escape(reason) + "; plan again"):
        approve_plan(demo_db, factory, make_spec(), find_plan(demo_db, make_spec(), plan.plan_id), "alice")
