"""Bad inputs on the Spark engine: each refused with a message that names the problem and what
to do, before anything is written; and a JDBC URL's password never shown."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from backfill_assets.cli.commands import main
from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, review
from backfill_assets.core.errors import ApprovalError, SourceDataError, SpecError
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets_tests.support.duck_lakes import DAYS, load_postgres_source, source_table
from backfill_assets_tests.support.spark_lakes import (
    JDBC_ENV,
    jdbc_url,
    spark_mapping,
    spark_spec,
    write_parquet_source,
)
from backfill_assets_tests.support.specs import CANARY, REPO, URL_ENV

T = dt.datetime(2024, 1, 2, 9, 0, tzinfo=dt.timezone.utc)


def _with(*extra: tuple):
    from backfill_assets.cli import demo
    from backfill_assets_tests.support.duck_lakes import edge_rows
    return source_table(demo.source_rows(orders_per_day=6, moved=False) + edge_rows() + list(extra))


def test_rows_that_tie_on_every_ordering_column_are_refused(tmp_path, spark, factory, url_env):
    source = write_parquet_source(tmp_path / "raw", _with(
        (dt.date(2024, 1, 2), 500, 1, T, 7, decimal.Decimal("1.00"), "a", None),
        (dt.date(2024, 1, 2), 500, 1, T, 7, decimal.Decimal("2.00"), "a", None)))
    with pytest.raises(SourceDataError, match="tie on every ordering column") as err:
        plan_module.make_plan(spark_spec(tmp_path, source), DAYS, factory)
    assert "order_id=500" in str(err.value) and "tiebreak" in str(err.value)
    assert not (tmp_path / "orders_daily").exists()


def test_identical_duplicate_rows_are_not_a_tie(tmp_path, spark, factory, url_env):
    row = (dt.date(2024, 1, 2), 501, 1, T, 7, decimal.Decimal("1.00"), "a", "x")
    plan = plan_module.make_plan(spark_spec(tmp_path, write_parquet_source(tmp_path / "raw", _with(row, row))),
                                 DAYS, factory)
    assert plan.status == "ready", plan.problems


def test_null_ordering_values_need_a_declared_placement(tmp_path, spark, factory, url_env):
    source = write_parquet_source(tmp_path / "raw", _with(
        (dt.date(2024, 1, 3), 502, 1, None, 1, decimal.Decimal("1.00"), "a", None),
        (dt.date(2024, 1, 3), 502, 1, T, 2, decimal.Decimal("2.00"), "b", None)))
    with pytest.raises(SourceDataError, match="no declared NULL placement"):
        plan_module.make_plan(spark_spec(tmp_path, source), DAYS, factory)
    # Declared: NULLs first means the NULL row is the newest, in both builds.
    ordering = [{"column": "updated_at", "direction": "desc", "nulls": "first"},
                {"column": "ingest_seq", "direction": "desc"}]
    plan = plan_module.make_plan(spark_spec(tmp_path, source, ordering=ordering), DAYS, factory)
    assert plan.status == "ready", plan.problems


def test_a_source_file_rewritten_after_the_approval_is_refused_before_any_write(tmp_path, spark, factory, url_env):
    folder = tmp_path / "raw"
    spec = spark_spec(tmp_path, write_parquet_source(folder))
    plan = plan_module.make_plan(spec, DAYS, factory)
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    victim = next((folder / "order_date=2024-01-02").glob("*.parquet"))
    data = pq.read_table(victim)
    pq.write_table(data.slice(1), victim)
    with pytest.raises(ApprovalError, match="rewritten.*plan again"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-p")
    assert not (tmp_path / "orders_daily").exists()


def test_a_stage_file_changed_after_the_plan_is_refused_by_approval(tmp_path, spark, factory, url_env):
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "raw"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    stage = tmp_path / "staging" / "stage_a" / "order_date=2024-01-02"
    victim = next(stage.glob("*.parquet"))
    pq.write_table(pq.read_table(victim).slice(1), victim)
    with factory() as conn, pytest.raises(ApprovalError, match=r"no longer has the planned fingerprint in "
                                                               r"partition\(s\) 2024-01-02; plan again"):
        review(conn, factory, spec, plan.plan_id)


def test_a_transform_spark_cannot_prove_deterministic_is_refused(tmp_path, spark, factory, url_env):
    from backfill_assets.core.errors import TransformError
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "raw"), transform_sql=(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, "
        "CAST(rand() AS STRING) AS note FROM source"))
    with pytest.raises(TransformError, match="rand"):
        plan_module.make_plan(spec, DAYS, factory)


def test_an_accepted_transform_is_built_in_spark(tmp_path, spark, factory, url_env):
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "raw"), transform_sql=(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount * 2 AS amount, "
        "upper(status) AS status, note FROM source"))
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems


def test_spec_shapes_name_the_engine(tmp_path):
    base = spark_mapping(tmp_path, {"format": "parquet", "location": str(tmp_path)})
    with pytest.raises(SpecError, match="engine spark writes a Parquet folder or a table of its catalog: target.format "
                                        "is parquet or spark_table, not postgres"):
        spec_from_mapping({**base, "target": {"table": "public.orders_daily"}})
    with pytest.raises(SpecError, match="records_can_move needs a Parquet folder target on engine spark"):
        spec_from_mapping({**base, "records_can_move": True, "target": {"format": "spark_table", "table": "t"}})
    with pytest.raises(SpecError, match=r"not jdbc \(a JDBC source is read by `engine: \{type: spark\}`\)"):
        spec_from_mapping({**base, "engine": {"type": "postgres"}, "source": {
            "format": "jdbc", "table": "public.t", "url_env": "X"}, "target": {"table": "public.orders_daily"}})
    with pytest.raises(SpecError, match="NAME of an environment variable"):
        spec_from_mapping({**base, "source": {"format": "jdbc", "table": "public.t",
                                              "url_env": "jdbc:postgresql://h/db?password=x"}})
    with pytest.raises(SpecError, match="settings of `type: spark`"):
        spec_from_mapping({**base, "engine": {"type": "duckdb", "master": "local[2]"}})
    from backfill_assets.core.spec import load_spec
    assert load_spec(REPO / "deploy/examples/orders_spark.yaml").engine.type == "spark"


def test_a_jdbc_failure_never_shows_the_password(tmp_path, spark, factory, url_env, db_url, monkeypatch):
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url + f"&password={CANARY}")
        spec = spark_spec(tmp_path, {"format": "jdbc", "table": "public.no_such_table", "url_env": JDBC_ENV})
        with pytest.raises(SpecError) as err:
            plan_module.make_plan(spec, DAYS, factory)
    assert CANARY not in str(err.value) and JDBC_ENV in str(err.value)
    monkeypatch.setenv(JDBC_ENV, f"jdbc:postgresql://127.0.0.1:1/none?user=u&password={CANARY}")
    with pytest.raises(SpecError) as err:
        plan_module.make_plan(spec, DAYS, factory)
    assert CANARY not in str(err.value)


def test_an_unscaled_numeric_over_jdbc_is_refused_naming_the_column(tmp_path, spark, factory, url_env, conn, db_url,
                                                                   monkeypatch):
    conn.execute("CREATE TABLE public.raw_n (order_date date, order_id bigint, customer_id bigint, "
                 "updated_at timestamp, ingest_seq bigint, amount numeric, status text, note text)")
    conn.commit()
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        spec = spark_spec(tmp_path, {"format": "jdbc", "table": "public.raw_n", "url_env": JDBC_ENV})
        with pytest.raises(SpecError, match=r"no exact form over JDBC.*declare numeric\(p,s\)") as err:
            plan_module.make_plan(spec, DAYS, factory)
    assert "amount (numeric)" in str(err.value) and "updated_at" not in str(err.value)


@pytest.mark.slow
def test_a_timestamp_without_time_zone_over_jdbc_is_read_exactly_in_any_jvm_time_zone(tmp_path, spark, factory,
                                                                                     url_env, conn, db_url,
                                                                                     monkeypatch):
    """The same instants, stored once as timestamptz and once as their UTC wall-clock time in a
    timestamp without time zone, give the same stages: planned in this process's JVM from both,
    and from the second again by a process whose JVM runs in Kolkata (a driver reading the
    wall-clock time in its own zone would give two different instants)."""
    load_postgres_source(conn)
    conn.execute("CREATE TABLE public.orders_ntz AS SELECT order_date, order_id, customer_id, "
                 "updated_at AT TIME ZONE 'UTC' AS updated_at, ingest_seq, amount, status, note FROM public.orders_raw")
    conn.commit()
    assert conn.execute("SELECT data_type FROM information_schema.columns WHERE table_name = 'orders_ntz' "
                        "AND column_name = 'updated_at'").fetchone()[0] == "timestamp without time zone"
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        reference = plan_module.make_plan(spark_spec(
            tmp_path / "tz", {"format": "jdbc", "table": "public.orders_raw", "url_env": JDBC_ENV}), DAYS, factory)
        assert reference.status == "ready", reference.problems
        here = plan_module.make_plan(spark_spec(
            tmp_path / "here", {"format": "jdbc", "table": "public.orders_ntz", "url_env": JDBC_ENV},
            name="ntz_here"), DAYS, factory)
        env = {**os.environ, URL_ENV: db_url.reveal(), JDBC_ENV: url}
        found = {"here": {e.partition: e.stage_a.as_dict() for e in here.document.partitions}}
        for zone in ("Asia/Kolkata",):
            folder = tmp_path / zone.replace("/", "_")
            spec_file = tmp_path / f"{folder.name}.yaml"
            spec_file.write_text(yaml.safe_dump(spark_mapping(
                folder, {"format": "jdbc", "table": "public.orders_ntz", "url_env": JDBC_ENV},
                name=f"ntz_{folder.name.lower()}",
                engine={"type": "spark", "master": "local[1]", "staging": str(folder / "staging"),
                        "conf": {"spark.ui.enabled": "false"}})), encoding="utf-8")
            planned = subprocess.run(
                [sys.executable, "-m", "backfill_assets.cli", "plan", "--spec", str(spec_file),
                 "--partitions", "2024-01-01..2024-01-03", "--json"],
                cwd=REPO, env={**env, "JAVA_TOOL_OPTIONS": f"{env.get('JAVA_TOOL_OPTIONS', '')} -Duser.timezone={zone}"},
                capture_output=True,
                text=True, timeout=300)
            assert planned.returncode == 0, planned.stderr[-2000:]
            assert f"-Duser.timezone={zone}" in planned.stderr  # the JVM took the zone
            found[zone] = {p["partition"]: p["stage_a"] for p in json.loads(planned.stdout)["partitions"]}
    expected = {e.partition: e.stage_a.as_dict() for e in reference.document.partitions}
    assert found["here"] == found["Asia/Kolkata"] == expected


@pytest.mark.slow
def test_the_cli_flow_over_jdbc_converges_and_a_later_source_change_does_not_move_the_plan(
        tmp_path, spark, factory, url_env, conn, db_url, monkeypatch, capfd):
    """plan, approve, apply, apply again, status and diff from the command line, in this
    process (its Spark session: a process start of its own per command proves nothing here and
    cost a driver JVM each); the JDBC URL appears in no output, the JVM's included (capfd)."""
    load_postgres_source(conn)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(spark_mapping(
        tmp_path, {"format": "jdbc", "table": "public.orders_raw", "url_env": JDBC_ENV},
        engine={"type": "spark", "master": "local[1]", "staging": str(tmp_path / "staging"),
                "conf": {"spark.ui.enabled": "false"}})), encoding="utf-8")
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        outputs: list[str] = []

        def cli(*args: str) -> tuple[int, str]:
            code = main([*args, "--spec", str(spec_file)])
            out, err = capfd.readouterr()
            outputs.append(out + err)
            return code, out

        code, planned = cli("plan", "--partitions", "2024-01-01..2024-01-03", "--json")
        assert code == 0, outputs[-1][-2000:]
        plan_id = json.loads(planned)["plan_id"]
        # The source moves on after the plan: the plan reads its own copy.
        conn.execute("UPDATE public.orders_raw SET status = status || '!'")
        conn.commit()
        assert cli("approve", "--plan", plan_id, "--yes", "--by", "tester")[0] == 0, outputs[-1][-2000:]
        assert cli("apply", "--plan", plan_id)[0] == 0, outputs[-1][-2000:]
        code, again = cli("apply", "--plan", plan_id, "--json")
        assert code == 0 and [p["status"] for p in json.loads(again)["partitions"]] == ["skipped-already-verified"] * 3
        code, status = cli("status")
        assert code == 0 and "verified" in status
        code, diff = cli("diff", "--plan", plan_id)
        assert code == 0 and "the approved stage (A) against the target" in diff, outputs[-1][-2000:]
        assert all(url not in out for out in outputs)
        spec = spec_from_mapping(yaml.safe_load(spec_file.read_text()))
        shutil.rmtree(tmp_path / "staging" / "snapshots")  # the copy is gone: approval cannot trust the plan
        with factory() as c, pytest.raises(ApprovalError, match="copy's file .* is gone.*plan again"):
            review(c, factory, spec, plan_id)


