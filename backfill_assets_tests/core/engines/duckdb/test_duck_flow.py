"""The whole process on DuckDB (engine: {type: duckdb}) against real lake tables on disk and
the real control store: a Delta, an Iceberg and a Parquet source, Delta and Iceberg targets,
the bad inputs of the PostgreSQL suite that apply, and one fingerprint with PostgreSQL."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.build import open_build_engine
from backfill_assets.core.errors import ApprovalError, SpecError
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import (
    COLUMNS,
    DAYS,
    LABELS,
    SCHEMA,
    delta_rows,
    delta_source,
    duck_spec,
    load_postgres_source,
    newest,
    source_table,
)
from backfill_assets_tests.support.specs import URL_ENV, make_spec


@pytest.fixture(name="delta_source")
def _delta_source(tmp_path: Path) -> dict[str, Any]:
    return delta_source(tmp_path)


def test_delta_to_delta_plans_approves_applies_and_converges(tmp_path, factory, url_env, delta_source):
    spec = duck_spec(tmp_path, delta_source)
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    assert plan.document.snapshot.mode == "lake" and plan.document.snapshot.version == "0"
    assert [p.partition for p in plan.document.partitions] == LABELS
    # Independent builds agree, and the plan is the same when made again from the same version.
    assert plan_module.make_plan(spec, DAYS, factory).plan_id == plan.plan_id
    with factory() as conn:
        checked = review(conn, factory, spec, plan.plan_id)
        assert checked.changes is not None and all(c["added"] > 0 for c in checked.changes.values())
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    expected = source_table().to_pylist()
    rows = [tuple(r[c] for c in COLUMNS) for r in expected]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert delta_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    # A rerun finds the approved rows in place and writes nothing.
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
    # Reviewed now, the plan changes nothing: every key of the target is unchanged.
    with factory() as conn:
        now = review(conn, factory, spec, plan.plan_id).changes
    assert now == {e.partition: {"added": 0, "removed": 0, "changed": 0, "unchanged": e.stage_a.row_count}
                   for e in plan.document.partitions}


def _edit_stage(tmp_path: Path, statement: str) -> None:
    """Change stage A behind the tool's back, as anyone with the DuckDB file could."""
    import duckdb
    with duckdb.connect(str(tmp_path / "stages.duckdb")) as con:
        con.execute(statement)


def test_a_stage_changed_after_the_plan_is_refused_by_approval(tmp_path, factory, url_env, delta_source):
    spec = duck_spec(tmp_path, delta_source)
    plan = plan_module.make_plan(spec, DAYS, factory)
    _edit_stage(tmp_path, "UPDATE orders_daily__stage_a SET amount = amount - 0.01 WHERE order_id = 900003")
    with factory() as conn, pytest.raises(ApprovalError, match=r"no longer has the planned fingerprint in partition\(s\) 2024-01-02; plan again"):
        approve_plan(conn, factory, spec, plan, "tester")


def test_a_stage_changed_after_the_approval_is_refused_before_anything_is_written(tmp_path, factory, url_env,
                                                                               delta_source):
    spec = duck_spec(tmp_path, delta_source)
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    # A change the seal alone cannot see (DuckDB's hash takes -0 for 0): the note's case.
    _edit_stage(tmp_path, "UPDATE orders_daily__stage_a SET note = upper(note) WHERE order_id = 900001")
    with pytest.raises(ApprovalError, match="2024-01-02; plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-x")
    assert not (tmp_path / "orders_daily").exists()


