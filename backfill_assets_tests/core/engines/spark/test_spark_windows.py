"""Time windows on engine spark, in a real local session: the hours of New York over the night
its clocks fall back, from a PostgreSQL table read over JDBC, a Parquet folder and a catalog
table, into a Parquet folder target with a folder per window or a catalog table with a
partition per window; the rows equal the naive newest-wins per window,
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
    UTC_CLOCK_ROWS,
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


_EVENTS_DDL = ("created_at TIMESTAMP, event_id BIGINT, updated_at TIMESTAMP, seq INT, amount DECIMAL(12,2), "
               "note STRING")


def _catalog_rows(spark, table: str, column: str) -> dict[str, list[tuple]]:
    """A catalog table's rows by the value of its partition column (time stamps, which Spark
    gives in the session's zone, UTC, as instants)."""
    import datetime as dt

    def instant(v):
        return v.replace(tzinfo=dt.timezone.utc) if isinstance(v, dt.datetime) else v

    out: dict[str, list[tuple]] = {}
    for r in spark.table(table).collect():
        out.setdefault(r[column], []).append(tuple(instant(r[c]) for c in EVENT_COLUMNS))
    return {k: sorted(v, key=lambda row: row[1]) for k, v in out.items()}


# The fall-back night's first six hours (the repeated one twice), the late row's among them.
SIX_HOURS = "2024-11-03T00:00-0400..2024-11-03T04:00-0500"


def test_hours_from_a_catalog_table_into_a_catalog_table_partitioned_by_their_labels(
        tmp_path, spark, conn, factory, url_env):
    """A source catalog table partitioned by the day its rows arrived (a window's rows in both
    partitions, one written with Spark's old INT96 time stamps, whose files have no statistics
    to prune by), into a target partitioned by each hour's label; the rows equal the naive
    newest-wins, the hashes engine postgres's; a late row is requested by the sensor and
    replaced alone."""
    import uuid

    from backfill_assets.core.build import open_build_engine
    raw, hourly = f"raw_{uuid.uuid4().hex[:8]}", f"hourly_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {raw} ({_EVENTS_DDL}, ingest_day DATE) USING parquet PARTITIONED BY (ingest_day) "
              f"LOCATION '{tmp_path / raw}'")
    spark.sql(f"CREATE TABLE {hourly} ({_EVENTS_DDL}, created_at_hour STRING) USING parquet "
              f"PARTITIONED BY (created_at_hour) LOCATION '{tmp_path / hourly}'")

    def insert(rows, day: str, stamps: str) -> None:
        spark.conf.set("spark.sql.parquet.outputTimestampType", stamps)
        frame = spark.createDataFrame(events_table(rows).to_pandas()).selectExpr(
            *EVENT_COLUMNS, f"DATE'{day}' AS ingest_day")
        frame.select(*spark.table(raw).columns).write.insertInto(raw)

    insert(FALL[:4], "2024-11-03", "INT96")
    insert(FALL[4:], "2024-11-04", "TIMESTAMP_MICROS")
    spec = events_spec(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                       source={"format": "spark_table", "table": raw},
                       target={"format": "spark_table", "table": hourly}, change_column=None)
    plan, result = plan_approve_apply(conn, factory, spec, SIX_HOURS)
    labels = [p.partition for p in plan.document.partitions]
    expected = {label: rows for label, rows in naive_newest(FALL, HOURS, labels).items() if rows}
    assert len(labels) == 6 and sorted(p["partition"] for p in result.partitions if p["status"] == "verified") == \
        sorted(expected)  # an empty window's target partition is already what it must be
    assert _catalog_rows(spark, hourly, "created_at_hour") == expected
    create_events(conn, FALL)
    pg = make_plan(events_spec(), PartitionRequest(SIX_HOURS), factory)
    assert {p.partition: p.stage_a for p in pg.document.partitions} == {
        p.partition: p.stage_a for p in plan.document.partitions}

    def tick():
        with factory() as c, open_build_engine(c, factory, spec) as engine:
            return engine.source_moves(None, None)

    assert tick().changed == {}
    late = (8, utc(2024, 11, 3, 9, 15), utc(2024, 11, 6), 1, "12.00", "late")
    insert([late], "2024-11-06", "TIMESTAMP_MICROS")
    assert list(tick().changed) == ["2024-11-03T04:00-0500"]
    _, again = plan_approve_apply(conn, factory, spec, SIX_HOURS, run_id="r2")
    assert [p["partition"] for p in again.partitions if p["status"] == "verified"] == ["2024-11-03T04:00-0500"]
    expected = {label: rows for label, rows in naive_newest([*FALL, late], HOURS, labels).items() if rows}
    assert _catalog_rows(spark, hourly, "created_at_hour") == expected


