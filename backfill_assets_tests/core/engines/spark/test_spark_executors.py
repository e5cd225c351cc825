"""Approval, the change preview, apply and ``diff`` on Spark hold no partition's rows in the
driver: every path that would read a partition into Arrow in this process is made to fail, and
the whole flow still runs, on a Parquet folder and on a catalog table. What is switched in is
what Spark wrote and fingerprinted; and files are hashed by Spark's executors exactly as the
driver hashes them."""

from __future__ import annotations

import datetime as dt
import hashlib
import uuid
from pathlib import Path

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.diff import diff_plan
from backfill_assets.core.engines.spark import apply as spark_apply
from backfill_assets.core.engines.spark import files as spark_files
from backfill_assets.core.engines.spark import stages as spark_stages
from backfill_assets.core.engines.spark.parquet import STAGING, ParquetFolderTable
from backfill_assets.core.engines.spark.spark_table import SparkCatalogTable
from backfill_assets.core.errors import VerificationError
from backfill_assets.core.lake import target as lake_target
from backfill_assets_tests.support.duck_lakes import COLUMNS, DAYS, REWRITES, newest, one_row_short, source_table
from backfill_assets_tests.support.spark_lakes import spark_spec, target_rows, write_parquet_source

pytestmark = pytest.mark.spark

DDL = ("order_date DATE, order_id BIGINT, customer_id BIGINT, updated_at TIMESTAMP, ingest_seq BIGINT, "
       "amount DECIMAL(12,2), status STRING, note STRING")


def _no_rows_in_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way this process would read a partition's rows into Arrow fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError("a partition's rows were read into the driver")
    for cls in (ParquetFolderTable, SparkCatalogTable):
        monkeypatch.setattr(cls, "read", refused)
        monkeypatch.setattr(cls, "read_version", refused)
    monkeypatch.setattr(pq, "read_table", refused)
    monkeypatch.setattr(pads, "dataset", refused)
    monkeypatch.setattr(lake_target, "arrow_readings", refused)


def _catalog_table(spark, tmp_path: Path) -> str:
    table = f"daily_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {table} ({DDL}) USING parquet PARTITIONED BY (order_date) LOCATION '{tmp_path / table}'")
    return table


@pytest.mark.parametrize("target", ["parquet", "spark_table"])
def test_approval_preview_apply_and_diff_run_without_a_partition_in_the_driver(target, tmp_path: Path, spark, factory,
                                                                               url_env, monkeypatch):
    changes = {} if target == "parquet" else {"target": {"format": "spark_table", "table": _catalog_table(spark, tmp_path)}}
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"), **changes)
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    _no_rows_in_the_driver(monkeypatch)
    if target == "spark_table":  # as where stage and target are on two file systems: Spark rewrites the files
        monkeypatch.setattr(spark_apply, "_linked", lambda files, place: False)
    with factory() as conn:
        checked = review(conn, factory, spec, plan.plan_id)
        assert checked.changes is not None
        assert [c["added"] for c in checked.changes.values()] == [e.stage_a.row_count for e in plan.document.partitions]
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    found = diff_plan(spec, plan.plan_id, factory, against="target")
    assert [(d.added, d.removed, d.changed) for d in found.partitions] == [(0, 0, 0)] * 3
    assert [d.unchanged for d in found.partitions] == [e.stage_a.row_count for e in plan.document.partitions]
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
    monkeypatch.undo()
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    if target == "parquet":
        for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
            assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
            # Only data files were switched in (Spark's _SUCCESS and .crc files stayed behind).
            assert all(p.suffix == ".parquet" for p in (tmp_path / "orders_daily" / f"order_date={day}").iterdir())
        assert not any((tmp_path / "orders_daily" / STAGING).iterdir())


