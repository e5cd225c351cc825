"""A DuckDB or Spark spec without database_url_env: nothing to set up. Its control store (plans,
approvals, the ledger, the runs' locks) is the embedded PostgreSQL the project starts under its
home, and plan, approve, apply and status run from the command line as with a database of the
user's."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest
import yaml

from backfill_assets.cli.commands import main
from backfill_assets.core.pg import embedded
from backfill_assets_tests.support.duck_lakes import delta_source, duck_spec
from backfill_assets_tests.support.spark_lakes import spark_mapping, write_parquet_source
from backfill_assets_tests.support.specs import engine_params

pytestmark = pytest.mark.postgres  # the embedded server, started by the command line under `home`


def _mapping(engine: str, tmp_path: Path) -> dict:
    if engine == "duckdb":
        data = duck_spec(tmp_path, delta_source(tmp_path)).model_dump(mode="json", exclude_none=True)
    else:
        data = spark_mapping(tmp_path, write_parquet_source(tmp_path / "orders_raw"))
    data.pop("database_url_env")
    return data


@pytest.mark.parametrize("engine", engine_params(["duckdb", "spark"]))
def test_a_lake_spec_without_a_database_runs_on_the_embedded_control_store(engine, tmp_path, home, request, capsys):
    if engine == "spark":
        request.getfixturevalue("spark")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_mapping(engine, tmp_path)), encoding="utf-8")
    assert main(["plan", "--spec", str(path), "--partitions", "2024-01-01..2024-01-03", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["status"] == "ready"
    assert main(["approve", "--spec", str(path), "--plan", plan["plan_id"], "--by", "tester", "--yes"]) == 0
    assert main(["apply", "--spec", str(path), "--plan", plan["plan_id"], "--json"]) == 0
    out = capsys.readouterr().out
    assert [p["status"] for p in json.loads(out[out.index("{"):])["partitions"]] == ["verified"] * 3
    assert main(["status", "--spec", str(path)]) == 0
    status = capsys.readouterr().out
    assert "verified" in status
    # --embedded names the embedded server, which this spec's control store already is: the same
    # plans and ledger (not the demo's database, where no run of this spec was recorded).
    assert main(["status", "--spec", str(path), "--embedded"]) == 0
    assert capsys.readouterr().out == status
    # Everything the runs recorded is in the embedded server's control database, under the home.
    assert (home / "pgdata").is_dir()
    with psycopg.connect(embedded.database_url(embedded.CONTROL_DATABASE).reveal()) as conn:
        found = conn.execute("SELECT count(*) FROM backfill_control.ledger WHERE status = 'verified'")
        assert found.fetchone()[0] >= 3
