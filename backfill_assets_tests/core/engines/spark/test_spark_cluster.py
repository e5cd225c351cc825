"""The whole flow on a real Spark cluster on 127.0.0.1 (a standalone master and two one-core
workers started from the pyspark wheel) and through a Spark Connect server on it: the same
content hashes as the DuckDB engine for the same rows, the target verified, a rerun writing
nothing. Each flow runs in a driver process of its own."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import COLUMNS, duck_spec, newest, source_table
from backfill_assets_tests.support.spark_cluster import connect_server, executors_launched, run_flow, standalone_cluster
from backfill_assets_tests.support.spark_lakes import spark_mapping, target_rows, write_parquet_source

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module", name="cluster")
def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("cluster")
    with standalone_cluster(workdir) as master, connect_server(master, workdir) as connect:
        yield {"master": master, "connect": connect, "workdir": workdir}


@pytest.mark.parametrize("via", ["master", "connect"])
def test_the_flow_on_a_cluster_gives_the_hashes_of_the_other_engines(cluster, via, tmp_path: Path, factory,
                                                                     url_env):
    source = write_parquet_source(tmp_path / "orders_raw")
    mapping = spark_mapping(tmp_path, source, name=f"orders_daily_{via}",
                            control_schema=f"backfill_control_{via}")
    found = run_flow(cluster[via], tmp_path, mapping)
    assert found["status"] == "ready", found["problems"]
    assert found["applied"] == ["verified"] * 3
    assert found["again"] == ["skipped-already-verified"] * 3
    # The same rows planned by the DuckDB engine, in this process: the same content hashes.
    (tmp_path / "duck").mkdir()
    duck = plan_module.make_plan(duck_spec(tmp_path / "duck", source), PartitionRequest("2024-01-01..2024-01-03"),
                                 factory)
    assert found["hashes"] == {p.partition: p.stage_a.content_hash for p in duck.document.partitions}
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert target_rows(tmp_path / "orders_daily", day) == newest(rows, day)
    # The work ran on the workers' executors, not in a local driver.
    assert executors_launched(cluster["workdir"] / "worker1.log") + executors_launched(cluster["workdir"] / "worker2.log")
    if via == "master":
        assert found["master"] == cluster["master"]
