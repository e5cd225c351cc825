"""Time windows on engine spark, in a real local session: the hours of New York over the night
its clocks fall back, from a PostgreSQL table read over JDBC and from a Parquet folder, into a
Parquet folder target with a folder per window; the rows equal the naive newest-wins per window,
and the hashes equal engine postgres's for the same rows."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.spark_lakes import JDBC_ENV, jdbc_url
from backfill_assets_tests.support.windows import (
    EVENT_COLUMNS,
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


def _spec(where: Path, source: dict, **changes):
    return events_spec(engine={"type": "spark", "staging": str(where / "staging")}, source=source,
                       target={"format": "parquet", "location": str(where / "events")}, **changes)


def _folder_rows(folder: Path) -> dict[str, list[tuple]]:
    """The target folder's rows by window, as its folders name them (one per window, its files
    keeping the time stamp)."""
    out: dict[str, list[tuple]] = {}
    for directory in sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("created_at_hour=")):
        import urllib.parse
        label = urllib.parse.unquote(directory.name.partition("=")[2])
        names = sorted(n.name for n in directory.iterdir() if n.suffix == ".parquet" and not n.name.startswith(("_", ".")))
        rows = [r for n in names for r in pq.read_table(directory / n).select(EVENT_COLUMNS).to_pylist()]
        if rows:
            out[label] = sorted((tuple(r[c] for c in EVENT_COLUMNS) for r in rows), key=lambda r: r[1])
    return out


def test_hours_of_a_fall_back_day_over_jdbc_into_a_folder_equal_the_naive_newest_wins_and_postgres_hashes(
        tmp_path, spark, conn, factory, url_env, db_url, monkeypatch):
    create_events(conn, FALL)
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        spec = _spec(tmp_path, {"format": "jdbc", "table": "public.events_raw", "url_env": JDBC_ENV})
        plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03")
    labels = [p.partition for p in plan.document.partitions]
    assert len(labels) == 25 and labels[1:3] == ["2024-11-03T01:00-0400", "2024-11-03T01:00-0500"]
    assert plan.status == "ready" and {p["status"] for p in result.partitions} <= {"verified",
                                                                                  "skipped-already-verified"}
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _folder_rows(tmp_path / "events") == expected
    pg_plan = make_plan(events_spec(), PartitionRequest("2024-11-03"), factory)
    ours = {p.partition: (p.stage_a.row_count, p.stage_a.content_hash) for p in plan.document.partitions}
    theirs = {p.partition: (p.stage_a.row_count, p.stage_a.content_hash) for p in pg_plan.document.partitions}
    assert ours == theirs


def test_hours_from_a_parquet_folder_into_a_folder_per_window(tmp_path, spark, conn, factory, url_env):
    folder = tmp_path / "events_raw"
    folder.mkdir()
    pq.write_table(events_table(FALL), folder / "part-0.parquet")
    spec = _spec(tmp_path, {"format": "parquet", "location": str(folder)})
    plan, result = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400..2024-11-03T02:00-0500")
    labels = [p.partition for p in plan.document.partitions]
    assert {p["status"] for p in result.partitions} == {"verified"}
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert _folder_rows(tmp_path / "events") == expected
    # A late row in one window: the next plan replaces it alone.
    pq.write_table(events_table([(8, utc(2024, 11, 3, 6, 30), utc(2024, 11, 6), 1, "12.00", "late")]),
                   folder / "part-1.parquet")
    _, again = plan_approve_apply(conn, factory, spec, "2024-11-03T01:00-0400..2024-11-03T02:00-0500", run_id="r2")
    assert [p["partition"] for p in again.partitions if p["status"] == "verified"] == ["2024-11-03T01:00-0500"]


def test_windows_with_a_catalog_table_or_moving_records_are_refused_on_engine_spark(tmp_path):
    with pytest.raises(SpecError, match="partition_window with a spark_table target is not built yet"):
        events_spec(engine={"type": "spark"}, source={"format": "parquet", "location": str(tmp_path)},
                    target={"format": "spark_table", "table": "db.events"})
    with pytest.raises(SpecError, match="partition_window needs a Parquet or JDBC source on engine spark"):
        events_spec(engine={"type": "spark"}, source={"format": "spark_table", "table": "db.raw"},
                    target={"format": "parquet", "location": str(tmp_path)})


def test_a_late_row_over_jdbc_is_found_by_the_sensor_in_its_window_alone_and_profile_matches_postgres(
        tmp_path, spark, conn, factory, url_env, db_url, monkeypatch):
    """The source sensor reads each window's row count and newest change value over JDBC (its
    range sent to the database), at the pin from the copy's folder of that window; `profile`
    gives the windows and counts engine postgres gives."""
    from backfill_assets.core.build import open_build_engine
    from backfill_assets.core.profile.propose import profile_spec
    create_events(conn, FALL)
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        source = {"format": "jdbc", "table": "public.events_raw", "url_env": JDBC_ENV, "change_column": "updated_at"}
        spec = _spec(tmp_path, source)
        assert make_plan(spec, PartitionRequest("2024-11-03"), factory).status == "ready"

        def tick(state):
            with factory() as c, open_build_engine(c, factory, spec) as engine:
                return engine.source_moves(state, None)

        assert tick(None).changed == {}
        conn.execute("INSERT INTO public.events_raw VALUES (%s, 8, %s, 1, 12.00, 'late')",
                     (utc(2024, 11, 3, 9, 15), utc(2024, 11, 6)))
        conn.commit()
        assert list(tick(None).changed) == ["2024-11-03T04:00-0500"]
        ours = profile_spec(spec, factory)
    theirs = profile_spec(events_spec(), factory)
    assert ours.partitions == theirs.partitions and ours.partitions[0] == "2024-11-02T23:00-0400"
    assert (ours.row_count, ours.key_partitions) == (theirs.row_count, theirs.key_partitions)
    assert (ours.business_key, ours.ordering) == (theirs.business_key, theirs.ordering)


def test_days_of_both_clock_changes_into_a_folder_per_day_equal_postgres(tmp_path, spark, conn, factory, url_env):
    """Day windows of New York (23 and 25 hours) from a Parquet folder, a folder per day in the
    target; the rows on each midnight in one day only; the hashes engine postgres computes."""
    from backfill_assets.core.windows import Windowing
    from backfill_assets_tests.support.windows import DST_DAY_REQUEST, DST_DAYS
    folder = tmp_path / "events_raw"
    folder.mkdir()
    pq.write_table(events_table(DST_DAYS), folder / "part-0.parquet")
    days = {"every": "day", "time_zone": "America/New_York"}
    spec = _spec(tmp_path, {"format": "parquet", "location": str(folder)}, partition_window=days)
    plan, result = plan_approve_apply(conn, factory, spec, DST_DAY_REQUEST)
    labels = [p.partition for p in plan.document.partitions]
    assert labels == ["2024-03-09", "2024-03-10", "2024-03-11", "2024-11-03"]
    assert {p["status"] for p in result.partitions} == {"verified"}
    windowing = Windowing("day", NY_HOURS.tz, "timestamptz")
    expected = {label: rows for label, rows in naive_newest(DST_DAYS, windowing, labels).items() if rows}
    found = {}
    for directory in sorted((tmp_path / "events").glob("created_at_day=*")):
        names = sorted(n for n in directory.iterdir() if n.suffix == ".parquet" and not n.name.startswith(("_", ".")))
        rows = [r for n in names for r in pq.read_table(n).select(EVENT_COLUMNS).to_pylist()]
        if rows:
            found[directory.name.partition("=")[2]] = sorted((tuple(r[c] for c in EVENT_COLUMNS) for r in rows),
                                                             key=lambda r: r[1])
    assert found == expected
    create_events(conn, DST_DAYS)
    pg = make_plan(events_spec(partition_window=days), PartitionRequest(DST_DAY_REQUEST), factory)
    assert {p.partition: p.stage_a for p in pg.document.partitions} == {
        p.partition: p.stage_a for p in plan.document.partitions}
