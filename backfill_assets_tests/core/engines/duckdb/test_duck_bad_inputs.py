"""The bad inputs of the PostgreSQL suite that apply to a lake source, on a Delta and on an
Iceberg source, through the core flow and the command line: ties, NULL ordering values, a
source that moves on after the plan, a pinned version that is gone, a refused transform."""

from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest
import yaml

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.errors import ApprovalError, SourceDataError, TransformError
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.cli_runs import run
from backfill_assets_tests.support.duck_lakes import (
    COLUMNS,
    DAYS,
    LakeSource,
    delta_rows,
    duck_spec,
    newest,
    source_table,
)

FORMATS = ["delta", "iceberg"]
ONE_DAY = PartitionRequest("2024-01-01")
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ties_are_refused_naming_the_key(tmp_path, factory, url_env, monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table([(dt.date(2024, 1, 1), 1, 1, T0, 5, decimal.Decimal("1.00"), "a", None),
                               (dt.date(2024, 1, 1), 1, 1, T0, 5, decimal.Decimal("2.00"), "b", None),
                               (dt.date(2024, 1, 1), 2, 1, T0, 5, decimal.Decimal("2.00"), "b", None),
                               (dt.date(2024, 1, 1), 2, 1, T0, 5, decimal.Decimal("2.00"), "b", None)]))
    with pytest.raises(SourceDataError, match=r"tie on every ordering column.*order_id=1 \(2 different rows\)") as err:
        plan_module.make_plan(duck_spec(tmp_path, source.spec), ONE_DAY, factory)
    assert "order_id=2" not in str(err.value)  # identical rows are no tie: either one is the same row


