"""Time windows on engine duckdb: the hours of New York over a fall-back day, read from a Delta
or Iceberg source by the statistics of its files, built twice in DuckDB and written to a Delta
or Iceberg table; the rows equal the naive newest-wins per window, and the hashes equal those
engine postgres computes for the same rows."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from backfill_assets.core.pinned.watch import lake_changes
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.core.windows import Windowing
from backfill_assets_tests.support.windows import (
    EVENT_COLUMNS,
    EVENTS_ARROW,
    EVENTS_SPEC,
    FALL,
    NY_HOURS,
    create_events,
    events_spec,
    events_table,
    naive_newest,
    plan_approve_apply,
    utc,
)

HOURS = NY_HOURS


def _table(rows: list[tuple]) -> pa.Table:
    return events_table(rows)


def _delta_source(where: Path, rows: list[tuple]) -> dict[str, Any]:
    """The rows in a Delta table, one file per UTC day written (so that a window's files can be
    told from the others' by their statistics)."""
    from deltalake import write_deltalake
    for day in sorted({r[1].date() for r in rows}):
        write_deltalake(str(where / "events_raw"), _table([r for r in rows if r[1].date() == day]), mode="append")
    return {"format": "delta", "location": str(where / "events_raw")}


def _spec(where: Path, source: dict[str, Any], target: str, **changes: Any):
    return events_spec(target, where, engine={"type": "duckdb", "database": str(where / "stages.duckdb")},
                       source=source, **changes)


def _rows(spec, conn) -> dict[str, list[tuple]]:
    table = engine_for(spec).table(conn)
    try:
        handle = table.open()
        data = handle.to_pyarrow_table() if hasattr(handle, "to_pyarrow_table") else handle.scan().to_arrow()
    finally:
        table.close()
    out: dict[str, list[tuple]] = {}
    for row in sorted(data.select(EVENT_COLUMNS).to_pylist(), key=lambda r: r["event_id"]):
        out.setdefault(HOURS.label_at(row["created_at"]), []).append(tuple(row[c] for c in EVENT_COLUMNS))
    return out


@pytest.mark.parametrize("target", ["delta", "iceberg"])
def test_hours_of_a_fall_back_day_from_a_lake_source_equal_the_naive_newest_wins_and_postgres_hashes(
        conn, factory, url_env, tmp_path, target):
    spec = _spec(tmp_path, _delta_source(tmp_path, FALL), target)
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03")
    labels = [p.partition for p in plan.document.partitions]
    assert len(labels) == 25 and labels[1:3] == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500"]
    assert plan.status == "ready" and {p["status"] for p in result.partitions} <= {"verified",
                                                                                  "skipped-already-verified"}
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _rows(spec, conn) == expected
    # The same rows in PostgreSQL, planned on engine postgres: the same hash for every window.
    create_events(conn, FALL)
    pg_spec = spec_from_mapping({k: v for k, v in EVENTS_SPEC.items() if k != "partitions"})
    pg_plan = make_plan(pg_spec, PartitionRequest("2024-11-03"), factory)
    ours = {p.partition: (p.stage_a.row_count, p.stage_a.content_hash) for p in plan.document.partitions}
    theirs = {p.partition: (p.stage_a.row_count, p.stage_a.content_hash) for p in pg_plan.document.partitions}
    assert ours == theirs

    # A late row lands in one window of the source: the sensor names that window alone, and
    # the next plan of the whole day replaces it alone.
    from deltalake import write_deltalake
    late = (8, utc(2024, 11, 3, 9, 15), utc(2024, 11, 6), 1, "12.00", "late")
    write_deltalake(str(tmp_path / "events_raw"), _table([late]), mode="append")
    assert list(lake_changes(conn, spec)) == ["2024-11-03T04:00-0500"]
    _, again = plan_approve_apply(conn, factory, spec, "2024-11-03", run_id="r2")
    assert [p["partition"] for p in again.partitions if p["status"] == "verified"] == ["2024-11-03T04:00-0500"]
    assert _rows(spec, conn)["2024-11-03T04:00-0500"][0][1] == 8


def test_a_window_reads_only_the_files_whose_statistics_can_hold_it(tmp_path):
    """The pinned Delta version's files for a window are those whose statistics of the column
    overlap it: one UTC day's file for an hour of it."""
    import duckdb

    from backfill_assets.core.lake.parts import span_of
    from backfill_assets.core.pinned.delta import DeltaSource
    from backfill_assets.core.pinned.source import SOURCE_ROWS
    from backfill_assets.core.spec import DeltaSourceSpec
    rows = FALL + [(9, utc(2024, 11, 10, 12), utc(2024, 11, 11), 1, "1.00", "a week on")]
    _delta_source(tmp_path, rows)
    source = DeltaSource(DeltaSourceSpec(format="delta", location=str(tmp_path / "events_raw")))
    pin = source.latest("created_at", [])
    span = span_of(HOURS, "2024-11-03T01:00-0500")
    files = source._files(source._table(int(pin.version)), "created_at", [span])
    assert len(files["2024-11-03T01:00-0500"]) == 1  # of three files
    with duckdb.connect() as duck:
        duck.execute("SET TimeZone = 'UTC'")
        source.attach(duck, pin, "created_at", [span])
        got = duck.execute(f"SELECT event_id FROM {SOURCE_ROWS} ORDER BY event_id").fetchall()
    assert got == [(2,)]


@pytest.mark.parametrize("fmt", ["delta", "parquet"])
def test_a_time_stamp_that_moves_to_another_window_is_a_moved_record_on_engine_duckdb(conn, factory, url_env,
                                                                                       tmp_path, fmt):
    """records_can_move: the key's newest version is looked for in every row of the pin, placed
    in its window, and the window it leaves is replaced with the one it lands in."""
    import pyarrow.parquet as pq
    first = [(1, utc(2024, 11, 3, 5, 10), utc(2024, 11, 4), 1, "1.00", "first"),
             (2, utc(2024, 11, 3, 5, 30), utc(2024, 11, 4), 1, "2.00", None)]
    moved = (1, utc(2024, 11, 3, 9, 20), utc(2024, 11, 5), 2, "1.50", "corrected: 04:20 EST")
    folder = tmp_path / "events_raw"
    if fmt == "delta":
        source = _delta_source(tmp_path, first)
    else:
        folder.mkdir()
        pq.write_table(_table(first), folder / "part-0.parquet")
        source = {"format": "parquet", "location": str(folder)}
    spec = _spec(tmp_path, source, "delta", records_can_move=True)
    plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400")
    if fmt == "delta":
        from deltalake import write_deltalake
        write_deltalake(str(folder), _table([moved]), mode="append")
    else:
        pq.write_table(_table([moved]), folder / "part-1.parquet")
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400", run_id="r2")
    doc = plan.document
    assert [a.partition for a in doc.added_partitions] == ["2024-11-03T04:00-0500"]
    assert "key (event_id=1) moves here from 2024-11-03T01:00-0400" in doc.added_partitions[0].reasons[0]
    assert {p["partition"]: p["status"] for p in result.partitions} == dict.fromkeys(
        ["2024-11-03T01:00-0400", "2024-11-03T04:00-0500"], "verified")
    assert {label: [r[1] for r in got] for label, got in _rows(spec, conn).items()} == {
        "2024-11-03T01:00-0400": [2], "2024-11-03T04:00-0500": [1]}


def test_hours_from_a_parquet_folder_pin_only_the_files_whose_row_groups_can_hold_them(conn, factory, url_env,
                                                                                      tmp_path):
    """A folder of Parquet files by UTC day (Hive-partitioned by another column): the pin holds
    the files whose footers' statistics overlap the windows asked for, a file added later with a
    row in one of them moves that window alone, and the rows written are the naive newest-wins."""
    import pyarrow.parquet as pq
    folder = tmp_path / "events_raw"
    for day in sorted({r[1].date() for r in FALL}):
        (folder / f"day={day}").mkdir(parents=True)
        pq.write_table(_table([r for r in FALL if r[1].date() == day]), folder / f"day={day}" / "part-0.parquet")
    spec = _spec(tmp_path, {"format": "parquet", "location": str(folder)}, "delta")
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400..2024-11-03T02:00-0500")
    labels = [p.partition for p in plan.document.partitions]
    assert {p["status"] for p in result.partitions} == {"verified"}
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _rows(spec, conn) == expected
    from backfill_assets.core.store import control as store
    found = store.find_snapshot(conn, spec.control_schema, plan.document.snapshot.id)
    assert [f[0] for f in found["scope"]["pin"]["files"]] == ["day=2024-11-03/part-0.parquet"]  # of three
    pq.write_table(_table([(8, utc(2024, 11, 3, 6, 30), utc(2024, 11, 6), 1, "12.00", "late")]),
                   folder / "day=2024-11-03" / "part-1.parquet")
    assert list(lake_changes(conn, spec)) == ["2024-11-03T01:00-0500"]


def test_hours_from_an_iceberg_source_partitioned_by_day_are_read_by_its_hidden_partitions(
        conn, factory, url_env, tmp_path, monkeypatch):
    """An Iceberg source partitioned by day(created_at): each window's files are those its
    partition and metrics let through; the rows written equal the naive newest-wins."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.transforms import DayTransform
    uri = f"sqlite:///{tmp_path}/source_catalog.db"
    monkeypatch.setenv("BFA_TEST_ICEBERG_SOURCE", uri)
    catalog = SqlCatalog("default", uri=uri, warehouse=f"file://{tmp_path}/source_warehouse")
    catalog.create_namespace("raw")
    with catalog.create_table_transaction("raw.events_raw", schema=EVENTS_ARROW) as txn, txn.update_spec() as update:
        update.add_field("created_at", DayTransform(), "created_at_day")
    catalog.load_table("raw.events_raw").append(_table(FALL))
    source = {"format": "iceberg", "table": "raw.events_raw",
              "catalog": {"type": "sql", "uri_env": "BFA_TEST_ICEBERG_SOURCE",
                          "warehouse": str(tmp_path / "source_warehouse")}}
    spec = _spec(tmp_path, source, "delta")
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400..2024-11-03T02:00-0500")
    labels = [p.partition for p in plan.document.partitions]
    assert labels == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500", "2024-11-03T02:00-0500"]
    assert {p["status"] for p in result.partitions} == {"verified"}
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _rows(spec, conn) == expected


def test_profile_of_a_lake_source_by_windows_equals_postgres(conn, factory, url_env, tmp_path):
    """The first windows holding rows, their counts and the key measured per window: the same
    profile from the Delta source in DuckDB as from the same rows in PostgreSQL."""
    from backfill_assets.core.profile.propose import profile_spec
    spec = _spec(tmp_path, _delta_source(tmp_path, FALL), "delta")
    create_events(conn, FALL)
    pg_spec = spec_from_mapping({k: v for k, v in EVENTS_SPEC.items() if k != "partitions"})
    ours, theirs = profile_spec(spec, factory), profile_spec(pg_spec, factory)
    assert ours.partitions == theirs.partitions and ours.partitions[0] == "2024-11-02T23:00-0400"
    assert (ours.row_count, ours.key_partitions) == (theirs.row_count, theirs.key_partitions) == (len(FALL), 7)
    assert (ours.business_key, ours.ordering) == (theirs.business_key, theirs.ordering)
    asked = profile_spec(spec, factory, PartitionRequest("2024-11-03T01:00-0400,2024-11-03T01:00-0500"))
    assert asked.partitions == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500"] and asked.row_count == 4


def test_days_of_both_clock_changes_from_delta_equal_the_naive_newest_wins_and_postgres_hashes(
        conn, factory, url_env, tmp_path):
    """Day windows of New York (10 March: 23 hours; 3 November: 25), rows on each midnight in
    one day only; an empty day; the hashes engine postgres computes for the same rows."""
    from backfill_assets_tests.support.windows import DST_DAY_REQUEST, DST_DAYS
    days = {"every": "day", "time_zone": "America/New_York"}
    spec = _spec(tmp_path, _delta_source(tmp_path, DST_DAYS), "delta", partition_window=days)
    plan, result = plan_approve_apply(conn, factory, spec, DST_DAY_REQUEST)
    entries = {p.partition: p for p in plan.document.partitions}
    assert list(entries) == ["2024-03-09", "2024-03-10", "2024-03-11", "2024-11-03"]
    assert [(dt.datetime.fromisoformat(e.end) - dt.datetime.fromisoformat(e.start)) / dt.timedelta(hours=1)
            for e in entries.values()] == [24, 23, 24, 25]
    assert {p["status"] for p in result.partitions} == {"verified"}
    windowing = Windowing("day", NY_HOURS.tz, "timestamptz")
    expected = {label: rows for label, rows in naive_newest(DST_DAYS, windowing, list(entries)).items() if rows}
    assert [r[1] for r in expected["2024-03-10"]] == [2, 3] and "2024-03-11" in expected
    table = engine_for(spec).table(conn)
    try:
        data = table.open().to_pyarrow_table()
    finally:
        table.close()
    got: dict[str, list[tuple]] = {}
    for row in sorted(data.select(EVENT_COLUMNS).to_pylist(), key=lambda r: r["event_id"]):
        got.setdefault(windowing.label_at(row["created_at"]), []).append(tuple(row[c] for c in EVENT_COLUMNS))
    assert got == expected
    create_events(conn, DST_DAYS)
    pg = make_plan(events_spec(partition_window=days), PartitionRequest(DST_DAY_REQUEST), factory)
    assert {p.partition: p.stage_a for p in pg.document.partitions} == {k: e.stage_a for k, e in entries.items()}
