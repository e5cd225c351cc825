"""A Parquet folder partition is replaced in one switch: a concurrent reader sees the old rows
or the new ones, never an empty or half-written partition; apply killed after the switch leaves the
new partition, and the rerun converges (killed before it, the old one: test_spark_cluster.py)."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.dataset as pads
import pytest
import yaml

from backfill_assets.cli.crash_hook import PAUSE_ENV, PAUSE_FILE_ENV
from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.engines.spark.parquet import STAGING, ParquetFolderTable, partition_dir
from backfill_assets_tests.support.duck_lakes import DAYS, LABELS, source_table
from backfill_assets_tests.support.spark_lakes import listed_rows, spark_mapping, spark_spec, write_parquet_source
from backfill_assets_tests.support.specs import REPO, URL_ENV

VICTIM = "2024-01-02"


def _more_rows() -> list[tuple]:
    t = dt.datetime(2024, 1, 5, tzinfo=dt.timezone.utc)
    return [(dt.date(2024, 1, 2), 800000 + i, 1, t, 1, decimal.Decimal("1.00"), "new", None) for i in range(40)]


def _applied_then_replanned(tmp_path, factory):
    """The first plan applied; a second plan, with more rows in every partition, approved."""
    from backfill_assets.cli import demo
    from backfill_assets_tests.support.duck_lakes import edge_rows
    folder = tmp_path / "raw"
    spec = spark_spec(tmp_path, write_parquet_source(folder))
    first = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, first, "tester")
    apply_plan(spec, first.plan_id, factory, run_id="run-1")
    write_parquet_source(folder, source_table(demo.source_rows(orders_per_day=6, moved=False) + edge_rows()
                                              + _more_rows()))
    second = plan_module.make_plan(spec, DAYS, factory)
    assert second.status == "ready", second.problems
    with factory() as conn:
        approve_plan(conn, factory, spec, second, "tester")
    return spec, first, second


def _hashes(plan) -> dict[str, tuple[int, str]]:
    return {e.partition: (e.stage_a.row_count, e.stage_a.content_hash) for e in plan.document.partitions}


def _now(spec, labels=LABELS) -> dict[str, tuple[int, str]]:
    """Each partition's (rows, content hash) as the target holds it now."""
    from backfill_assets.core.catalog import ColumnInfo
    from backfill_assets.core.fingerprint.arrow import arrow_readings
    from backfill_assets.core.fingerprint.kinds import lake_schema
    table = ParquetFolderTable(spec.target.location, spec.partition_key)
    columns = [ColumnInfo("order_date", "date", "D", False, "date"), ColumnInfo("order_id", "bigint", "N", False, "int8"),
               ColumnInfo("customer_id", "bigint", "N", False, "int8"),
               ColumnInfo("updated_at", "timestamp with time zone", "D", False, "timestamptz"),
               ColumnInfo("ingest_seq", "bigint", "N", False, "int8"),
               ColumnInfo("amount", "numeric(12,2)", "N", False, "numeric"), ColumnInfo("status", "text", "S", True, "text"),
               ColumnInfo("note", "text", "S", True, "text")]
    out = {}
    for label in labels:
        data = table.read(table.open(), spec.partition_key, [dt.date.fromisoformat(label)])
        data = lake_schema(columns).empty_table() if data.num_rows == 0 else data.select(
            [c.name for c in columns]).cast(lake_schema(columns))
        fp = arrow_readings(data, columns, spec.business_key, spec.total)
        out[label] = (fp.row_count, fp.content_hash)
    return out


def test_a_concurrent_reader_never_sees_a_partition_empty_or_half_written(tmp_path, spark, factory, url_env):
    spec, first, second = _applied_then_replanned(tmp_path, factory)
    old, new = _hashes(first)[VICTIM][0], _hashes(second)[VICTIM][0]
    assert old != new
    part = Path(spec.target.location) / partition_dir(spec.partition_key, dt.date(2024, 1, 2))
    seen: list[int] = []
    vanished = [0]
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(listed_rows(part))
            except (FileNotFoundError, OSError):
                vanished[0] += 1  # listed just before a switch, opened just after: an error, never wrong rows

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        result = apply_plan(spec, second.plan_id, factory, run_id="run-2")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert {p["partition"]: p["status"] for p in result.partitions}[VICTIM] == "verified"
    assert seen and set(seen) <= {old, new}, sorted(set(seen))
    assert seen[-1] == new


