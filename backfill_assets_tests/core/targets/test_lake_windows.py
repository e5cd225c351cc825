"""Time windows into Delta and Iceberg tables on engine postgres, against real tables on local
disk: a Delta table overwritten by each window's predicate, touching only the files that can
hold it; an Iceberg table by its hidden partitions where they cut time as the windows do, and
refused, naming what to declare, where they do not."""

from __future__ import annotations

import json
import zoneinfo
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.lake.parts import Span, arrow_filter
from backfill_assets.core.plan import make_plan
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.core.windows import Windowing
from backfill_assets_tests.support.windows import (
    EVENT_COLUMNS,
    FALL,
    create_events,
    events_spec,
    naive_newest,
    plan_approve_apply,
    utc,
)

NY = zoneinfo.ZoneInfo("America/New_York")
HOURS = Windowing("hour", NY, "timestamptz")
FORMATS = ["delta", "iceberg"]


def _spec(fmt: str, where: Path, **changes: Any):
    return events_spec(fmt, where, **changes)


def _rows(table, label_of=None) -> dict[str, list[tuple]]:
    """The lake table's rows by window, each in the spec's column order and key order."""
    handle = table.open()
    data = handle.to_pyarrow_table() if hasattr(handle, "to_pyarrow_table") else handle.scan().to_arrow()
    out: dict[str, list[tuple]] = {}
    for row in sorted(data.select(EVENT_COLUMNS).to_pylist(), key=lambda r: r["event_id"]):
        out.setdefault((label_of or HOURS.label_at)(row["created_at"]), []).append(tuple(row[c] for c in EVENT_COLUMNS))
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_hours_of_a_fall_back_day_replace_a_lake_table_as_the_naive_newest_wins(conn, factory, url_env, tmp_path, fmt):
    create_events(conn, FALL)
    spec = _spec(fmt, tmp_path)
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03")
    labels = [p["partition"] for p in plan.as_json()["partitions"]]
    assert len(labels) == 25 and labels[1:3] == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500"]
    assert plan.document.creates_target is True
    from backfill_assets.render import render_replacement
    said = render_replacement(plan.document)
    if fmt == "delta":
        assert plan.document.target_partitioned_by == () and "not partitioned (each window is a range" in said
    else:
        assert plan.document.target_partitioned_by == ("hour(created_at)",)
        assert "partitioned by hour(created_at)" in said
    statuses = {p["status"] for p in result.partitions}
    assert statuses <= {"verified", "skipped-already-verified"} and "verified" in statuses
    table = engine_for(spec).table(conn)
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _rows(table) == expected
    # The repeated hour is two windows; rows exactly on a boundary land in one window only.
    assert [r[1] for r in expected["2024-11-03T01:00-0400"]] == [2, 3]
    assert [r[1] for r in expected["2024-11-03T01:00-0500"]] == [2]
    handle = table.open()
    if fmt == "delta":
        assert list(handle.metadata().partition_columns) == []  # a window is a range, not a folder
    else:
        assert [str(f.transform) for f in handle.spec().fields] == ["hour"]  # native partitions
    table.close()

    # A late row in one window: the next plan of the whole day replaces that window alone,
    # and the commit touches only the files that can hold it.
    conn.execute("INSERT INTO public.events_raw VALUES (%s, 8, %s, 1, 12.00, 'late')",
                 (utc(2024, 11, 3, 9, 15), utc(2024, 11, 6)))
    _, result2 = plan_approve_apply(conn, factory, spec, "2024-11-03", run_id="r2")
    written = [p["partition"] for p in result2.partitions if p["status"] == "verified"]
    assert written == ["2024-11-03T04:00-0500"]
    table = engine_for(spec).table(conn)
    rows = _rows(table)
    assert [r[1] for r in rows["2024-11-03T04:00-0500"]] == [8]
    assert {k: v for k, v in rows.items() if k != "2024-11-03T04:00-0500"} == expected
    if fmt == "delta":
        log = Path(tmp_path / "events" / "_delta_log")
        last = sorted(log.glob("*.json"))[-1]
        actions = [json.loads(line) for line in last.read_text().splitlines()]
        removed = [a["remove"]["path"] for a in actions if "remove" in a]
        assert removed == []  # the window held no row before: no other window's file rewritten
        added = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
        assert [(s["minValues"]["created_at"], s["maxValues"]["created_at"]) for s in added] == [
            ("2024-11-03T09:15:00Z", "2024-11-03T09:15:00Z")]
    table.close()