@pytest.mark.parametrize("fmt", FORMATS)
def test_null_ordering_values_need_a_declared_placement(tmp_path, factory, url_env, monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table([(dt.date(2024, 1, 1), 1, 1, T0, 1, None, "a", None),
                               (dt.date(2024, 1, 1), 1, 1, None, 2, None, "b", None)]))
    with pytest.raises(SourceDataError, match="updated_at: 1 row"):
        plan_module.make_plan(duck_spec(tmp_path, source.spec), ONE_DAY, factory)
    declared = duck_spec(tmp_path, source.spec, ordering=[
        {"column": "updated_at", "direction": "desc", "nulls": "last"}, {"column": "ingest_seq", "direction": "desc"}])
    plan = plan_module.make_plan(declared, ONE_DAY, factory)
    assert plan.status == "ready" and plan.document.partitions[0].stage_a.row_count == 1
    assert plan.document.partitions[0].stage_a.row_count == plan.document.partitions[0].stage_b.row_count


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_source_changed_after_the_plan_converges_on_the_pinned_version(tmp_path, factory, url_env, monkeypatch,
                                                                         fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table())
    spec = duck_spec(tmp_path, source.spec)
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    pinned = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    late = (dt.date(2024, 1, 1), 424242, 1, dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), 99,
            decimal.Decimal("1.00"), "late", None)
    source.write(source_table(pinned + [late]))  # a writer moves the source on after the approval
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    if fmt == "delta":
        assert delta_rows(tmp_path / "orders_daily", dt.date(2024, 1, 1)) == newest(pinned, dt.date(2024, 1, 1))
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
    # The next plan reads the newest version, with the late row.
    newer = plan_module.make_plan(spec, DAYS, factory)
    assert newer.document.snapshot.version != plan.document.snapshot.version
    assert newer.document.partitions[0].stage_a.row_count == plan.document.partitions[0].stage_a.row_count + 1


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_pinned_version_that_is_gone_is_refused_before_anything_is_written(tmp_path, factory, url_env,
                                                                            monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table())
    spec = duck_spec(tmp_path, source.spec)
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    source.write(source_table())  # a new version with new files ...
    source.drop_old_versions()  # ... and the pinned one vacuumed or expired
    with pytest.raises(ApprovalError, match="can no longer be read.*plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-v")
    with factory() as conn, pytest.raises(ApprovalError, match="plan again"):
        review(conn, factory, spec, plan.plan_id)
    assert not (tmp_path / "orders_daily").exists()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_refused_transform_names_the_construct_and_its_place(tmp_path, factory, url_env, monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table())
    spec = duck_spec(tmp_path, source.spec, transform_sql=(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq,\n"
        "       amount, status, note || random()::VARCHAR AS note\nFROM source"))
    with pytest.raises(TransformError, match=r"random\(\) at line 2, column 32"):
        plan_module.make_plan(spec, DAYS, factory)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_command_line_plans_approves_applies_and_refuses(tmp_path, url_env, capsys, monkeypatch, fmt):
    source = LakeSource(fmt, tmp_path, monkeypatch)
    source.write(source_table())
    spec_file = tmp_path / "duck.yaml"
    data = duck_spec(tmp_path, source.spec).model_dump(mode="json", exclude_defaults=True)
    spec_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, out, err = run(capsys, "inspect", "--spec", str(spec_file))
    assert code == 0, err
    assert "duckdb" in out and f"source {fmt}:" in out and "order_date date" in out
    code, out, err = run(capsys, "plan", "--spec", str(spec_file), "--partitions", "2024-01-01..2024-01-03", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["status"] == "ready" and plan["snapshot"]["mode"] == "lake" and plan["snapshot"]["version"]
    code, out, err = run(capsys, "approve", "--spec", str(spec_file), "--plan", plan["plan_id"], "--by", "tester",
                         "--yes")
    assert code == 0, err
    code, out, err = run(capsys, "apply", "--spec", str(spec_file), "--plan", plan["plan_id"], "--json")
    assert code == 0, err
    assert [p["status"] for p in json.loads(out)["partitions"]] == ["verified"] * 3
    code, out, err = run(capsys, "status", "--spec", str(spec_file))
    assert code == 0, err
    code, out, err = run(capsys, "diff", "--spec", str(spec_file), "--plan", plan["plan_id"])
    assert code == 0 and "unchanged" in out, err
    # A tie in the source after the apply: the next plan is refused by the command line, exit 4.
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    tied = (dt.date(2024, 1, 3), rows[-1][1], 1, T0, 5, decimal.Decimal("2.00"), "x", None)
    source.write(source_table(rows + [tied, (*tied[:5], decimal.Decimal("3.00"), "y", None)]))
    code, out, err = run(capsys, "plan", "--spec", str(spec_file), "--partitions", "2024-01-03")
    assert code == 4 and "tie" in err


def test_a_source_written_again_at_its_location_is_not_the_pinned_version(tmp_path, factory, url_env, monkeypatch):
    """A Delta table deleted and written again where it was has a version of the same number
    with other rows: the files that hold each partition tell it apart."""
    import shutil
    source = LakeSource("delta", tmp_path, monkeypatch)
    source.write(source_table())
    spec = duck_spec(tmp_path, source.spec)
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    shutil.rmtree(tmp_path / "orders_raw")
    source.write(source_table([tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()][1:]))
    with pytest.raises(ApprovalError, match="other files than when the snapshot was taken.*plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-r")
    assert not (tmp_path / "orders_daily").exists()


def test_a_database_file_another_process_holds_is_a_bounded_wait_exit_8(tmp_path, url_env, capsys, monkeypatch):
    """DuckDB lets one process at a time write a database file: a command that finds it held
    waits lock_timeout_ms, then exits 8 naming the file, safe to retry."""
    import subprocess
    import sys
    import time
    source = LakeSource("delta", tmp_path, monkeypatch)
    source.write(source_table())
    spec_file = tmp_path / "duck.yaml"
    data = duck_spec(tmp_path, source.spec, lock_timeout_ms=300).model_dump(mode="json", exclude_defaults=True)
    spec_file.write_text(yaml.safe_dump(data), encoding="utf-8")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"),
        str(tmp_path / "stages.duckdb")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        code, out, err = run(capsys, "plan", "--spec", str(spec_file), "--partitions", "2024-01-01")
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert code == 8, err
    assert "held by another process" in err and "lock_timeout_ms (300 ms)" in err
    assert waited < 30
