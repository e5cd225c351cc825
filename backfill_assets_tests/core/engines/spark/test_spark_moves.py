"""records_can_move on Spark, over a Parquet folder source and target: a key's newest version
decides its partition, found across every partition (the pinned ones as pinned, the others as
they are); a partition a new key's newest version lies in is added; and a plan whose moved keys
link two partitions is refused before anything moves, since a folder swaps one partition at a
time."""

from __future__ import annotations

import datetime as dt
import decimal

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import source_table
from backfill_assets_tests.support.spark_lakes import spark_spec, target_rows, write_parquet_source

T0 = dt.datetime(2024, 1, 1, 8, tzinfo=dt.timezone.utc)
T1 = dt.datetime(2024, 1, 5, 8, tzinfo=dt.timezone.utc)


def _row(day: int, key: int, when: dt.datetime, seq: int, status: str) -> tuple:
    return (dt.date(2024, 1, day), key, 1, when, seq, decimal.Decimal("1.00"), status, None)


def _ids(tmp_path, day: int) -> list[int]:
    return [r[1] for r in target_rows(tmp_path / "orders_daily", dt.date(2024, 1, day))]


def test_a_new_key_adds_its_partition_and_a_moved_key_refuses_the_plan_before_anything_moves(tmp_path, spark,
                                                                                          factory, url_env):
    folder = tmp_path / "orders_raw"
    # Order 7's newest version lies on 2024-01-03, which is not asked for: it is added.
    write_parquet_source(folder, source_table([_row(1, 5, T0, 1, "placed"), _row(1, 7, T0, 2, "placed"),
                                               _row(3, 7, T1, 3, "re-dated"), _row(3, 8, T0, 4, "placed")]))
    spec = spark_spec(tmp_path, {"format": "parquet", "location": str(folder)}, records_can_move=True)
    first = plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert first.status == "ready", first.problems
    assert [a.partition for a in first.document.added_partitions] == ["2024-01-03"]
    assert "the newest version of key (order_id=7) is here" in " ".join(first.document.added_partitions[0].reasons)
    assert {e.partition: e.stage_a.row_count for e in first.document.partitions} == {"2024-01-01": 1, "2024-01-03": 2}
    with factory() as conn:
        approve_plan(conn, factory, spec, first, "tester")
    assert {p["status"] for p in apply_plan(spec, first.plan_id, factory, run_id="run-1").partitions} == {"verified"}
    assert (_ids(tmp_path, 1), _ids(tmp_path, 3)) == ([5], [7, 8])
    # A correction re-dates order 5 to 2024-01-03: the two days must switch together, which a
    # folder cannot do, so the plan is refused, naming them, and the target stays as it was.
    write_parquet_source(folder, source_table([_row(1, 5, T0, 1, "placed"), _row(1, 7, T0, 2, "placed"),
                                               _row(3, 7, T1, 3, "re-dated"), _row(3, 8, T0, 4, "placed"),
                                               _row(3, 5, T1, 9, "re-dated")]))
    again = plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert again.status == "refused"
    assert any("moved keys link partitions 2024-01-01, 2024-01-03" in p for p in again.problems), again.problems
    assert (_ids(tmp_path, 1), _ids(tmp_path, 3)) == ([5], [7, 8])


def test_a_time_stamp_that_moves_to_another_hour_is_a_moved_record(tmp_path, spark, factory, url_env):
    """With hourly windows a key's newest time stamp decides its window: a key whose newest
    version lies in an hour not asked for adds that hour; once written, a key re-timed into
    another hour links the two, and the plan is refused before anything moves."""
    import pyarrow.parquet as pq

    from backfill_assets_tests.support.windows import events_spec, events_table, utc
    folder = tmp_path / "events_raw"
    folder.mkdir()
    rows = [(5, utc(2024, 11, 3, 4, 10), utc(2024, 11, 4), 1, "1.00", "midnight hour"),
            (7, utc(2024, 11, 3, 4, 30), utc(2024, 11, 4), 1, "2.00", "first version, midnight hour"),
            (7, utc(2024, 11, 3, 7, 15), utc(2024, 11, 5), 1, "3.00", "re-timed to 02:00 EST")]
    pq.write_table(events_table(rows), folder / "part-0.parquet")
    spec = events_spec(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                       source={"format": "parquet", "location": str(folder)},
                       target={"format": "parquet", "location": str(tmp_path / "events")}, records_can_move=True)
    first = plan_module.make_plan(spec, PartitionRequest("2024-11-03T00:00-0400"), factory)
    assert first.status == "ready", first.problems
    assert [a.partition for a in first.document.added_partitions] == ["2024-11-03T02:00-0500"]
    assert "the newest version of key (event_id=7) is here" in " ".join(first.document.added_partitions[0].reasons)
    assert {e.partition: e.stage_a.row_count for e in first.document.partitions} == {
        "2024-11-03T00:00-0400": 1, "2024-11-03T02:00-0500": 1}
    with factory() as conn:
        approve_plan(conn, factory, spec, first, "tester")
    assert {p["status"] for p in apply_plan(spec, first.plan_id, factory, run_id="run-1").partitions} == {"verified"}

    def ids(hour: str) -> list[int]:
        directory = tmp_path / "events" / f"created_at_hour={hour.replace(':', '%3A')}"
        return sorted(r["event_id"] for p in directory.glob("*.parquet") for r in pq.read_table(p).to_pylist())

    assert (ids("2024-11-03T00:00-0400"), ids("2024-11-03T02:00-0500")) == ([5], [7])
    # Event 5 re-timed to 02:00 EST: both hours must switch together, which a folder cannot do.
    pq.write_table(events_table([(5, utc(2024, 11, 3, 7, 20), utc(2024, 11, 6), 1, "4.00", "re-timed")]),
                   folder / "part-1.parquet")
    again = plan_module.make_plan(spec, PartitionRequest("2024-11-03T00:00-0400"), factory)
    assert again.status == "refused"
    assert any("moved keys link partitions 2024-11-03T00:00-0400, 2024-11-03T02:00-0500" in p
               for p in again.problems), again.problems
    assert (ids("2024-11-03T00:00-0400"), ids("2024-11-03T02:00-0500")) == ([5], [7])
