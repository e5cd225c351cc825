"""The command line: output shapes, exit codes, and no credential in any output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from backfill_assets.cli import commands as cli
from backfill_assets.cli import crash_hook
from backfill_assets.cli.commands import main
from backfill_assets.core.errors import (
    ApprovalError,
    DeterminismError,
    PlanReferenceError,
    SpecError,
    StageDifference,
    VerificationError,
)
from backfill_assets.core.pg import embedded
from backfill_assets.core.store.plans import find_plan
from backfill_assets_tests.support.cli_runs import run, write_spec
from backfill_assets_tests.support.duck_lakes import delta_source, duck_spec
from backfill_assets_tests.support.specs import CANARY, REPO, URL_ENV, make_spec


def test_plan_json_is_one_object_with_the_documented_keys(demo_db, url_env, tmp_path, capsys):
    code, out, err = run(capsys, "plan", "--spec", str(write_spec(tmp_path)),
                         "--partitions", "2024-01-01..2024-01-07", "--json")
    assert code == 0, err
    plan = json.loads(out)  # exactly one JSON document on stdout
    assert {"plan_id", "target", "snapshot", "transform_version", "partitions"} <= plan.keys()
    assert {"id", "fingerprint"} <= plan["snapshot"].keys()
    first = plan["partitions"][0]
    assert first["partition"] == "2024-01-01" and first["match"] is True
    for side in ("stage_a", "stage_b"):
        assert set(first[side]) == {"row_count", "null_key_count", "duplicate_key_count", "total", "content_hash"}
    assert err == ""  # --json is quiet on stderr too


def test_plan_text_shows_fingerprints_and_progress(demo_db, url_env, tmp_path, capsys):
    code, out, err = run(capsys, "plan", "--spec", str(write_spec(tmp_path)), "--partitions", "2024-01-01,2024-01-05")
    assert code == 0
    assert "status:            ready" in out and "2024-01-05" in out and "content hash" in out
    assert "stage a: 2/2" in err and "snapshot:" in err


JITTER_FN = ("CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
             "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$")
JITTER_SQL = ("SELECT order_date, order_id, customer_id + jitter() AS customer_id, "
              "updated_at, ingest_seq, amount, status, note FROM source")
# Trusted wrongly: it passes the transform guard, and building twice catches it.
TRUST_JITTER = [{"name": "public.jitter", "reason": "a test of a wrong trust"}]


def test_refused_plan_prints_the_plan_then_exits_5_as_a_determinism_error(demo_db, url_env, tmp_path, capsys):
    demo_db.execute(JITTER_FN)
    spec = write_spec(tmp_path, records_can_move=False, transform_sql=JITTER_SQL, trusted_functions=TRUST_JITTER)
    code, out, err = run(capsys, "plan", "--spec", str(spec), "--partitions", "2024-01-01", "--json")
    plan = json.loads(out)  # still exactly one JSON object on stdout
    assert code == 5 and plan["status"] == "refused"
    assert err.startswith(f"error: plan {plan['plan_id'][:16]} is refused: partition 2024-01-01: stages A and B differ")
    assert "Nothing was written" in err and len(err.strip().splitlines()) == 1


def test_a_refused_plan_raises_determinism_error_with_the_partitions_and_readings_that_differ(
        demo_db, url_env, tmp_path, capsys):
    demo_db.execute(JITTER_FN)
    spec = write_spec(tmp_path, records_can_move=False, transform_sql=JITTER_SQL, trusted_functions=TRUST_JITTER)
    args = cli.build_parser().parse_args(["plan", "--spec", str(spec), "--partitions", "2024-01-01", "--json"])
    with pytest.raises(DeterminismError) as raised:
        cli.cmd_plan(args, cli.Output(json_mode=True, quiet=True))
    plan = json.loads(capsys.readouterr().out)
    a, b = plan["partitions"][0]["stage_a"], plan["partitions"][0]["stage_b"]
    assert raised.value.plan_id == plan["plan_id"] and raised.value.problems == tuple(plan["problems"])
    # customer_id + a random number: same rows and total, other content.
    assert raised.value.differences == (
        StageDifference("2024-01-01", {"content_hash": (a["content_hash"], b["content_hash"])}),
    )


@pytest.mark.parametrize("error, code", [
    (PlanReferenceError("abc", 8), 2),
    (SpecError("bad"), 2),
    (DeterminismError("ab" * 32, ["partition x: stages A and B differ on content_hash"]), 5),
    (ApprovalError("not approved", plan_id="ab" * 32), 6),
    (VerificationError("2024-01-01", "verify", 1, 2), 7),
])
def test_main_takes_the_exit_code_from_the_error_class(error, code, capsys, monkeypatch):
    def fails(args, out):
        raise error

    monkeypatch.setattr(cli, "cmd_status", fails)
    assert main(["status", "--spec", "unused.yaml"]) == code
    assert capsys.readouterr().err == f"error: {error}\n"


def test_a_malformed_plan_id_is_a_bad_argument_and_an_unknown_one_an_approval_error(
        demo_db, url_env, tmp_path, capsys):
    spec = str(write_spec(tmp_path))
    code, out, _ = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01", "--json")
    plan_id = json.loads(out)["plan_id"]
    assert code == 0
    for command in (["approve", "--by", "x", "--yes"], ["apply"]):
        for bad in ("abc", "not-a-plan-id", plan_id + "0"):
            code, _, err = run(capsys, *command, "--spec", spec, "--plan", bad)
            assert code == 2 and "--plan must be a plan id (at least 8 hex digits of it)" in err, (command, bad)
        code, _, err = run(capsys, *command, "--spec", spec, "--plan", "0123456789abcdef")
        assert code == 6 and "there is no plan 0123456789abcdef" in err
    with pytest.raises(ApprovalError) as raised:
        find_plan(demo_db, make_spec(name="other"), plan_id)
    assert raised.value.plan_id == plan_id and "belongs to spec orders_daily" in str(raised.value)


def test_the_crash_hook_is_imported_only_when_its_variable_is_set(demo_db, url_env, tmp_path):
    assert cli.TEST_PAUSE_ENV == crash_hook.PAUSE_ENV
    probe = ("import sys\nfrom backfill_assets.cli.commands import main\n"
             f"code = main(['apply', '--spec', {str(write_spec(tmp_path))!r}, '--plan', 'abc', '--quiet'])\n"
             "print(code, 'backfill_assets.cli.crash_hook' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in (crash_hook.PAUSE_ENV, crash_hook.PAUSE_FILE_ENV)}
    for extra, expected in (({}, "2 False"), ({crash_hook.PAUSE_ENV: "", crash_hook.PAUSE_FILE_ENV: "x"}, "2 False"),
                            ({crash_hook.PAUSE_ENV: "deleted:2024-01-01",
                              crash_hook.PAUSE_FILE_ENV: str(tmp_path / "never")}, "2 True")):
        done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**env, **extra},
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.stdout.strip() == expected, done.stderr


def test_ties_exit_4_with_an_example(demo_db, url_env, tmp_path, capsys):
    spec = write_spec(tmp_path, ordering=[{"column": "updated_at", "direction": "desc"}])
    code, out, err = run(capsys, "plan", "--spec", str(spec), "--partitions", "2024-01-01")
    assert code == 4 and "tie on every ordering column" in err and "order_id=" in err


def test_bad_spec_exits_2(tmp_path, capsys):
    code, _, err = run(capsys, "plan", "--spec", str(write_spec(tmp_path, surprise=1)), "--partitions", "2024-01-01")
    assert code == 2 and "surprise: Extra inputs are not permitted" in err


def test_missing_variable_exits_3_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(URL_ENV, raising=False)
    code, _, err = run(capsys, "inspect", "--spec", str(write_spec(tmp_path)))
    assert code == 3 and f"environment variable {URL_ENV} is not set" in err


def test_unreachable_host_exits_3_without_the_password(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(URL_ENV, f"postgresql://bfa:{CANARY}@127.0.0.1:9/nowhere")
    code, out, err = run(capsys, "plan", "--spec", str(write_spec(tmp_path)), "--partitions", "2024-01-01")
    assert code == 3 and "cannot connect" in err and f"${URL_ENV}" in err
    assert CANARY not in out + err and "postgresql://" not in out + err
    assert len(err.strip().splitlines()) == 1


def test_wrong_password_exits_3_without_the_password(password_role, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(URL_ENV, password_role)
    code, out, err = run(capsys, "inspect", "--spec", str(write_spec(tmp_path)))
    assert code == 3 and "password authentication failed" in err
    assert CANARY not in out + err


def test_inspect_reports_a_plannable_spec(demo_db, url_env, tmp_path, capsys):
    code, out, _ = run(capsys, "inspect", "--spec", str(write_spec(tmp_path)))
    assert code == 0 and "can be planned" in out and "orders_daily_order_key (order_id)" in out
    code, out, _ = run(capsys, "inspect", "--spec", str(write_spec(tmp_path)), "--json")
    assert code == 0 and json.loads(out)["problems"] == []


def test_inspect_of_a_broken_target_exits_2_with_the_ddl(demo_db, url_env, tmp_path, capsys):
    demo_db.execute("ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key")
    code, out, err = run(capsys, "inspect", "--spec", str(write_spec(tmp_path)))
    assert code == 2 and "ADD CONSTRAINT" in out and "ADD CONSTRAINT" in err


def test_profile_json_has_a_proposal(demo_db, url_env, tmp_path, capsys):
    code, out, _ = run(capsys, "profile", "--spec", str(write_spec(tmp_path)), "--json",
                       "--partitions", "2024-01-01..2024-01-03")
    proposal = json.loads(out)["proposal"]
    assert code == 0 and proposal["business_key"] == ["order_id"]
    assert [o["column"] for o in proposal["ordering"]] == ["updated_at", "ingest_seq"]


def test_inspect_and_profile_of_a_duckdb_spec_read_no_variable_and_start_no_postgresql(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"  # where the embedded server would keep its data if it were started
    monkeypatch.setenv(embedded.HOME_ENV, str(home))
    monkeypatch.delenv(URL_ENV, raising=False)  # named by the spec, and unset: reading it exits 3
    named = duck_spec(tmp_path, delta_source(tmp_path)).model_dump(mode="json", exclude_none=True)
    unnamed = {k: v for k, v in named.items() if k != "database_url_env"}  # the embedded control store
    for data in (named, unnamed):
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        code, out, err = run(capsys, "inspect", "--spec", str(path))
        assert code == 0 and "the spec matches the catalog; it can be planned" in out, err
        code, out, err = run(capsys, "profile", "--spec", str(path), "--json", "--partitions", "2024-01-01..2024-01-03")
        assert code == 0 and json.loads(out)["proposal"]["business_key"] == ["order_id"], err
    assert not home.exists()


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "exit codes:" in capsys.readouterr().out


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps it


def test_help_names_the_three_engines_and_their_targets_as_the_readme_does(capsys):
    text = _help(capsys)
    assert "one of three engines: PostgreSQL (a table of the database, into a PostgreSQL, Delta Lake or Apache " \
           "Iceberg target), DuckDB (a Delta, Iceberg or Parquet source, into a Delta or Iceberg target) and " \
           "Apache Spark (a Parquet folder, a table of Spark's catalog or a PostgreSQL table over JDBC, into a " \
           "Parquet folder or a catalog table)" in text
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    for engine in ("**PostgreSQL** (a table of the database, into a PostgreSQL, Delta Lake or Apache Iceberg target)",
                   "**DuckDB** (a Delta, Iceberg or Parquet source, into a Delta or Iceberg target)",
                   "**Apache Spark** (a Parquet folder, a table of Spark's catalog or a PostgreSQL table over JDBC, "
                   "into a Parquet folder or a catalog table)"):
        assert engine in readme and engine.replace("**", "") in text


def test_demo_help_says_it_runs_duckdb_ends_with_an_audit_and_writes_the_spark_source(capsys):
    text = _help(capsys, "demo")
    assert "the same backfill into a Delta Lake table, then the whole process on DuckDB from a Delta source" in text
    assert "an audit of the targets (a hand fix found, then put back), and hourly time windows over a " \
           "daylight-saving change." in text
    assert "writes the sample rows as the Parquet folder deploy/examples/orders_spark.yaml reads" in text


@pytest.mark.postgres  # the demo starts the embedded server of its own
def test_demo_runs_end_to_end_on_its_own_embedded_postgresql(tmp_path, server_dir):
    env = {**os.environ, "BACKFILL_ASSETS_HOME": str(server_dir / "home")}
    env.pop(URL_ENV, None)
    # In a folder of its own: the example specs' lake locations are relative to it, so the
    # demo's tables land there and never in the checkout.
    work = tmp_path / "work"
    work.mkdir()
    specs = ["--spec", str(REPO / "backfills/orders_daily.yaml"),
             "--lake-spec", str(REPO / "deploy/examples/orders_delta.yaml"),
             "--duckdb-spec", str(REPO / "deploy/examples/orders_duckdb.yaml"),
             "--spark-spec", str(REPO / "deploy/examples/orders_spark.yaml"),
             "--windows-spec", str(REPO / "deploy/examples/events_hourly.yaml"),
             "--inputs-spec", str(REPO / "deploy/examples/events_devices.yaml")]
    done = subprocess.run(
        [sys.executable, "-m", "backfill_assets.cli", "demo", *specs], cwd=work, env=env,
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "status:            ready" in done.stdout
    assert "added 2024-01-08: key (order_id=" in done.stdout
    assert "the same 8 partitions and stage hashes" in done.stdout
    assert "target hashes unchanged in 8 of 8 partition(s)" in done.stdout
    # It ends with the audit: the Delta target holds by its log files, a hand fix is named.
    audit = done.stdout[done.stdout.index("-- 11. audit"):]
    assert "of public.orders_daily: 8 hold, 0 drifted" in audit and "2024-01-01   holds           log files" in audit
    assert "7 hold, 1 drifted" in audit and "in amount" in audit and "put back: 8 of 8 partition(s) hold again" in audit
    # And last the hours of New York over the night its clocks fall back: 25 windows, the same plan again.
    windows = done.stdout[done.stdout.index("-- 12. time windows"):]
    assert "25 partition(s); windows 2024-11-03T01:00-0400 [2024-11-03T05:00:00+00:00, " in windows
    assert "plan e8d3360f1488a7e4 (the same plan), 25 of 25 window(s) already carry the approved fingerprint" in windows
    # Then those events with their device's name from a dimension: the plan names its pin, and a
    # renamed device gives another plan, which differs in the hours of that device's events.
    inputs = done.stdout[done.stdout.index("-- 13. several inputs"):]
    assert "input devices:     public.devices, read whole: 8 rows, hash " in inputs
    assert "device 3 renamed: plan " in inputs and "those holding device 3's events" in inputs
    assert (server_dir / "home" / "pgdata").is_dir()
    # status then says when each partition was last audited.
    status = subprocess.run([sys.executable, "-m", "backfill_assets.cli", "status", "--spec",
                             str(REPO / "backfills/orders_daily.yaml"), "--embedded"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(": holds") == 8, status.stdout
    # docs/cli.md's diff after `make demo`: its plan id is the demo's step 8 (the same on every machine).
    diff = subprocess.run([sys.executable, "-m", "backfill_assets.cli", "diff", "--spec",
                           str(REPO / "backfills/orders_daily.yaml"), "--embedded", "--plan", "980832d2",
                           "--partitions", "2024-01-01..2024-01-03"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.startswith("plan 980832d24204f127: the approved stage (A) against the target"), diff.stdout
    assert "  2024-01-01          0        0        0         24" in diff.stdout  # the hand fix was put back
    lake = work / ".backfill_assets" / "lake"
    assert {p.name for p in lake.iterdir()} >= {"orders_daily", "orders_raw", "orders_daily_duckdb",
                                                 "orders_raw_parquet"}


@pytest.mark.postgres  # the demo starts the embedded server under the home
def test_the_spark_example_plans_ready_from_the_parquet_folder_the_demo_writes(spark, home, tmp_path, monkeypatch,
                                                                               capsys):
    """docs/spark.md: after `make demo`, deploy/examples/orders_spark.yaml plans with --embedded as
    it is written (its source folder, .backfill_assets/lake/orders_raw_parquet, is the demo's)."""
    monkeypatch.chdir(tmp_path)  # where the example's relative locations lie, as the checkout for `make demo`
    monkeypatch.delenv("DATABASE_URL", raising=False)
    example = str(REPO / "deploy" / "examples" / "orders_spark.yaml")
    code, out, err = run(capsys, "demo", "--spec", str(REPO / "backfills" / "orders_daily.yaml"),
                         "--lake-spec", "none", "--duckdb-spec", "none", "--spark-spec", example, "--windows-spec", "none",
                         "--inputs-spec", "none")
    folder = tmp_path / ".backfill_assets" / "lake" / "orders_raw_parquet"
    assert code == 0, err
    assert f"the same 254 rows as a Parquet folder, the source of spec orders_daily_spark on Spark: {folder}" in out
    code, out, err = run(capsys, "plan", "--spec", example, "--embedded", "--partitions", "2024-01-01..2024-01-07",
                         "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["status"] == "ready"
    rows = {p["partition"]: p["stage_a"]["row_count"] for p in plan["partitions"]}
    assert rows == {"2024-01-01": 24, "2024-01-02": 24, "2024-01-03": 24, "2024-01-04": 25, "2024-01-05": 0,
                    "2024-01-06": 24, "2024-01-07": 24}


def test_a_demo_spark_spec_without_a_parquet_source_exits_2_before_the_demo_starts(capsys):
    # Refused before the demo starts the embedded server (this test runs where none may start).
    code, out, err = run(capsys, "demo", "--lake-spec", "none", "--duckdb-spec", "none",
                         "--spark-spec", str(REPO / "deploy" / "examples" / "orders_duckdb.yaml"))
    assert code == 2 and out == ""
    assert err.startswith("error: --spark-spec ") and "its source is not a Parquet folder" in err


def test_approve_apply_and_status_from_the_command_line(demo_db, url_env, tmp_path, capsys, monkeypatch):
    spec = str(write_spec(tmp_path))
    code, out, _ = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01..2024-01-07", "--json")
    plan_id = json.loads(out)["plan_id"]
    code, out, err = run(capsys, "apply", "--spec", spec, "--plan", plan_id)
    assert code == 6 and "has not been approved" in err
    # No terminal and no --yes: the approval is refused after showing the plan.
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    code, out, err = run(capsys, "approve", "--spec", spec, "--plan", plan_id[:12], "--by", "alice")
    assert code == 6 and "pass --yes" in err
    assert "Approving will REPLACE 8 partition(s) of public.orders_daily" in out and "2024-01-08" in out
    code, out, _ = run(capsys, "approve", "--spec", spec, "--plan", plan_id[:12], "--by", "alice", "--yes", "--json")
    assert code == 0 and json.loads(out)["approved_by"] == "alice"
    code, out, _ = run(capsys, "apply", "--spec", spec, "--plan", plan_id, "--json")
    applied = json.loads(out)
    assert code == 0 and [p["status"] for p in applied["partitions"]] == ["verified"] * 8
    code, out, _ = run(capsys, "status", "--spec", spec)
    assert code == 0 and out.count("verified") == 8 and applied["run_id"][:12] in out
    code, out, _ = run(capsys, "status", "--spec", spec, "--json")
    rows = json.loads(out)["partitions"]
    assert [r["partition"] for r in rows][-1] == "2024-01-08" and rows[0]["last_verified_hash"]


def test_status_before_any_run(demo_db, url_env, tmp_path, capsys):
    code, out, _ = run(capsys, "status", "--spec", str(write_spec(tmp_path)))
    assert code == 0 and "no runs recorded yet" in out


def test_approve_asks_on_a_terminal_and_records_only_a_yes(demo_db, url_env, tmp_path, capsys):
    import pty

    spec = str(write_spec(tmp_path))
    code, out, _ = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01", "--json")
    plan_id = json.loads(out)["plan_id"]
    for answer, expected_code in (("no", 6), ("yes", 0)):
        leader, follower = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "backfill_assets.cli", "approve", "--spec", spec, "--plan", plan_id, "--by", "carol"],
            stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=os.environ.copy(),
        )
        os.close(follower)
        os.write(leader, (answer + "\n").encode())
        out, err = proc.communicate(timeout=120)
        os.close(leader)
        assert proc.returncode == expected_code, err
    approvals = demo_db.execute("SELECT approved_by FROM backfill_control.approvals").fetchall()
    assert approvals == [("carol",)]