def test_a_delta_window_overwrite_keeps_the_other_windows_rows_of_a_file_it_rewrites(tmp_path):
    """A file written by another writer holding rows of several windows: the overwrite of one
    rewrites it keeping the others' rows, and the check of our commit counts them."""
    from deltalake import write_deltalake

    from backfill_assets.core.lake.delta import DeltaLakeTable
    at = pa.timestamp("us", tz="UTC")
    location = tmp_path / "t"
    write_deltalake(str(location), pa.table({"created_at": pa.array([utc(2024, 11, 3, h) for h in (4, 5, 6, 7)], at),
                                             "event_id": pa.array([1, 2, 3, 4], pa.int64())}))
    table = DeltaLakeTable(str(location))
    window = HOURS.window("2024-11-03T01:00-0400")
    span = Span(window.start, window.end, window.label)
    new = pa.table({"created_at": pa.array([utc(2024, 11, 3, 5, 30)], at), "event_id": pa.array([9], pa.int64())})
    version = table.overwrite(table.open(), "created_at", [span], new, {"backfill_assets.plan_id": "p"})
    rows = sorted(table.read_version(version, "created_at", [span]).column("event_id").to_pylist())
    assert rows == [9]
    everything = table.open().to_pyarrow_table()
    assert sorted(everything.column("event_id").to_pylist()) == [1, 3, 4, 9]
    # The filter that reads a window keeps its start and leaves out its end.
    bounds = pa.table({"created_at": pa.array([window.start, window.end], at)})
    assert pads.dataset(bounds).to_table(filter=arrow_filter("created_at", [span])).num_rows == 1


