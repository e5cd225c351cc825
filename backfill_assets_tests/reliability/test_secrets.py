"""Secret canaries: a password in the connection URL never appears in any output, log,
event, stored row or exception, through every command and Dagster runs, failing ones too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlunsplit

import dagster as dg
import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from backfill_assets.core.errors import ConnectionConfigError
from backfill_assets.core.pg.db import DatabaseUrl, connect
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.names import PLAN_TAG
from backfill_assets.dagster_layer.resources import PostgresResource
from backfill_assets_tests.support.specs import CANARY, DEMO_SPEC, REPO, URL_ENV, make_spec

CONTROL_TABLES = ("snapshots", "stage_builds", "plans", "approvals", "ledger")


def with_password(url: str, password: str) -> str:
    """The same database, as a URL carrying ``password`` (the embedded server trusts its
    socket, so the password is sent and ignored: every command succeeds with the canary)."""
    info = conninfo_to_dict(url)
    host = info.get("host", "")
    netloc = f"{info.get('user', 'postgres')}:{quote(password)}@" + ("" if host.startswith("/") else host)
    query = f"host={quote(host)}" if host.startswith("/") else ""
    return urlunsplit(("postgresql", netloc, "/" + info["dbname"], query, ""))


def cli(spec_file: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "backfill_assets.cli", args[0], "--spec", str(spec_file), *args[1:]],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_canary_never_leaks_from_the_command_line(demo_db, db_url, tmp_path, request):
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({**DEMO_SPEC, "lock_timeout_ms": 200}), encoding="utf-8")
    env = {**os.environ, URL_ENV: with_password(db_url.reveal(), CANARY)}
    outputs: list[str] = []

    def run(*args: str, env: dict[str, str] = env) -> subprocess.CompletedProcess:
        done = cli(spec_file, env, *args)
        outputs.append(done.stdout + done.stderr)
        return done

    assert run("inspect").returncode == 0
    assert run("profile", "--json").returncode == 0
    planned = run("plan", "--partitions", "2024-01-01..2024-01-07", "--json")
    plan_id = json.loads(planned.stdout)["plan_id"]
    assert run("approve", "--plan", plan_id, "--by", "sec", "--yes").returncode == 0
    # A lock timeout: another session holds the target.
    with psycopg.connect(db_url.reveal()) as writer:
        writer.execute("UPDATE public.orders_daily SET note = note WHERE order_date = '2024-01-20'")
        assert run("apply", "--plan", plan_id).returncode == 8
        writer.rollback()
    assert run("apply", "--plan", plan_id).returncode == 0
    assert run("status", "--json").returncode == 0
    # Failing connections: an unreachable host and a refused password.
    unreachable = {**env, URL_ENV: f"postgresql://bfa:{CANARY}@127.0.0.1:9/db"}
    assert run("plan", "--partitions", "2024-01-01", env=unreachable).returncode == 3
    assert run("inspect", env={**env, URL_ENV: request.getfixturevalue("password_role")}).returncode == 3
    assert len(outputs) == 9 and all(o for o in outputs)
    assert sum(o.count(CANARY) for o in outputs) == 0
    for table in CONTROL_TABLES:
        query = sql.SQL("SELECT count(*) FROM {} AS r WHERE r::text LIKE %s").format(
            sql.Identifier("backfill_control", table))
        assert demo_db.execute(query, ("%" + CANARY + "%",)).fetchone()[0] == 0, table


def test_the_canary_never_leaks_from_dagster_runs_and_their_logs(demo_db, db_url, tmp_path):
    secret_url = with_password(db_url.reveal(), CANARY)
    good = {"pg_orders_daily": PostgresResource(database_url=secret_url, variable="SECRET_URL")}
    bad = {"pg_orders_daily": PostgresResource(database_url=f"postgresql://u:{CANARY}@127.0.0.1:9/db", variable="SECRET_URL")}
    spec = make_spec()
    stages = [dg.AssetKey(["orders_daily", n]) for n in ("snapshot", "stage_a", "stage_b")]
    tags = {"dagster/asset_partition_range_start": "2024-01-01", "dagster/asset_partition_range_end": "2024-01-07"}
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        ok = dg.materialize(spec_assets(spec), selection=stages, instance=instance, resources=good, tags=tags)
        failed_target = dg.materialize(spec_assets(spec), selection=[dg.AssetKey(["orders_daily", "target"])],
                                       instance=instance, resources=good, tags={**tags, PLAN_TAG: "0" * 64},
                                       raise_on_error=False)
        unreachable = dg.materialize(spec_assets(spec), selection=stages, instance=instance, resources=bad,
                                     tags=tags, raise_on_error=False)
        assert ok.success and not failed_target.success and not unreachable.success
        events = [instance.all_logs(r.run_id) for r in (ok, failed_target, unreachable)]
        text = json.dumps([[str(e) for e in run_events] for run_events in events])
        assert "cannot connect to the database in $SECRET_URL" in text
        assert text.count(CANARY) == 0
    files = [p for p in (tmp_path / "dagster").rglob("*") if p.is_file()]
    assert files and not any(CANARY.encode() in p.read_bytes() for p in files)


def test_connection_errors_and_reprs_hold_no_password():
    url = DatabaseUrl(f"postgresql://bfa:{CANARY}@127.0.0.1:9/db", source="$X")
    assert CANARY not in repr(url) and CANARY not in str(url)
    with pytest.raises(ConnectionConfigError) as err:
        connect(url, DEFAULT_LIMITS)
    assert CANARY not in str(err.value) and err.value.__cause__ is None and err.value.__context__ is None
    for malformed in (f"postgresql://bfa:{CANARY}@host:notaport/db", f"//postgres:{CANARY}@/user",
                      f"host=h password={CANARY} nonsense"):
        with pytest.raises(ConnectionConfigError) as err:
            connect(DatabaseUrl(malformed, source="$X"), DEFAULT_LIMITS)
        assert "malformed" in str(err.value) or "cannot connect" in str(err.value)
        assert CANARY not in str(err.value) and err.value.__context__ is None