def _killed_at(step: str, spec, plan_id: str, tmp_path: Path, url: str) -> None:
    """Run apply as the command line does, and kill it (SIGKILL) when it reaches ``step`` in VICTIM."""
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spark_mapping(tmp_path, spec.source.model_dump())), encoding="utf-8")
    marker = tmp_path / f"paused-{step}"
    env = {**os.environ, URL_ENV: url, PAUSE_ENV: f"{step}:{VICTIM}", PAUSE_FILE_ENV: str(marker)}
    proc = subprocess.Popen([sys.executable, "-m", "backfill_assets.cli", "apply", "--spec", str(spec_file),
                             "--plan", plan_id, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"apply never reached {step}: {proc.communicate()[1][-2000:]!r}")
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_apply_killed_after_the_switch_leaves_the_new_partition_and_the_rerun_converges(
        tmp_path, spark, factory, url_env, db_url):
    """Killed before the switch, apply leaves the old partition: test_spark_cluster.py kills it
    there, against a standalone master and through Spark Connect."""
    spec, first, second = _applied_then_replanned(tmp_path, factory)
    old, new = _hashes(first), _hashes(second)
    _killed_at("committed", spec, second.plan_id, tmp_path, db_url.reveal())
    now = _now(spec)
    assert now[VICTIM] == new[VICTIM]  # switched, never a mix; killed before its verification
    assert now["2024-01-03"] == old["2024-01-03"]  # never reached
    result = apply_plan(spec, second.plan_id, factory, run_id="rerun")
    assert all(p["status"] in ("verified", "skipped-already-verified") for p in result.partitions)
    assert _now(spec) == new


def test_what_a_killed_write_left_is_skipped_by_readers_and_removed_later(tmp_path):
    table = ParquetFolderTable(str(tmp_path / "t"), "order_date")
    data = source_table()
    table.create(data.schema, "order_date")
    first_day = data.take([i for i, d in enumerate(data["order_date"].to_pylist()) if d == dt.date(2024, 1, 1)])
    table.overwrite(table.open(), "order_date", [dt.date(2024, 1, 1)], first_day, {})
    left = tmp_path / "t" / STAGING / "dead" / "order_date=2024-01-01"
    left.mkdir(parents=True)
    (left / "part-0.parquet").write_bytes(b"half a file")
    rows = pads.dataset(str(tmp_path / "t"), format="parquet", partitioning="hive",
                        exclude_invalid_files=False).to_table().num_rows
    assert rows == first_day.num_rows
    old = time.time() - 2 * 86400
    os.utime(tmp_path / "t" / STAGING / "dead", (old, old))
    table.overwrite(table.open(), "order_date", [dt.date(2024, 1, 2)], data.slice(0, 0), {})
    assert not (tmp_path / "t" / STAGING / "dead").exists()


def test_the_switch_is_a_compare_and_swap_and_never_replaces_what_appeared(tmp_path):
    """A writer that changes the partition while ours is written, or creates it (even empty),
    makes our switch fail with nothing of ours in place; a replaced partition's grace starts at
    the switch."""
    from backfill_assets.core.engines.spark.parquet import REPLACED, _files
    from backfill_assets.core.errors import TransientDatabaseError
    table = ParquetFolderTable(str(tmp_path / "t"), "order_date")
    old = tmp_path / "t" / "order_date=2024-01-01"
    old.mkdir(parents=True)
    (old / "part-0.parquet").write_bytes(b"ours as read")
    seen = _files(old)
    (old / "part-1.parquet").write_bytes(b"a foreign writer's")  # after we read, before our switch
    new = tmp_path / "new"
    new.mkdir()
    (new / "part-9.parquet").write_bytes(b"ours")
    with pytest.raises(TransientDatabaseError, match="changed order_date=2024-01-01"):
        table._switch(new, old, seen)
    assert sorted(p.name for p in old.iterdir()) == ["part-0.parquet", "part-1.parquet"]
    assert sorted(p.name for p in new.iterdir()) == ["part-9.parquet"]
    appeared = tmp_path / "t" / "order_date=2024-01-02"
    appeared.mkdir()  # empty: a plain rename would replace it
    with pytest.raises(TransientDatabaseError, match="created order_date=2024-01-02"):
        table._switch(new, appeared, None)
    assert not any(appeared.iterdir())
    table._switch(new, old, _files(old))
    assert sorted(p.name for p in old.iterdir()) == ["part-9.parquet"]
    (kept,) = (tmp_path / "t" / REPLACED).iterdir()
    assert time.time() - kept.stat().st_mtime < 60  # the grace starts now, not at the files' own time


def test_a_write_lists_the_partitions_it_touches_and_still_sees_a_change_since_its_read(tmp_path, monkeypatch):
    """One partition of a 60-partition folder read and replaced: the files of that partition
    are listed, not the whole folder's, until the committed version is named; a writer that
    changed it between our read and our write still fails ours, with nothing switched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from backfill_assets.core.engines.spark import parquet
    from backfill_assets.core.errors import TransientDatabaseError
    root = tmp_path / "t"
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(60)]
    for day in days:
        (root / partition_dir("d", day)).mkdir(parents=True)
        pq.write_table(pa.table({"k": [1, 2]}), root / partition_dir("d", day) / "part-0.parquet")
    table = ParquetFolderTable(str(root), "d")
    listed: list[str] = []
    real = parquet._files
    monkeypatch.setattr(parquet, "_files", lambda d: listed.append(d.name) or real(d))
    handle = table.open()
    assert table.read(handle, "d", [days[5]]).num_rows == 2
    assert table.read_version(None, "d", [days[5]]).num_rows == 2
    assert listed == [partition_dir("d", days[5])] * 2
    pq.write_table(pa.table({"k": [3]}), root / partition_dir("d", days[5]) / "part-1.parquet")  # a foreign writer
    rows = pa.table({"k": [9], "d": [days[5]]})
    with pytest.raises(TransientDatabaseError, match=f"changed {partition_dir('d', days[5])}"):
        table.overwrite(handle, "d", [days[5]], rows, {})
    assert table.read(table.open(), "d", [days[5]]).num_rows == 3
    fresh = table.open()
    table.read(fresh, "d", [days[5]])
    version = table.overwrite(fresh, "d", [days[5]], rows, {})
    assert version == table.open().version  # the committed version names the whole folder
    assert table.read(table.open(), "d", [days[5]]).column("k").to_pylist() == [9]
