"""records_can_move on DuckDB: a key's newest version decides its partition, the plan adds
the partitions a moved key leaves and enters, and apply replaces them in one lake commit."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import LakeSource, duck_spec, source_table
from backfill_assets_tests.support.lakes import Lake

T0 = dt.datetime(2024, 1, 1, 8, tzinfo=dt.timezone.utc)
T1 = dt.datetime(2024, 1, 5, 8, tzinfo=dt.timezone.utc)


def _row(day: int, key: int, when: dt.datetime, seq: int, status: str) -> tuple:
    return (dt.date(2024, 1, day), key, 1, when, seq, decimal.Decimal("1.00"), status, None)


def _target(spec, factory) -> dict[str, list[int]]:
    """The target's order ids per day, read directly from the lake table."""
    with factory() as conn:
        rows = Lake(spec.target.format, spec, conn).rows()
    out: dict[str, list[int]] = {}
    for r in rows:
        out.setdefault(r[0].isoformat(), []).append(r[1])
    return out


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "parquet"])
def test_a_key_that_moves_adds_its_new_partition_and_both_are_replaced_together(tmp_path, factory, url_env,
                                                                                  monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    base = [_row(1, 5, T0, 1, "placed"), _row(1, 6, T0, 2, "placed"), _row(3, 7, T0, 3, "placed")]
    source.write(source_table(base))
    # A Parquet folder's pin holds only the partitions it is taken for: the snapshot pins the
    # partition the moved key adds too, and the builds read it from that pin.
    spec = duck_spec(tmp_path, source.spec, target="delta" if fmt == "parquet" else fmt, records_can_move=True)
    first = plan_module.make_plan(spec, PartitionRequest("2024-01-01..2024-01-03"), factory)
    assert first.status == "ready", first.problems
    with factory() as conn:
        approve_plan(conn, factory, spec, first, "tester")
    apply_plan(spec, first.plan_id, factory, run_id="run-1")
    assert _target(spec, factory) == {"2024-01-01": [5, 6], "2024-01-03": [7]}
    # A correction re-dates order 5 to 2024-01-03; only 2024-01-01 is asked for.
    source.write(source_table(base + [_row(3, 5, T1, 9, "re-dated")]))
    plan = plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert plan.status == "ready", plan.problems
    assert [a.partition for a in plan.document.added_partitions] == ["2024-01-03"]
    assert "moves here from 2024-01-01" in " ".join(plan.document.added_partitions[0].reasons)
    assert [list(g) for g in plan.document.replace_groups] == [["2024-01-01", "2024-01-03"]]
    by_day = {e.partition: e.stage_a.row_count for e in plan.document.partitions}
    assert by_day == {"2024-01-01": 1, "2024-01-03": 2}  # order 5 only in its newest partition
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in result.partitions] == ["verified", "verified"]
    versions = {p["target_version"] for p in result.partitions}
    assert len(versions) == 1  # one lake commit for the group
    assert _target(spec, factory) == {"2024-01-01": [6], "2024-01-03": [5, 7]}


def test_a_moved_key_in_a_parquet_folder_is_found_in_a_partition_no_one_asked_for(tmp_path, factory, url_env,
                                                                                  monkeypatch):
    """The folder's pin is taken for the partitions asked for; the moved key's old home is
    found among the other partitions' files, pinned, and read from that pin by both builds:
    a file of it changed after the plan is refused as any pinned file is."""
    source = LakeSource("parquet", tmp_path, monkeypatch)
    source.write(source_table([_row(1, 5, T0, 1, "placed"), _row(2, 6, T0, 2, "placed")]))
    spec = duck_spec(tmp_path, source.spec, records_can_move=True)
    first = plan_module.make_plan(spec, PartitionRequest("2024-01-01..2024-01-02"), factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, first, "tester")
    apply_plan(spec, first.plan_id, factory, run_id="run-1")
    # Order 5 is re-dated to 2024-01-02; only 2024-01-02 is asked for.
    source.write(source_table([_row(1, 5, T0, 1, "placed"), _row(2, 6, T0, 2, "placed"),
                               _row(2, 5, T1, 9, "re-dated")]))
    plan = plan_module.make_plan(spec, PartitionRequest("2024-01-02"), factory)
    assert plan.status == "ready", plan.problems
    assert [a.partition for a in plan.document.added_partitions] == ["2024-01-01"]
    assert {e.partition: e.stage_a.row_count for e in plan.document.partitions} == {"2024-01-01": 0, "2024-01-02": 2}
    from backfill_assets.core.store import control as store
    with factory() as conn, factory.control(conn) as control:
        pin = store.find_snapshot(control, spec.control_schema, plan.document.snapshot.id)["scope"]["pin"]
    assert {f[0].split("/", 1)[0] for f in pin["files"]} == {"order_date=2024-01-01", "order_date=2024-01-02"}
    (old_file,) = (tmp_path / "orders_raw" / "order_date=2024-01-01").glob("*.parquet")
    old_file.write_bytes(old_file.read_bytes())  # the same bytes: still the pinned file
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in result.partitions] == ["verified", "verified"]
    assert _target(spec, factory) == {"2024-01-02": [5, 6]}


def test_a_target_key_in_two_partitions_is_refused_naming_it(tmp_path, factory, url_env, monkeypatch):
    from backfill_assets.core.errors import SourceDataError
    from backfill_assets_tests.support.duck_lakes import write_delta
    source = LakeSource("delta", tmp_path, monkeypatch)
    source.write(source_table([_row(1, 5, T0, 1, "placed")]))
    write_delta(tmp_path / "orders_daily", source_table([_row(1, 5, T0, 1, "placed"), _row(2, 5, T0, 1, "placed")]))
    spec = duck_spec(tmp_path, source.spec, records_can_move=True)
    with pytest.raises(SourceDataError, match=r"lie in more than one partition.*order_id=5"):
        plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
