"""The Spark driver's peak memory by step, at a partition of N rows and of 10 x N rows, on a
real standalone cluster on 127.0.0.1 (a master and two one-core workers started from the
pyspark wheel, as the tests start them): does anything the driver holds grow with the partition?

Each size runs as a driver process of its own (plan, approve, apply of one partition of a
Parquet folder into a new Parquet folder target); the driver is that Python process and the
JVM it starts (the executors run in the workers' JVMs). Each step's peak resident set of
both is read from ``/proc/<pid>/status`` (VmHWM), reset between steps (``clear_refs``).

    .venv/bin/python benchmarks/spark_memory.py --rows 200000

prints one table (and ``--json`` the figures). The control store is the embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import spark_lake  # benchmarks/spark_lake.py: the bench's Spark spec

REPO = Path(__file__).resolve().parents[1]
DAY = dt.date(2024, 1, 1)
URL_ENV = "BENCH_SPARK_MEMORY_URL"


def write_source(folder: Path, rows: int) -> None:
    """One partition (d=2024-01-01) of ``rows`` rows, two versions of each key (newest-wins has
    work to do), a 40-character note per row."""
    rng = np.random.default_rng(7)
    keys = np.arange(rows, dtype=np.int64) // 2
    seq = np.arange(rows, dtype=np.int64)
    base = np.datetime64("2024-01-01T00:00:00", "us")
    data = pa.table({
        "k": keys, "updated_at": pa.array(base + rng.integers(0, 86_400_000_000, rows).astype("timedelta64[us]"),
                                          pa.timestamp("us", tz="UTC")),
        "seq": seq, "amount": pa.array(rng.integers(0, 10**7, rows)).cast(pa.decimal128(21, 2)).cast(pa.decimal128(12, 2)),
        "status": pa.array(np.where(seq % 3 == 0, "paid", "open")),
        "note": pa.array([f"note {i:034d}" for i in range(rows)]),
    })
    part = folder / f"d={DAY.isoformat()}"
    part.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, part / "part-0.parquet", row_group_size=1 << 20)


def spec(folder: Path, master: str, rows: int) -> dict[str, Any]:
    """The bench's Spark spec (benchmarks/spark_lake.py) on ``master``, one per size."""
    mapping = spark_lake.spec(folder, URL_ENV)
    conf = {"spark.cores.max": "2", "spark.executor.memory": "1g", "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4"}
    return {**mapping, "name": f"bench_spark_memory_{rows}", "engine": {**mapping["engine"], "master": master,
                                                                        "conf": conf}}


def _peak(pid: int) -> int:
    """VmHWM of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _reset(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _jvms() -> list[int]:
    """This process's child JVMs (the driver pyspark started)."""
    import psutil
    return [c.pid for c in psutil.Process().children(recursive=True) if "java" in c.name()]


def driver(mapping: dict[str, Any]) -> dict[str, Any]:
    """Plan, approve and apply in this process; each step's peaks (Python, the driver's JVM)."""
    from backfill_assets.core import plan as plan_module
    from backfill_assets.core.apply import apply_plan
    from backfill_assets.core.approve import approve_plan
    from backfill_assets.core.pg.db import connection_factory
    from backfill_assets.core.pg.embedded import spec_url
    from backfill_assets.core.spec import spec_from_mapping
    from backfill_assets.core.vocabulary import PartitionRequest
    spec = spec_from_mapping(mapping)
    factory = connection_factory(spec_url(spec), spec.limits)
    steps: dict[str, dict[str, int]] = {}

    def measured(name: str, step: Any) -> Any:
        pids = [os.getpid(), *_jvms()]
        for pid in pids:
            _reset(pid)
        out = step()
        jvms = _jvms()
        steps[name] = {"python": _peak(os.getpid()), "jvm": max((_peak(p) for p in jvms), default=0)}
        return out

    plan = measured("plan", lambda: plan_module.make_plan(spec, PartitionRequest(DAY.isoformat()), factory))
    assert plan.status == "ready", plan.problems

    def approve() -> None:
        with factory() as conn:
            approve_plan(conn, factory, spec, plan, "bench")
    measured("approve", approve)
    result = measured("apply", lambda: apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex))
    assert [p["status"] for p in result.partitions] == ["verified"], result.partitions
    return {"rows": plan.document.partitions[0].stage_a.row_count, "steps": steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="source rows of the smaller partition")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--driver", help=argparse.SUPPRESS)  # internal: run one size as the driver
    args = parser.parse_args()
    if args.driver:
        print(json.dumps(driver(json.loads(args.driver))))
        return 0
    sys.path.insert(0, str(REPO))
    from backfill_assets.core.pg import embedded
    from backfill_assets_tests.support.spark_cluster import standalone_cluster
    os.environ[URL_ENV] = embedded.database_url("bench_spark_memory").reveal()
    found = []
    with tempfile.TemporaryDirectory(prefix="spark_memory_") as tmp, standalone_cluster(Path(tmp) / "cluster") as master:
        for rows in (args.rows, 10 * args.rows):
            folder = Path(tmp) / f"rows{rows}"
            write_source(folder / "src", rows)
            done = subprocess.run([sys.executable, __file__, "--driver", json.dumps(spec(folder, master, rows))],
                                  capture_output=True, text=True, cwd=tmp,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"the driver of {rows} rows failed:\n{done.stderr[-4000:]}")
            found.append({"source_rows": rows, **json.loads(lines[-1])})
    if args.json:
        print(json.dumps(found))
        return 0
    mib = 2**20
    print("| source rows | stage A rows | step | driver Python peak | driver JVM peak | both |")
    print("|---:|---:|---|---:|---:|---:|")
    for f in found:
        for step, peaks in f["steps"].items():
            print(f"| {f['source_rows']:,} | {f['rows']:,} | {step} | {peaks['python'] / mib:,.0f} MiB | "
                  f"{peaks['jvm'] / mib:,.0f} MiB | {(peaks['python'] + peaks['jvm']) / mib:,.0f} MiB |")
    small, large = found
    for step in small["steps"]:
        a, b = (sum(x["steps"][step].values()) for x in (small, large))
        print(f"{step}: 10x the rows, {b / a:.2f}x the driver's peak")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