def test_status_shows_what_each_open_approval_still_covers_and_why_not(demo_db, url_env, factory, tmp_path, capsys):
    from backfill_assets.core.apply import apply_plan
    from backfill_assets_tests.support.specs import make_spec

    spec = str(write_spec(tmp_path))
    code, out, _ = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01..2024-01-07", "--json")
    plan_id = json.loads(out)["plan_id"]
    code, out, _ = run(capsys, "approve", "--spec", spec, "--plan", plan_id, "--by", "alice", "--yes")
    assert code == 0 and "The target now (the approval records this" in out
    apply_plan(make_spec(), plan_id, factory, run_id="first-day", only=["2024-01-01"])
    demo_db.execute("UPDATE public.orders_daily SET note = 'hand fix' WHERE order_date = '2024-01-06'")
    code, out, _ = run(capsys, "status", "--spec", spec)
    assert code == 0 and f"approval 1 of plan {plan_id[:16]} by alice" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("    2024-")}
    assert lines["2024-01-01"].split()[1] == "done" and "run first-day of this approval" in lines["2024-01-01"]
    assert lines["2024-01-02"].split()[1] == "covered" and "as it was when approved" in lines["2024-01-02"]
    assert "NOT covered" in lines["2024-01-06"] and "changed outside backfill_assets" in lines["2024-01-06"]
    code, out, _ = run(capsys, "status", "--spec", spec, "--json")
    (approval,) = json.loads(out)["open_approvals"]
    states = {p["partition"]: (p["covered"], p["state"]) for p in approval["partitions"]}
    assert approval["approval_id"] == 1 and approval["problem"] is None
    assert states["2024-01-01"] == (True, "applied") and states["2024-01-02"] == (True, "unchanged")
    assert states["2024-01-06"] == (False, "changed")
    # apply says the same, and writes nothing.
    code, _, err = run(capsys, "apply", "--spec", spec, "--plan", plan_id)
    assert code == 6 and "no longer covers partition(s) 2024-01-06" in err
    # A stage changed since the plan: the approval covers nothing, and status says why.
    demo_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'x' WHERE order_date = '2024-01-03'")
    code, out, _ = run(capsys, "status", "--spec", spec)
    assert code == 0 and "covers nothing: stage backfill_control.orders_daily__stage_a no longer has" in out