@pytest.mark.parametrize("ordering", [
    [{"column": "updated_at", "direction": "asc", "nulls": "first"}, {"column": "ingest_seq", "direction": "asc"}],
    [{"column": "status", "direction": "asc", "nulls": "last"}, {"column": "ingest_seq", "direction": "desc"}],
])
def test_both_builds_agree_whatever_the_directions(tmp_path, spark, factory, url_env, ordering):
    """Ascending numbers and times are turned newest-first for stage B's single aggregate; an
    ascending text column takes the joins. Either way stage B equals stage A's window."""
    source = write_parquet_source(tmp_path / "raw", _with(
        (dt.date(2024, 1, 3), 503, 1, None, 1, decimal.Decimal("1.00"), None, None),
        (dt.date(2024, 1, 3), 503, 1, T, 2, decimal.Decimal("2.00"), "b", None)))
    plan = plan_module.make_plan(spark_spec(tmp_path, source, ordering=ordering), DAYS, factory)
    assert plan.status == "ready", plan.problems


def test_a_transform_that_moves_rows_out_of_the_partitions_is_refused(tmp_path, spark, factory, url_env):
    spec = spark_spec(tmp_path, write_parquet_source(tmp_path / "raw"), transform_sql=(
        "SELECT date_add(order_date, 1) AS order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
        "status, note FROM source"))
    with pytest.raises(SourceDataError, match=r"outside the declared partitions.*partition 2024-01-04"):
        plan_module.make_plan(spec, DAYS, factory)


