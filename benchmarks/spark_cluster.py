"""Figure 14 on a real standalone cluster next to ``local[2]``: the whole safe Spark backfill of
a Parquet folder into a new Parquet folder (N rows over 20 daily partitions) against the naive
way on the same session (one job: newest-wins by a window, a dynamic partition overwrite), in
alternated pairs; with apply alone against the naive job, and the driver's peak memory.

The cluster is the tests' (a master and two one-core workers on 127.0.0.1, from the pyspark
wheel), so both masters have two cores. Each master runs in a driver process of its own; its
session is started before either side (its start-up is nobody's). The control store is the
embedded PostgreSQL.

    .venv/bin/python benchmarks/spark_cluster.py [--rows 2000000] [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import spark_lake  # benchmarks/spark_lake.py: the bench's Spark spec and naive way

REPO = Path(__file__).resolve().parents[1]
URL_ENV = "BENCH_SPARK_CLUSTER_URL"
DAYS = 20


def write_source(folder: Path, rows: int) -> None:
    """``rows`` rows over 20 days, two versions of most keys, Hive-partitioned by ``d``."""
    rng = np.random.default_rng(11)
    seq = np.arange(rows, dtype=np.int64)
    day = (seq % DAYS).astype("timedelta64[D]") + np.datetime64("2024-01-01", "D")
    data = pa.table({
        "d": pa.array(day, pa.date32()), "k": seq // (2 * DAYS) * DAYS + seq % DAYS,
        "updated_at": pa.array(np.datetime64("2024-01-01T00:00:00", "us")
                               + rng.integers(0, 86_400_000_000, rows).astype("timedelta64[us]"),
                               pa.timestamp("us", tz="UTC")),
        "seq": seq, "amount": pa.array(rng.integers(0, 10**7, rows)).cast(pa.decimal128(21, 2)).cast(
            pa.decimal128(12, 2)),
        "status": pa.array(np.where(seq % 3 == 0, "paid", "open")),
        "note": pa.array([f"note {i:034d}" for i in range(rows)]),
    })
    pads.write_dataset(data, folder, format="parquet", partitioning=["d"], partitioning_flavor="hive",
                       existing_data_behavior="delete_matching")


def spec(folder: Path, master: str) -> dict[str, Any]:
    """The bench's Spark spec (benchmarks/spark_lake.py) on ``master``, one per master."""
    mapping = spark_lake.spec(folder, URL_ENV)
    name = "bench_cluster" if master.startswith("spark://") else "bench_local"
    return {**mapping, "name": name, "engine": {**mapping["engine"], "master": master}}


def driver(mapping: dict[str, Any], folder: Path, pairs_n: int) -> dict[str, Any]:
    """In this process: the pairs on the spec's master; the median pair's steps and the peaks."""
    import psutil
    from psycopg import sql

    sys.path.insert(0, str(REPO / "benchmarks"))
    import pairs
    from bench import safe_backfill

    from backfill_assets.core.engines.spark.session import start_session
    from backfill_assets.core.pg.db import connection_factory
    from backfill_assets.core.pg.embedded import spec_url
    from backfill_assets.core.spec import spec_from_mapping
    master = mapping["engine"]["master"]
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "8"}
    if master.startswith("spark://"):
        conf |= {"spark.cores.max": "2", "spark.executor.memory": "1g"}
    mapping["engine"]["conf"] = conf
    session = start_session(master, conf, "backfill_assets:bench")
    spec = spec_from_mapping(mapping)
    factory = connection_factory(spec_url(spec), spec.limits)

    def reset(*paths: Path, control: bool) -> None:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if control:
            with factory() as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(spec.control_schema)))

    def naive() -> float:
        reset(folder / "naive", control=False)
        return spark_lake.naive(session, folder)

    def ours() -> tuple[float, dict[str, float]]:
        reset(folder / "tgt", folder / "staging", control=True)
        seconds, steps, _ = safe_backfill(spec, factory)
        return seconds, steps

    paired = pairs.alternated(pairs_n, naive, ours)
    jvms = [c for c in psutil.Process().children(recursive=True) if "java" in c.name()]
    peak = {"python": _peak(os.getpid()), "jvm": max((_peak(p.pid) for p in jvms), default=0)}
    return {"master": master, "ours": paired.ours, "naive": paired.naive, "ratio": paired.ratio,
            "ratios": list(paired.ratios), "steps": paired.detail, "peak": peak}


def _peak(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--driver", help=argparse.SUPPRESS)  # internal: JSON [spec, folder]
    args = parser.parse_args()
    if args.driver:
        mapping, folder = json.loads(args.driver)
        print(json.dumps(driver(mapping, Path(folder), args.pairs)))
        return 0
    sys.path.insert(0, str(REPO))
    from backfill_assets.core.pg import embedded
    from backfill_assets_tests.support.spark_cluster import standalone_cluster
    os.environ[URL_ENV] = embedded.database_url("bench_spark_cluster").reveal()
    found = []
    with tempfile.TemporaryDirectory(prefix="spark_cluster_") as tmp, standalone_cluster(Path(tmp) / "cluster") as master:
        folder = Path(tmp) / "data"
        write_source(folder / "src", args.rows)
        for on in ("local[2]", master):
            done = subprocess.run([sys.executable, __file__, "--pairs", str(args.pairs), "--driver",
                                   json.dumps([spec(folder, on), str(folder)])],
                                  capture_output=True, text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(REPO)})
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"the driver on {on} failed:\n{done.stderr[-4000:]}")
            found.append(json.loads(lines[-1]))
    mib = 2**20
    print(f"Figure 14 on {args.rows:,} rows over {DAYS} partitions, median of {args.pairs} alternated pairs")
    print("| master | ours | naive | ratio (pairs) | apply | apply / naive | driver peak (Python + JVM) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for f in found:
        apply = next(v for k, v in f["steps"].items() if k.startswith("apply"))
        where = "standalone, 2 workers x 1 core" if f["master"].startswith("spark://") else f["master"]
        print(f"| {where} | {f['ours']:.2f} s | {f['naive']:.2f} s | {f['ratio']:.2f}x "
              f"({', '.join(f'{r:.2f}' for r in f['ratios'])}) | {apply:.2f} s | {apply / f['naive']:.2f}x | "
              f"{f['peak']['python'] / mib:,.0f} + {f['peak']['jvm'] / mib:,.0f} MiB |")
    for f in found:
        print(f"{f['master']}: " + "; ".join(f"{k} {v:.2f} s" for k, v in f["steps"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