def test_the_seal_tells_a_negative_zero_from_zero(tmp_path, factory, url_env):
    """A double key column's -0.0 and 0.0 hash alike in DuckDB; the seal renders doubles by their
    bits, so a stage whose 0.0 became -0.0 is fingerprinted again and refused."""
    t = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    schema = pa.schema([("order_date", pa.date32()), ("order_id", pa.int64()), ("score", pa.float64()),
                        ("updated_at", pa.timestamp("us", tz="UTC"))])
    from deltalake import write_deltalake
    write_deltalake(str(tmp_path / "scores"), pa.Table.from_pylist(
        [{"order_date": dt.date(2024, 1, 1), "order_id": 1, "score": 0.0, "updated_at": t}], schema=schema),
        partition_by=["order_date"])
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "scores")},
                     columns=["order_date", "order_id", "score", "updated_at"], total=None,
                     ordering=[{"column": "updated_at", "direction": "desc"}])
    plan = plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert plan.status == "ready", plan.problems
    # (DuckDB skips an UPDATE to an equal value, and -0.0 = 0.0: the row is written again.)
    _edit_stage(tmp_path, "INSERT INTO orders_daily__stage_a SELECT order_date, order_id, CAST('-0.0' AS DOUBLE), "
                          "updated_at FROM orders_daily__stage_a; DELETE FROM orders_daily__stage_a WHERE "
                          "printf('%a', score) = '0x0p+0'")
    with factory() as conn, pytest.raises(ApprovalError, match="no longer has the planned fingerprint"):
        approve_plan(conn, factory, spec, plan, "tester")


def test_the_content_hash_on_duckdb_equals_postgresql(tmp_path, factory, url_env, delta_source, conn):
    """For the same rows, each partition's content hash (and every reading) is the same
    whether the stages are built in PostgreSQL or in DuckDB."""
    load_postgres_source(conn)
    on_pg = plan_module.make_plan(make_spec(records_can_move=False, target={"format": "delta", "location": str(tmp_path / "pg_target")}), DAYS, factory)
    on_duck = plan_module.make_plan(duck_spec(tmp_path, delta_source), DAYS, factory)
    assert on_pg.status == on_duck.status == "ready"
    for a, b in zip(on_pg.document.partitions, on_duck.document.partitions):
        assert a.stage_a == b.stage_a and a.stage_b == b.stage_b
        assert a.source.rows_read == b.source.rows_read
    assert on_pg.document.columns == on_duck.document.columns


def test_an_iceberg_source_to_an_iceberg_target(tmp_path, factory, url_env):
    from pyiceberg.catalog.sql import SqlCatalog
    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/src_wh")
    catalog.create_namespace("raw")
    table = catalog.create_table("raw.orders_raw", schema=SCHEMA)
    table.append(source_table())
    source = {"format": "iceberg", "table": "raw.orders_raw",
              "catalog": {"type": "sql", "uri_env": "BFA_TEST_ICEBERG_SOURCE", "warehouse": str(tmp_path / "src_wh")}}
    import os
    os.environ["BFA_TEST_ICEBERG_SOURCE"] = f"sqlite:///{tmp_path}/cat.db"
    try:
        spec = duck_spec(tmp_path, source, target="iceberg")
        plan = plan_module.make_plan(spec, DAYS, factory)
        assert plan.status == "ready", plan.problems
        assert plan.document.snapshot.version == str(table.current_snapshot().snapshot_id)
        with factory() as conn:
            approve_plan(conn, factory, spec, plan, "tester")
        result = apply_plan(spec, plan.plan_id, factory, run_id="run-i")
        assert [p["status"] for p in result.partitions] == ["verified"] * 3
        # The source moves on: the approved plan still reads its pinned snapshot and converges.
        table.append(source_table([(dt.date(2024, 1, 1), 777, 1, dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc),
                                    99, decimal.Decimal("1.00"), "late", None)]))
        again = apply_plan(spec, plan.plan_id, factory, run_id="run-j")
        assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
        # Expired: the pinned snapshot is gone, approval is refused with "plan again".
        pinned = int(plan.document.snapshot.version)
        table.maintenance.expire_snapshots().by_id(pinned).commit()
        with factory() as conn, pytest.raises(ApprovalError, match="plan again"):
            review(conn, factory, spec, plan.plan_id)
    finally:
        del os.environ["BFA_TEST_ICEBERG_SOURCE"]