def test_a_catalog_target_for_windows_must_be_partitioned_by_a_text_label(tmp_path, spark, conn, factory, url_env):
    import uuid
    folder = tmp_path / "events_raw"
    folder.mkdir()
    pq.write_table(events_table(FALL), folder / "part-0.parquet")
    wrong = f"hourly_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {wrong} ({_EVENTS_DDL}, day DATE) USING parquet PARTITIONED BY (day) "
              f"LOCATION '{tmp_path / wrong}'")
    spec = events_spec(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                       source={"format": "parquet", "location": str(folder)},
                       target={"format": "spark_table", "table": wrong})
    with pytest.raises(SpecError, match=r"partitioned by \(day\), not by \(created_at_hour\)"):
        make_plan(spec, PartitionRequest("2024-11-03"), factory)
    missing = events_spec(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                          source={"format": "parquet", "location": str(folder)},
                          target={"format": "spark_table", "table": "no_such_hourly"})
    with pytest.raises(SpecError, match="created_at_hour STRING, partitioned by created_at_hour"):
        make_plan(missing, PartitionRequest("2024-11-03"), factory)


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


def test_a_timestamp_without_time_zone_over_jdbc_is_refused_and_a_view_in_its_zone_equals_postgres_windows(
        tmp_path, spark, conn, factory, url_env, db_url, monkeypatch):
    """Engine spark reads a `timestamp` column over JDBC as the instant its clock shows in UTC,
    so windowing it would lose the zone its clock reads in: refused, naming the view to read
    instead; through that view, the windows hold the rows engine postgres puts in them when it
    reads the column in its declared zone."""
    create_events(conn, UTC_CLOCK_ROWS, "timestamp")
    conn.execute("CREATE VIEW public.events_utc AS SELECT created_at AT TIME ZONE 'UTC' AS created_at, event_id, "
                 "updated_at, seq, amount, note FROM public.events_raw")
    conn.commit()
    days = {"every": "day", "time_zone": "America/New_York"}
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        raw = _spec(tmp_path / "raw", {"format": "jdbc", "table": "public.events_raw", "url_env": JDBC_ENV},
                    partition_window={**days, "column_time_zone": "UTC"})
        with pytest.raises(SpecError, match="created_at AT TIME ZONE '<its zone>' AS created_at"):
            make_plan(raw, PartitionRequest("2024-03-09..2024-03-11"), factory)
        view = _spec(tmp_path / "view", {"format": "jdbc", "table": "public.events_utc", "url_env": JDBC_ENV},
                     partition_window=days)
        ours = make_plan(view, PartitionRequest("2024-03-09..2024-03-11"), factory)
    theirs = make_plan(events_spec(partition_window={**days, "column_time_zone": "UTC"}),
                       PartitionRequest("2024-03-09..2024-03-11"), factory)
    counts = {p.partition: p.stage_a.row_count for p in ours.document.partitions}
    assert counts == {p.partition: p.stage_a.row_count for p in theirs.document.partitions}
    assert counts == {"2024-03-09": 1, "2024-03-10": 2, "2024-03-11": 1}