@pytest.mark.parametrize("how", ["linked", "written"])
def test_what_is_placed_is_fingerprinted_before_the_switch(how, tmp_path: Path, spark, factory, url_env, monkeypatch):
    """A placed partition one row short of stage A (stage A's files linked and then one
    rewritten; or, where they cannot be linked, Spark handed one row fewer) is caught by the
    fingerprint of the placed files before anything is switched in; nothing of it stays."""
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    if how == "linked":
        real_link = spark_apply._linked

        def linked_then_rewritten(files, place):
            assert real_link(files, place)
            one_row_short(next(place.glob("*.parquet")), "a new file")  # never the stage's own (a link shares it)
            return True

        monkeypatch.setattr(spark_apply, "_linked", linked_then_rewritten)
    else:
        real = spark_stages.stage_frame
        monkeypatch.setattr(spark_apply, "_linked", lambda files, place: False)
        monkeypatch.setattr(spark_apply, "stage_frame",
                            lambda session, ctx, variant, values: real(session, ctx, variant, values).offset(1))
    with pytest.raises(VerificationError, match="verification before commit"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert not (tmp_path / "orders_daily" / "order_date=2024-01-01").exists()
    staging = tmp_path / "orders_daily" / STAGING
    assert not staging.exists() or not any(staging.iterdir())
    if how == "linked":  # the link shared stage A's file: stage A is still as sealed, and the rerun writes it
        monkeypatch.undo()
        result = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
        assert [p["status"] for p in result.partitions] == ["verified"] * 3


@pytest.mark.parametrize("how", REWRITES)
def test_what_is_switched_in_is_proved_by_its_bytes_and_a_file_changed_after_the_switch_is_caught(
        how, tmp_path: Path, spark, factory, url_env, monkeypatch):
    """Stage A's files linked into the target are proved by their bytes, before the switch and
    after it: no row of them is fingerprinted again. A committed file another writer rewrites
    between the switch and the verification (a new file under the same name, or the same file
    written over, which a link shares with stage A) is no longer the sealed bytes: its rows
    are fingerprinted, and the verification after the commit fails."""
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    fingerprinted: list[str] = []
    real = spark_apply.files_readings

    def recorded(session, ctx, files):
        fingerprinted.extend(p for paths in files.values() for p in paths)
        return real(session, ctx, files)

    monkeypatch.setattr(spark_apply, "files_readings", recorded)
    first = apply_plan(spec, plan.plan_id, factory, run_id="run-1", only=["2024-01-01"])
    assert [p["status"] for p in first.partitions] == ["verified"]
    assert fingerprinted == []  # the target had no such partition, and what was switched in is stage A's bytes
    day = tmp_path / "orders_daily" / "order_date=2024-01-02"

    def rewrite(step, labels):
        if step == "committed":
            one_row_short(next(day.glob("*.parquet")), how)

    with pytest.raises(VerificationError, match="verification after commit"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-2", only=["2024-01-02"], checkpoint=rewrite)
    assert fingerprinted and all(Path(p).parent == day for p in fingerprinted)  # by rows, once the bytes differed


def test_files_hashed_by_the_executors_have_the_drivers_digests(tmp_path: Path, spark, monkeypatch):
    paths = []
    for n, size in enumerate((0, 1, 70_000, 3 * 2**20 + 5)):
        p = tmp_path / f"f{n}.bin"
        p.write_bytes(bytes((i * 7 + n) % 251 for i in range(size)))
        paths.append(str(p))
    expected = {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}
    asked = []

    def session():
        asked.append(1)
        return spark

    assert spark_files.sha256_files(paths, session) == expected
    assert not asked  # a few bytes: the driver hashes them, no Spark job
    monkeypatch.setattr(spark_files, "DRIVER_HASH_BYTES", 0)
    monkeypatch.setattr(spark_files, "driver_sha256", lambda found: pytest.fail(f"the driver hashed {found}") if found
                        else {})
    assert spark_files.sha256_files(paths, session) == expected
    assert asked


def test_a_footer_whose_schema_spark_read_before_is_read_without_a_job_and_another_by_spark_itself(tmp_path: Path,
                                                                                                     spark):
    """Spark reads a Parquet file's schema by a job of its own. Files whose footer schema it read
    before in this process are read with that schema and no job; files of another schema (a
    column's type changed), files whose footers differ, and a file that is no Parquet are read by
    Spark itself, as ever: their own types, never a schema remembered from other files."""
    def jobs() -> int:
        return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())

    def written(name: str, select: str) -> list[str]:
        spark.sql(f"SELECT {select}").coalesce(1).write.parquet(str(tmp_path / name))
        return sorted(str(p) for p in (tmp_path / name).glob("*.parquet"))

    # Column names of this test's own: no other test's read of the same schema is remembered.
    first = written("first", "CAST(1 AS BIGINT) AS k_footer_test, 'a' AS v_footer_test")
    same = written("same", "CAST(2 AS BIGINT) AS k_footer_test, 'b' AS v_footer_test")
    changed = written("changed", "CAST(3 AS BIGINT) AS k_footer_test, 3 AS v_footer_test")
    before = jobs()
    assert spark_files.parquet_files(spark, first).collect() == [(1, "a")]
    read = jobs()
    assert spark_files.parquet_files(spark, first).collect() == [(1, "a")]
    assert spark_files.parquet_files(spark, same).collect() == [(2, "b")]
    assert jobs() - read == 2 and read - before > 1  # the two collects alone; the first read inferred too
    again = jobs()
    frame = spark_files.parquet_files(spark, changed)
    assert jobs() > again  # inferred by Spark, not taken from the other schema
    assert frame.schema == spark.read.parquet(*changed).schema and frame.collect() == [(3, 3)]
    assert spark_files.parquet_files(spark, [*first, *changed]).schema == spark.read.parquet(*first, *changed).schema
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"half a file")
    with pytest.raises(Exception) as err:  # Spark's own error, as before
        spark_files.parquet_files(spark, [str(broken)]).collect()
    assert "pyspark" in type(err.value).__module__ or "py4j" in type(err.value).__module__


def test_the_change_preview_reads_its_kept_join_in_the_partitions_adaptive_execution_left(tmp_path: Path, spark,
                                                                                         factory, url_env,
                                                                                         monkeypatch):
    """The comparison keeps its join on the executors for the counts and the first keys. With
    Spark's default 200 shuffle partitions, a kept plan kept all 200 unless our sessions let
    adaptive execution coalesce it: every read of it was 200 tasks, however few its rows."""
    from backfill_assets.core.engines.spark import engine as spark_engine
    made = spark_engine.session_for

    def with_default_partitions(spec):
        session = made(spec)
        session.conf.set("spark.sql.shuffle.partitions", "200")  # Spark's default (the tests' session sets 4)
        return session

    monkeypatch.setattr(spark_engine, "session_for", with_default_partitions)
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    tracker = spark.sparkContext.statusTracker()
    first = int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())
    with factory() as conn:
        checked = review(conn, factory, spec, plan.plan_id)
    assert checked.changes is not None and all(c["added"] > 0 for c in checked.changes.values())
    last = int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())
    tasks = sum(tracker.getStageInfo(s).numTasks for j in range(first, last)
                for s in tracker.getJobInfo(j).stageIds if tracker.getStageInfo(s) is not None)
    assert 0 < tasks < 200, tasks
