"""A table of the Spark session's catalog as source and as target (format: spark_table): the
partition switched by one catalog update, a concurrent reader through the catalog never sees
it empty, and the same content hash as from a Parquet folder."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import SpecError
from backfill_assets_tests.support.duck_lakes import COLUMNS, DAYS, newest, source_table
from backfill_assets_tests.support.spark_lakes import spark_spec, write_parquet_source

DDL = ("order_date DATE, order_id BIGINT, customer_id BIGINT, updated_at TIMESTAMP, ingest_seq BIGINT, "
       "amount DECIMAL(12,2), status STRING, note STRING")


def _table(spark, tmp_path: Path, name: str, rows=None) -> str:
    """A catalog table at a location of the test's, partitioned by order_date, holding ``rows``."""
    table = f"{name}_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {table} ({DDL}) USING parquet PARTITIONED BY (order_date) "
              f"LOCATION '{tmp_path / table}'")
    if rows is not None:
        folder = tmp_path / f"{table}_rows"
        write_parquet_source(folder, rows)
        frame = spark.read.parquet(str(folder))
        frame.select(*spark.table(table).columns).write.insertInto(table)  # by position: the table's order
    return table


def test_a_catalog_table_to_a_catalog_table_converges_with_the_folders_hash(tmp_path, spark, factory, url_env):
    source = _table(spark, tmp_path, "raw", source_table())
    target = _table(spark, tmp_path, "daily")
    spec = spark_spec(tmp_path, {"format": "spark_table", "table": source},
                      target={"format": "spark_table", "table": target})
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    folder = plan_module.make_plan(spark_spec(tmp_path / "f", write_parquet_source(tmp_path / "raw_folder"),
                                              name="orders_folder"), DAYS, factory)
    assert [e.stage_a for e in plan.document.partitions] == [e.stage_a for e in folder.document.partitions]
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    got = spark.table(target).select(*COLUMNS).collect()
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        mine = sorted((tuple(r) for r in got if r[0] == day), key=lambda r: r[1])
        expected = newest(rows, day)
        assert [r[1] for r in mine] == [r[1] for r in expected]
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3


def test_a_reader_through_the_catalog_never_sees_the_partition_empty(tmp_path, spark, factory, url_env):
    source = _table(spark, tmp_path, "raw", source_table())
    target = _table(spark, tmp_path, "daily", source_table().slice(0, 4))  # some stale rows to replace
    spec = spark_spec(tmp_path, {"format": "spark_table", "table": source},
                      target={"format": "spark_table", "table": target})
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    day = dt.date(2024, 1, 1)
    before = spark.table(target).where(f"order_date = DATE'{day}'").count()
    after = next(e.stage_a.row_count for e in plan.document.partitions if e.partition == day.isoformat())
    seen: list[int] = []
    stop = threading.Event()
    reader = spark.newSession()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(reader.table(target).where(f"order_date = DATE'{day}'").count())
            except Exception:  # noqa: BLE001 - a file listed before the switch: an error, never other rows
                pass

    thread = threading.Thread(target=read)
    thread.start()
    try:
        apply_plan(spec, plan.plan_id, factory, run_id="run-r")
    finally:
        stop.set()
        thread.join()
    assert seen and set(seen) <= {before, after}, sorted(set(seen))


def test_a_missing_or_unpartitioned_catalog_table_is_refused(tmp_path, spark, factory, url_env):
    source = _table(spark, tmp_path, "raw", source_table())
    spec = spark_spec(tmp_path, {"format": "spark_table", "table": source},
                      target={"format": "spark_table", "table": "no_such_table_here"})
    with pytest.raises(SpecError, match="does not exist; create it first"):
        plan_module.make_plan(spec, DAYS, factory)
    flat = f"flat_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {flat} ({DDL}) USING parquet LOCATION '{tmp_path / flat}'")
    with pytest.raises(SpecError, match="partitioned by \\(nothing\\)"):
        plan_module.make_plan(spark_spec(tmp_path, {"format": "spark_table", "table": flat}), DAYS, factory)


def test_the_source_sensor_finds_a_catalog_partition_whose_files_changed_and_asks_once(tmp_path, spark, factory,
                                                                                       url_env):
    from backfill_assets.core.build import open_build_engine
    source = _table(spark, tmp_path, "raw", source_table())
    spec = spark_spec(tmp_path, {"format": "spark_table", "table": source})
    assert plan_module.make_plan(spec, DAYS, factory).status == "ready"

    def tick(state):
        with factory() as conn, open_build_engine(conn, factory, spec) as engine:
            return engine.source_moves(state, None)

    assert tick(None).changed == {}
    # Another writer appends to 2024-01-02 through the catalog: a new file in its location.
    rows = source_table().filter(pa.compute.equal(source_table()["order_date"], pa.scalar(dt.date(2024, 1, 2))))
    folder = tmp_path / "more_rows"
    write_parquet_source(folder, rows.slice(0, 2))
    spark.read.parquet(str(folder)).select(*spark.table(source).columns).write.insertInto(source)
    first = tick(None)
    assert list(first.changed) == ["2024-01-02"]
    assert tick(first.state).changed == {}  # requested once
    plan_module.make_plan(spec, DAYS, factory)  # staged again: nothing is due
    assert tick(first.state).changed == {}