def test_an_iceberg_table_partitioned_by_utc_days_is_refused_for_new_york_days(conn, factory, url_env, tmp_path):
    """day(ts) is a day in UTC: a New York day would take parts of two. Refused at planning,
    before a row is read, saying what to declare; UTC days are its own partitions."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.transforms import DayTransform

    from backfill_assets.core.fingerprint.kinds import lake_schema
    create_events(conn, FALL)
    days = {"every": "day", "time_zone": "America/New_York"}
    spec = _spec("iceberg", tmp_path, partition_window=days)
    table = engine_for(spec).table(conn)
    # Made by another tool: partitioned by day(created_at).
    from backfill_assets.core.pg.catalog import inspect_source
    columns = inspect_source(conn, spec).source_columns
    schema = lake_schema([c for c in columns if c.name in EVENT_COLUMNS])
    sql_catalog = SqlCatalog(spec.target.catalog.name, uri=table.url, warehouse=table.warehouse)
    sql_catalog.create_namespace_if_not_exists("lake")
    with sql_catalog.create_table_transaction("lake.events", schema=schema) as txn, txn.update_spec() as update:
        update.add_field("created_at", DayTransform(), "created_at_day")
    table.close()
    with pytest.raises(SpecError, match=r"partitioned by day\(created_at\), days in UTC, which cannot hold the days "
                                        r"of America/New_York .*time_zone: UTC.*hour\(created_at\)"):
        make_plan(spec, PartitionRequest("2024-11-03"), factory)
    # The same table takes UTC days as its own partitions (event 2's two rows of one UTC day
    # would tie: one goes).
    conn.execute("DELETE FROM public.events_raw WHERE event_id = 2 AND created_at = %s", (utc(2024, 11, 3, 6),))
    rows = [r for r in FALL if not (r[0] == 2 and r[1] == utc(2024, 11, 3, 6))]
    utc_days = _spec("iceberg", tmp_path, partition_window={"every": "day", "time_zone": "UTC"})
    plan, result = plan_approve_apply(conn, factory, utc_days, "2024-11-03..2024-11-04")
    assert {p["status"] for p in result.partitions} == {"verified"}
    utc_windows = Windowing("day", zoneinfo.ZoneInfo("UTC"), "timestamptz")
    table = engine_for(utc_days).table(conn)
    expected = {k: v for k, v in naive_newest(rows, utc_windows, ["2024-11-03", "2024-11-04"]).items() if v}
    assert _rows(table, utc_windows.label_at) == expected
    table.close()


@pytest.mark.parametrize(("zone", "grain", "transform"), [
    ("America/New_York", "hour", "hour"), ("America/New_York", "day", "hour"), ("UTC", "day", "day"),
    ("UTC", "week", "day"), ("UTC", "month", "month"), ("Europe/Berlin", "month", "hour"), ("UTC", "year", "year"),
])
def test_a_new_iceberg_table_is_partitioned_by_the_coarsest_transform_that_cuts_time_as_the_windows_do(
        zone, grain, transform):
    from backfill_assets.core.lake.iceberg_partitions import window_transform
    assert window_transform(Windowing(grain, zoneinfo.ZoneInfo(zone), "timestamptz")) == transform
    assert window_transform(Windowing("month", zoneinfo.ZoneInfo(zone), "date")) == "month"


def test_no_iceberg_transform_holds_the_hours_of_a_zone_half_an_hour_from_utc():
    from backfill_assets.core.lake.iceberg_partitions import window_transform
    with pytest.raises(SpecError, match=r"Asia/Kolkata .*not whole hours.*time_zone: UTC, or write a Delta"):
        window_transform(Windowing("hour", zoneinfo.ZoneInfo("Asia/Kolkata"), "timestamptz"))



@pytest.mark.parametrize("fmt", FORMATS)
def test_a_time_stamp_that_moves_to_another_window_of_a_lake_table_is_a_moved_record(
        conn, factory, url_env, tmp_path, fmt):
    """records_can_move over a lake table: the key's home is read from the table, placed in
    its window, and the window it leaves is replaced with the one it lands in."""
    first = [(1, utc(2024, 11, 3, 5, 10), utc(2024, 11, 4), 1, "1.00", "first"),
             (2, utc(2024, 11, 3, 5, 30), utc(2024, 11, 4), 1, "2.00", None)]
    create_events(conn, first)
    spec = _spec(fmt, tmp_path, records_can_move=True)
    plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400")
    conn.execute("INSERT INTO public.events_raw VALUES (%s, 1, %s, 2, 1.50, 'corrected: 04:20 EST')",
                 (utc(2024, 11, 3, 9, 20), utc(2024, 11, 5)))
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400", run_id="r2")
    doc = plan.document
    assert [a.partition for a in doc.added_partitions] == ["2024-11-03T04:00-0500"]
    assert "key (event_id=1) moves here from 2024-11-03T01:00-0400" in doc.added_partitions[0].reasons[0]
    assert {p["partition"]: p["status"] for p in result.partitions} == dict.fromkeys(
        ["2024-11-03T01:00-0400", "2024-11-03T04:00-0500"], "verified")
    table = engine_for(spec).table(conn)
    rows = _rows(table)
    table.close()
    assert {label: [(r[1], r[0]) for r in got] for label, got in rows.items()} == {
        "2024-11-03T01:00-0400": [(2, utc(2024, 11, 3, 5, 30))],
        "2024-11-03T04:00-0500": [(1, utc(2024, 11, 3, 9, 20))],
    }


@pytest.mark.parametrize("fmt", FORMATS)
def test_audit_and_diff_of_a_lake_table_read_each_window_by_its_files(conn, factory, url_env, tmp_path, fmt):
    from backfill_assets.core.audit import audit_spec
    from backfill_assets.core.diff import diff_plan
    create_events(conn, FALL)
    spec = _spec(fmt, tmp_path)
    plan, _ = plan_approve_apply(conn, factory, spec, "2024-11-03")
    found = audit_spec(spec, factory)
    assert {p.result for p in found.partitions} == {"holds"} and len(found.partitions) == 25
    # Another writer rewrites one hour: that window drifts, by its files, the others hold.
    table = engine_for(spec).table(conn)
    window = HOURS.window("2024-11-03T02:00-0500")
    span = Span(window.start, window.end, window.label)
    handle = table.open()
    data = table.read(handle, "created_at", [span])
    changed = data.set_column(data.schema.get_field_index("note"), "note", pa.array(["hand fix"], pa.string()))
    if fmt == "delta":
        from deltalake import write_deltalake

        from backfill_assets.core.lake.delta import delta_predicate
        write_deltalake(handle, changed, mode="overwrite", predicate=delta_predicate("created_at", [span]))
    else:
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan
        handle.overwrite(changed, overwrite_filter=And(GreaterThanOrEqual("created_at", window.start.isoformat()),
                                                      LessThan("created_at", window.end.isoformat())))
    table.close()
    found = {p.partition: p.result for p in audit_spec(spec, factory).partitions}
    assert found.pop("2024-11-03T02:00-0500") == "drifted" and set(found.values()) == {"holds"}
    diff = diff_plan(spec, plan.plan_id, factory, request=PartitionRequest("2024-11-03T02:00-0500"))
    (part,) = diff.partitions
    assert (part.partition, part.added, part.removed, part.changed) == ("2024-11-03T02:00-0500", 0, 0, 1)


@pytest.mark.parametrize(("ts_type", "window", "message"), [
    ("timestamptz", {"every": "hour", "time_zone": "Asia/Kolkata"}, r"hours of Asia/Kolkata start \(its offset"),
    ("timestamp", {"every": "hour", "time_zone": "UTC", "column_time_zone": "UTC"},
     "no agreed lake type"),
])
def test_windows_an_iceberg_table_cannot_hold_are_refused_when_planned(conn, factory, url_env, tmp_path, ts_type,
                                                                        window, message):
    create_events(conn, FALL, ts_type)
    with pytest.raises(SpecError, match=message):
        make_plan(_spec("iceberg", tmp_path, partition_window=window), PartitionRequest("2024-11-03"), factory)
    assert not (tmp_path / "wh").exists()  # nothing written