def test_approve_renders_the_core_review_and_checks_the_data_once(demo_db, url_env, tmp_path, capsys, monkeypatch):
    """One approval flow: the core's review runs every check once; the CLI renders what it
    returns (the plan, the target now, what will be replaced) and confirms it."""
    from backfill_assets.core.engines.postgres import review as approve_module

    spec = str(write_spec(tmp_path))
    code, out, _ = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01..2024-01-07", "--json")
    plan_id = json.loads(out)["plan_id"]
    calls = []
    real = approve_module.check_data_unchanged
    monkeypatch.setattr(approve_module, "check_data_unchanged", lambda *a, **k: calls.append(1) or real(*a, **k))
    code, out, err = run(capsys, "approve", "--spec", spec, "--plan", plan_id, "--by", "alice", "--yes")
    assert code == 0, err
    assert len(calls) == 1
    assert out.index(f"plan {plan_id}") < out.index("The target now") < out.index("Approving will REPLACE")
    assert f"approved plan {plan_id} as approval 1 by alice" in out


def test_status_shows_an_expired_approval_as_expired_and_apply_of_it_exits_6(
        demo_db, url_env, factory, tmp_path, capsys):
    import datetime as dt

    from backfill_assets.core.apply import apply_plan
    from backfill_assets.core.approve import approve_plan
    from backfill_assets.core.context import utc_now

    spec_file = str(write_spec(tmp_path))
    spec = make_spec()
    code, out, _ = run(capsys, "plan", "--spec", spec_file, "--partitions", "2024-01-01..2024-01-07", "--json")
    old_plan = json.loads(out)["plan_id"]
    given = utc_now() - dt.timedelta(days=8)  # approval 1, given (by the injected clock) 8 days ago
    approve_plan(demo_db, factory, spec, find_plan(demo_db, spec, old_plan), "alice", clock=lambda: given)
    apply_plan(spec, old_plan, factory, run_id="in-time", only=["2024-01-01"], clock=lambda: given)
    code, out, _ = run(capsys, "plan", "--spec", spec_file, "--partitions", "2024-01-06", "--json")
    new_plan = json.loads(out)["plan_id"]
    code, out, _ = run(capsys, "approve", "--spec", spec_file, "--plan", new_plan, "--by", "bob", "--yes")
    assert code == 0 and new_plan != old_plan
    code, out, _ = run(capsys, "status", "--spec", spec_file)
    assert code == 0
    opened, expired = out.split("expired approvals (")
    assert f"approval 2 of plan {new_plan[:16]} by bob" in opened and "approval 1 " not in opened
    assert any(line.startswith("  approval 2 ") and ", expires at " in line for line in opened.splitlines())
    expires = (given + spec.approval_expires_after).astimezone(dt.timezone.utc).isoformat(timespec="seconds")
    assert expired.startswith("older than approval_expires_after; apply refuses them: review the plan and approve "
                              "the plan again):")
    assert f"approval 1 of plan {old_plan[:16]} by alice at " in expired and f": expired at {expires}" in expired
    assert "its runs verified 1 of 8 partition(s): 2024-01-01" in expired
    code, out, _ = run(capsys, "status", "--spec", spec_file, "--json")
    shown = json.loads(out)
    assert [(a["approval_id"], a["state"]) for a in shown["open_approvals"]] == [(2, "open")]
    (old,) = shown["expired_approvals"]
    assert (old["approval_id"], old["state"], old["verified"]) == (1, "expired", ["2024-01-01"])
    assert old["problem"].startswith(f"expired at {expires} (approval_expires_after: 7d)")
    assert {p["state"] for p in old["partitions"]} == {"expired"}
    code, out, err = run(capsys, "apply", "--spec", spec_file, "--plan", old_plan)
    assert code == 6 and out == ""
    assert f"\nerror: approval 1 of plan {old_plan[:16]} (by alice at " in err  # after the run's progress line
    assert f"expired at {expires} (approval_expires_after: 7d). Nothing was written." in err
    assert "Its runs verified 1 of its partition(s) (2024-01-01)" in err and "approve the plan again" in err
