"""The whole process on Apache Spark (engine: {type: spark}) in a real local session, against
real Parquet folders, a real PostgreSQL table read over JDBC, and the real control store."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import COLUMNS, DAYS, LABELS, load_postgres_source, newest, source_table
from backfill_assets_tests.support.spark_lakes import spark_spec, target_rows, write_parquet_source

DAY_LIST = [dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)]


def test_parquet_to_parquet_plans_approves_applies_and_converges(tmp_path: Path, spark, factory, url_env):
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    assert [p.partition for p in plan.document.partitions] == LABELS
    assert plan_module.make_plan(spec, DAYS, factory).plan_id == plan.plan_id
    with factory() as conn:
        checked = review(conn, factory, spec, plan.plan_id)
        assert checked.changes is not None and all(c["added"] > 0 for c in checked.changes.values())
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    for day in DAY_LIST:
        assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3


def test_the_content_hash_on_spark_equals_postgresql_and_duckdb(tmp_path, spark, factory, url_env, conn, db_url,
                                                                monkeypatch):
    """For the same rows, every reading of every partition (the content hash among them) is the
    same whether the stages are built in PostgreSQL, in DuckDB, or in Spark from a Parquet
    folder or from the PostgreSQL table read over JDBC."""
    from backfill_assets_tests.support.duck_lakes import delta_source, duck_spec
    from backfill_assets_tests.support.spark_lakes import JDBC_ENV, jdbc_url
    from backfill_assets_tests.support.specs import make_spec
    load_postgres_source(conn)
    on_pg = plan_module.make_plan(make_spec(records_can_move=False, target={
        "format": "delta", "location": str(tmp_path / "pg_target")}), DAYS, factory)
    on_duck = plan_module.make_plan(duck_spec(tmp_path, delta_source(tmp_path)), DAYS, factory)
    on_spark = plan_module.make_plan(spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw")), DAYS, factory)
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        jdbc = spark_spec(tmp_path / "j", {"format": "jdbc", "table": "public.orders_raw", "url_env": JDBC_ENV},
                          name="orders_jdbc")
        over_jdbc = plan_module.make_plan(jdbc, DAYS, factory)
    plans = [on_pg, on_duck, on_spark, over_jdbc]
    assert [p.status for p in plans] == ["ready"] * 4, [p.problems for p in plans]
    for entries in zip(*(p.document.partitions for p in plans)):
        assert len({(e.stage_a, e.stage_b) for e in entries}) == 1
        assert len({e.source.rows_read for e in entries}) == 1
    assert on_pg.document.columns == on_spark.document.columns == over_jdbc.document.columns


def test_two_runs_building_other_partitions_at_once_keep_each_others_stages(tmp_path, spark, factory, url_env):
    """Two runs of a multi-run backfill (spec ``parallel``) build at once, each its own days,
    into one staging folder: each writes in a folder of its own and moves its partitions in,
    and seals each partition in a file of its own, so neither loses the other's stages; both
    plans then apply, and give the stages one run of all three days gives."""
    import threading

    from backfill_assets.core.engines.spark.stages import stage_dir
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"),
                      parallel={"max_partitions_per_run": 2, "max_concurrent_builds": 2})
    plans: dict[str, object] = {}
    errors: list[BaseException] = []

    def build(request: str) -> None:
        try:  # the snapshot and stages steps of a Dagster run, holding their own partitions
            snapshot = plan_module.snapshot_step(spec, PartitionRequest(request), factory)
            plans[request] = plan_module.stages_step(spec, snapshot.snapshot_id, factory)[1]
        except BaseException as err:  # noqa: BLE001 - reported below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=build, args=(r,)) for r in ("2024-01-01", "2024-01-02..2024-01-03")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.status for p in plans.values()] == ["ready", "ready"], [p.problems for p in plans.values()]
    assert not list(stage_dir(spec, "a").glob("_building-*"))
    for plan in plans.values():
        with factory() as conn:
            approve_plan(conn, factory, spec, plan, "tester")
        result = apply_plan(spec, plan.plan_id, factory, run_id=f"run-{plan.plan_id[:8]}")
        assert {p["status"] for p in result.partitions} == {"verified"}
    whole = plan_module.make_plan(spark_spec(tmp_path / "one", write_parquet_source(tmp_path / "one" / "raw"),
                                             name="orders_one_run"), DAYS, factory)
    apart = {e.partition: e.stage_a for p in plans.values() for e in p.document.partitions}
    assert apart == {e.partition: e.stage_a for e in whole.document.partitions}


def _kept(conn, variant: str) -> dict[str, bool]:
    return dict(conn.execute(
        "SELECT partition, kept FROM backfill_control.stage_builds WHERE spec_name = 'orders_daily' "
        "AND variant = %s", (variant,)).fetchall())


def test_stage_b_is_hashed_as_built_and_written_only_where_it_differs(tmp_path, spark, factory, url_env, conn,
                                                                       monkeypatch):
    """Stage B's rows are fingerprinted as Spark builds them: while they equal stage A's, none
    is written, and the stage checks and ``diff --against stage_b`` read it from its build's
    record. A stage B that keeps each key's oldest version differs wherever a key has two: it
    is built again from the same pin and written for those partitions only, and the refused
    plan names the differing keys."""
    from backfill_assets.core.diff import diff_plan
    from backfill_assets.core.engines.spark import stages as spark_stages
    from backfill_assets.core.stages import read_stages
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    b_dir, a_dir = spark_stages.stage_dir(spec, "b"), spark_stages.stage_dir(spec, "a")
    assert b_dir.is_dir() and not list(b_dir.glob("order_date=*"))
    assert len(list(a_dir.glob("order_date=*"))) == 3
    assert set(_kept(conn, "b").values()) == {False} and set(_kept(conn, "a").values()) == {True}
    states = read_stages(spec, plan.labels, factory)
    assert all(s.match and s.plan_id == plan.plan_id for s in states), [s.problems for s in states]
    assert [s.b for s in states] == [p.stage_b for p in plan.document.partitions]
    found = diff_plan(spec, plan.plan_id, factory, against="stage_b")
    assert [(d.added, d.removed, d.changed) for d in found.partitions] == [(0, 0, 0)] * 3

    real = spark_stages.newest

    def oldest_in_b(inp, spec, variant, partitions):
        if variant == "b":
            spec = spec.model_copy(update={"ordering": [
                o.model_copy(update={"direction": "asc" if o.direction == "desc" else "desc"}) for o in spec.ordering]})
        return real(inp, spec, variant, partitions)

    monkeypatch.setattr(spark_stages, "newest", oldest_in_b)
    refused = plan_module.make_plan(spec, DAYS, factory)
    assert refused.status == "refused"
    differ = [p.partition for p in refused.document.partitions if not p.match]
    assert differ and any("first differing key(s), stage A against stage B: order_id=" in p for p in refused.problems)
    kept = _kept(conn, "b")
    assert {label for label, k in kept.items() if k} == set(differ)