def test_a_parquet_folder_is_pinned_by_its_files(tmp_path, factory, url_env):
    folder = tmp_path / "parquet_raw"
    data = source_table()
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        part = folder / f"order_date={day.isoformat()}"
        part.mkdir(parents=True)
        pq.write_table(data.filter(pa.compute.equal(data["order_date"], pa.scalar(day))).drop(["order_date"]),
                       part / "part-0.parquet")
    spec = duck_spec(tmp_path, {"format": "parquet", "location": str(folder)})
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    # A file rewritten after the approval: apply refuses before writing anything.
    (folder / "order_date=2024-01-02" / "part-0.parquet").write_bytes(
        (folder / "order_date=2024-01-01" / "part-0.parquet").read_bytes())
    with pytest.raises(ApprovalError, match="rewritten.*plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-p")
    assert not (tmp_path / "orders_daily").exists()


def test_an_accepted_transform_is_built_in_duckdb(tmp_path, factory, url_env, delta_source):
    spec = duck_spec(tmp_path, delta_source, transform_sql=(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount * 2 AS amount, "
        "upper(status) AS status, note FROM source"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems


def test_spec_shape_errors_name_the_engine(tmp_path):
    with pytest.raises(SpecError, match="engine duckdb writes a lake target"):
        make_spec(engine={"type": "duckdb"}, source={"format": "delta", "location": "x"}, records_can_move=False)
    with pytest.raises(SpecError, match="is read by `engine: {type: duckdb}`"):
        make_spec(source={"format": "delta", "location": "x"}, target={"format": "delta", "location": "y"},
                  records_can_move=False)
    assert URL_ENV


def test_the_lake_sensor_finds_the_partitions_whose_files_changed(tmp_path, factory, url_env, delta_source):
    from deltalake import DeltaTable, write_deltalake

    from backfill_assets.core.lake.delta import delta_predicate
    from backfill_assets.core.pinned.watch import lake_changes
    spec = duck_spec(tmp_path, delta_source)
    plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        assert lake_changes(conn, spec) == {}
        # Another writer replaces one day of the source: only that day is due again.
        day = source_table().filter(pa.compute.equal(source_table()["order_date"], pa.scalar(dt.date(2024, 1, 2))))
        write_deltalake(DeltaTable(delta_source["location"]), day, mode="overwrite",
                        predicate=delta_predicate("order_date", [dt.date(2024, 1, 2)]))
        assert list(lake_changes(conn, spec)) == ["2024-01-02"]
        with open_build_engine(conn, factory, spec) as engine:
            first = engine.source_moves(None, None)
            assert list(first.changed) == ["2024-01-02"]
            assert engine.source_moves(first.state, None).changed == {}  # requested once
    # Snapshotted again, nothing is due, and the cursor forgets the day: its next change is new.
    plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        assert lake_changes(conn, spec) == {}
        with open_build_engine(conn, factory, spec) as engine:
            assert engine.source_moves(first.state, None).state == {}


def test_a_delta_source_not_partitioned_by_the_partition_key_reads_only_the_planned_partitions(tmp_path, factory,
                                                                                                url_env):
    """DuckDB reads a Delta version's files itself (within its memory_limit); a table that is
    not partitioned by the spec's partition key has every partition in each file, and only the
    planned ones are read: the plan is the same as over a partitioned table."""
    from deltalake import write_deltalake
    write_deltalake(str(tmp_path / "flat"), source_table())  # no partition_by
    flat = plan_module.make_plan(duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "flat")}),
                                 PartitionRequest("2024-01-02"), factory)
    assert flat.status == "ready", flat.problems
    (tmp_path / "p").mkdir()
    write_deltalake(str(tmp_path / "p" / "parted"), source_table(), partition_by=["order_date"])
    parted = plan_module.make_plan(duck_spec(tmp_path / "p", {"format": "delta", "location": str(tmp_path / "p" / "parted")},
                                             name="orders_parted"), PartitionRequest("2024-01-02"), factory)
    assert [e.stage_a for e in flat.document.partitions] == [e.stage_a for e in parted.document.partitions]