def test_the_source_sensor_watches_a_jdbc_source_by_its_change_column(tmp_path, spark, factory, url_env, conn,
                                                                      db_url, monkeypatch):
    """As on PostgreSQL: a write that moves the change column, an insert and a delete are found
    by each partition's row count and newest change value (now from the database, at the pin
    from the copy), each requested once; without a change column the sensor says why it cannot
    watch."""
    from backfill_assets.core.build import open_build_engine
    load_postgres_source(conn)
    with jdbc_url(db_url.reveal()) as url:
        monkeypatch.setenv(JDBC_ENV, url)
        source = {"format": "jdbc", "table": "public.orders_raw", "url_env": JDBC_ENV}
        spec = spark_spec(tmp_path, {**source, "change_column": "updated_at"})
        assert plan_module.make_plan(spec, DAYS, factory).status == "ready"

        def tick(state, watched=spec):
            with factory() as c, open_build_engine(c, factory, watched) as engine:
                return engine.source_moves(state, None)

        assert tick(None).changed == {}
        conn.execute("UPDATE public.orders_raw SET updated_at = '2024-02-01 00:00:00+00', note = 'late' "
                     "WHERE order_id = (SELECT min(order_id) FROM public.orders_raw WHERE order_date = '2024-01-02')")
        conn.commit()
        first = tick(None)
        assert list(first.changed) == ["2024-01-02"]
        assert tick(first.state).changed == {}  # requested once
        conn.execute("DELETE FROM public.orders_raw WHERE order_id = (SELECT max(order_id) FROM public.orders_raw "
                     "WHERE order_date = '2024-01-03')")
        conn.commit()
        assert list(tick(first.state).changed) == ["2024-01-03"]
        unwatched = tick(None, spark_spec(tmp_path / "u", source, name="orders_unwatched"))
        assert unwatched.changed == {} and "declare one" in unwatched.notes[0]
