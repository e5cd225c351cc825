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

from backfill_assets.cli import demo
from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.errors import ApprovalError, SourceDataError, SpecError, TransformError
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import URL_ENV, make_spec

COLUMNS = ["order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note"]
SCHEMA = pa.schema([
    ("order_date", pa.date32()), ("order_id", pa.int64()), ("customer_id", pa.int64()),
    ("updated_at", pa.timestamp("us", tz="UTC")), ("ingest_seq", pa.int64()), ("amount", pa.decimal128(12, 2)),
    ("status", pa.string()), ("note", pa.string()),
])
DAYS = PartitionRequest("2024-01-01..2024-01-03")
LABELS = ["2024-01-01", "2024-01-02", "2024-01-03"]


def _edge_rows() -> list[tuple]:
    """Rows the fingerprint must tell apart: NULLs, unicode, control characters, long text."""
    t = dt.datetime(2024, 1, 2, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    return [
        (dt.date(2024, 1, 2), 900001, None, t, 1, None, "ünïcødé ✓", "tab\there|pipe~tilde"),
        (dt.date(2024, 1, 2), 900002, 7, t, 2, decimal.Decimal("-0.00"), "", "line\nbreak\x01ctl"),
        (dt.date(2024, 1, 2), 900003, 8, t, 3, decimal.Decimal("9999999999.99"), None, "x" * 5000),
    ]


def source_table(rows: list[tuple] | None = None) -> pa.Table:
    rows = demo.source_rows(orders_per_day=6, moved=False) + _edge_rows() if rows is None else rows
    return pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=SCHEMA)


def write_delta(path: Path, data: pa.Table, mode: str = "overwrite") -> int:
    from deltalake import DeltaTable, write_deltalake
    write_deltalake(str(path), data, mode=mode, partition_by=["order_date"])
    return DeltaTable(str(path)).version()


def duck_spec(tmp_path: Path, source: dict[str, Any], target: str = "delta", **changes: Any):
    tgt: dict[str, Any] = (
        {"format": "delta", "location": str(tmp_path / "orders_daily")} if target == "delta"
        else {"format": "iceberg", "table": "sales.orders_daily",
              "catalog": {"type": "sql", "warehouse": str(tmp_path / "warehouse")}}
    )
    return make_spec(**{"engine": {"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
                        "source": source, "target": tgt, "records_can_move": False, **changes})


@pytest.fixture
def delta_source(tmp_path: Path) -> dict[str, Any]:
    write_delta(tmp_path / "orders_raw", source_table())
    return {"format": "delta", "location": str(tmp_path / "orders_raw")}


def _newest(rows: list[tuple], day: dt.date) -> list[tuple]:
    best: dict[int, tuple] = {}
    for r in rows:
        if r[0] != day or r[1] is None:
            continue
        if r[1] not in best or (r[3], r[4]) > (best[r[1]][3], best[r[1]][4]):
            best[r[1]] = r
    return sorted(best.values(), key=lambda r: r[1])


def _target_rows(path: Path, day: dt.date) -> list[tuple]:
    from deltalake import DeltaTable
    data = DeltaTable(str(path)).to_pyarrow_table().select(COLUMNS).to_pylist()
    return sorted((tuple(r[c] for c in COLUMNS) for r in data if r["order_date"] == day), key=lambda r: r[1])


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
        assert _target_rows(tmp_path / "orders_daily", day) == _newest(rows, day)
    # A rerun finds the approved rows in place and writes nothing.
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3


def test_the_content_hash_on_duckdb_equals_postgresql(tmp_path, factory, url_env, delta_source, conn):
    """For the same rows, each partition's content hash (and every reading) is the same
    whether the stages are built in PostgreSQL or in DuckDB."""
    demo.load(conn)
    conn.execute("TRUNCATE public.orders_raw")
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, "
                        "amount, status, note) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
    conn.commit()
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


def test_ties_and_null_ordering_values_are_refused(tmp_path, factory, url_env):
    t = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    tied = [(dt.date(2024, 1, 1), 1, 1, t, 5, decimal.Decimal("1.00"), "a", None),
            (dt.date(2024, 1, 1), 1, 1, t, 5, decimal.Decimal("2.00"), "b", None)]
    write_delta(tmp_path / "tied", source_table(tied))
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "tied")})
    with pytest.raises(SourceDataError, match="tie"):
        plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)
    nulls = [(dt.date(2024, 1, 1), 1, 1, t, None, decimal.Decimal("1.00"), "a", None)]
    schema = SCHEMA
    write_delta(tmp_path / "nulls", pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in nulls], schema=schema))
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "nulls")})
    with pytest.raises(SourceDataError, match="NULL values and no declared NULL placement"):
        plan_module.make_plan(spec, PartitionRequest("2024-01-01"), factory)


def test_a_vacuumed_version_is_refused_with_plan_again(tmp_path, factory, url_env, delta_source):
    from deltalake import DeltaTable
    spec = duck_spec(tmp_path, delta_source)
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    write_delta(tmp_path / "orders_raw", source_table())  # a new version replaces every file
    DeltaTable(str(tmp_path / "orders_raw")).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(ApprovalError, match="can no longer be read.*plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-v")
    assert not (tmp_path / "orders_daily").exists()


def test_a_refused_transform_names_the_construct(tmp_path, factory, url_env, delta_source):
    spec = duck_spec(tmp_path, delta_source, transform_sql=(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq,\n"
        "       amount, status, note || random()::VARCHAR AS note\nFROM source"))
    with pytest.raises(TransformError, match=r"random\(\) at line 2, column 32"):
        plan_module.make_plan(spec, DAYS, factory)


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

    from backfill_assets.core.duck.watch import lake_changes
    from backfill_assets.core.targets.delta import delta_predicate
    spec = duck_spec(tmp_path, delta_source)
    plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        assert lake_changes(conn, spec) == {}
        # Another writer replaces one day of the source: only that day is due again.
        day = source_table().filter(pa.compute.equal(source_table()["order_date"], pa.scalar(dt.date(2024, 1, 2))))
        write_deltalake(DeltaTable(delta_source["location"]), day, mode="overwrite",
                        predicate=delta_predicate("order_date", [dt.date(2024, 1, 2)]))
        assert list(lake_changes(conn, spec)) == ["2024-01-02"]
    # Snapshotted again, nothing is due.
    plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        assert lake_changes(conn, spec) == {}
