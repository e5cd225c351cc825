"""Figure 15: many small partitions into a lake target, per partition.

A daily source of ``--rows-per-day`` rows (about a tenth of them restated: older versions of
keys), as a Hive-partitioned Delta table; engine duckdb, a Delta or Iceberg target. The
whole flow in process, for the first 73 days and then for all 365 (each from a new target
and control schema), timed step by step: plan, approve and apply into a new target; then a
second plan of the same rows (another transform version), approved against the full target
and applied, finding every partition already holding them (nothing written). The slope between the two
sizes is a step's cost per partition; a step whose cost per partition grows with the table
shows as a slope that grows with it. The same rows through the PostgreSQL engine (source and
target tables in the embedded server) give the reference the DuckDB flow is held to.

    .venv/bin/python benchmarks/lake_many.py [--target delta|iceberg] [--rows-per-day 900]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import DatabaseUrl, connection_factory
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import Spec, spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest

DAY0 = dt.date(2024, 1, 1)
SIZES = (73, 365)
SCHEMA = pa.schema([("d", pa.date32()), ("k", pa.int64()), ("seq", pa.int64()),
                    ("amount", pa.decimal128(12, 2)), ("note", pa.string())])
COLUMNS = SCHEMA.names


def source(days: int, per_day: int) -> pa.Table:
    """``per_day`` rows a day: keys 0..n of the day, one in ten written twice (the later seq wins)."""
    import duckdb
    query = (
        "SELECT DATE '2024-01-01' + CAST(i // $per AS INTEGER) AS d, CAST(i % $per * 10 // 11 AS BIGINT) AS k, "
        "CAST(i AS BIGINT) AS seq, CAST((i % 997) / 7.0 AS DECIMAL(12,2)) AS amount, "
        "'flight ' || CAST(i AS VARCHAR) AS note FROM range($rows) AS t(i)"
    )
    with duckdb.connect() as con:
        return con.sql(query, params={"per": per_day, "rows": days * per_day}).to_arrow_table().cast(SCHEMA)


def lake_spec(folder: Path, target: str, url_env: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": "many", "database_url_env": url_env,
        "engine": {"type": "duckdb", "database": str(folder / "stages.duckdb")},
        "source": {"format": "delta", "location": str(folder / "src")},
        "partition_key": "d", "business_key": ["k"], "ordering": [{"column": "seq", "direction": "desc"}],
        "columns": COLUMNS, "total": "amount", "transform_version": "v1",
    }
    if target == "delta":
        out["target"] = {"format": "delta", "location": str(folder / "tgt")}
    else:
        out["target"] = {"format": "iceberg", "table": "bench.many",
                         "catalog": {"type": "sql", "warehouse": str(folder / "warehouse")}}
    return out


def pg_spec(url_env: str) -> dict[str, Any]:
    return {
        "name": "many_pg", "database_url_env": url_env,
        "source": {"table": "many.src"}, "target": {"table": "many.tgt"},
        "partition_key": "d", "business_key": ["k"], "ordering": [{"column": "seq", "direction": "desc"}],
        "columns": COLUMNS, "total": "amount", "transform_version": "v1",
    }


def load_pg(conn: psycopg.Connection, data: pa.Table) -> None:
    conn.execute(b"DROP SCHEMA IF EXISTS many CASCADE")
    conn.execute(b"CREATE SCHEMA many")
    conn.execute(b"CREATE TABLE many.src (d date, k bigint, seq bigint, amount numeric(12,2), note text)")
    conn.execute(b"CREATE INDEX ON many.src (d)")
    conn.execute(b"CREATE TABLE many.tgt (d date NOT NULL, k bigint NOT NULL, seq bigint, amount numeric(12,2), "
                 b"note text, UNIQUE (d, k))")
    with conn.cursor() as cur, cur.copy(b"COPY many.src (d, k, seq, amount, note) FROM STDIN") as copy:
        for row in zip(*(data.column(c).to_pylist() for c in COLUMNS)):
            copy.write_row(row)


def flow(specs: tuple[Spec, Spec], factory: Any, days: int) -> dict[str, float]:
    """Over the first ``days`` days: plan, approve and apply into a new target; then the
    same rows again under another transform version (a new plan), approved against the full
    target and applied (every partition already holds them: nothing is written). Seconds per step."""
    request = PartitionRequest(f"{DAY0.isoformat()}..{(DAY0 + dt.timedelta(days=days - 1)).isoformat()}")
    out: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        start = time.perf_counter()
        value = fn()
        out[name] = time.perf_counter() - start
        return value

    def approve(spec: Spec, plan: Any) -> None:
        with factory() as conn:
            approve_plan(conn, factory, spec, plan, "bench")

    first, again = specs
    plan = timed("plan", lambda: make_plan(first, request, factory))
    assert plan.status == "ready", plan.problems
    timed("approve", lambda: approve(first, plan))
    result = timed("apply", lambda: apply_plan(first, plan.plan_id, factory, run_id=uuid.uuid4().hex))
    assert {p["status"] for p in result.partitions} == {"verified"}
    plan = timed("plan again (v2)", lambda: make_plan(again, request, factory))
    timed("approve against the full target", lambda: approve(again, plan))
    result = timed("apply (nothing to write)", lambda: apply_plan(again, plan.plan_id, factory, run_id=uuid.uuid4().hex))
    assert {p["status"] for p in result.partitions} == {"skipped-already-verified"}, result.partitions
    return out


def fresh(conn: psycopg.Connection, folder: Path, target: str) -> None:
    """No target and no control schema: each size starts as a first backfill."""
    conn.execute(b"DROP SCHEMA IF EXISTS backfill_control CASCADE")
    conn.execute(b"DROP TABLE IF EXISTS public.iceberg_tables, public.iceberg_namespace_properties")  # pyiceberg's catalog
    if target == "pg":
        conn.execute(b"TRUNCATE many.tgt")
    for name in ("tgt", "warehouse", "stages.duckdb"):
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=["delta", "iceberg"], default="delta")
    parser.add_argument("--rows-per-day", type=int, default=900)
    args = parser.parse_args()
    from deltalake import write_deltalake
    url = embedded.database_url("lake_many")
    os.environ["BENCH_LAKE_MANY_URL"] = url.reveal()
    data = source(max(SIZES), args.rows_per_day)
    results: dict[str, dict[int, dict[str, float]]] = {args.target: {}, "postgres": {}}
    with tempfile.TemporaryDirectory(prefix="bench-lake-many-") as tmp, \
            psycopg.connect(url.reveal(), autocommit=True) as conn:
        folder = Path(tmp)
        write_deltalake(str(folder / "src"), data, partition_by=["d"])
        load_pg(conn, data)
        lake_doc, pg_doc = lake_spec(folder, args.target, "BENCH_LAKE_MANY_URL"), pg_spec("BENCH_LAKE_MANY_URL")
        lake = (spec_from_mapping(lake_doc), spec_from_mapping({**lake_doc, "transform_version": "v2"}))
        pg = (spec_from_mapping(pg_doc), spec_from_mapping({**pg_doc, "transform_version": "v2"}))
        factory = connection_factory(DatabaseUrl(url.reveal(), "the bench database"), lake[0].limits)
        for days in SIZES:
            for name, spec in ((args.target, lake), ("postgres", pg)):
                fresh(conn, folder, "pg" if name == "postgres" else args.target)
                conn.execute(sql.SQL("CHECKPOINT"))
                results[name][days] = flow(spec, factory, days)
    small, big = SIZES
    print(f"{data.num_rows} source rows over {max(SIZES)} days ({args.rows_per_day} a day); "
          f"engine duckdb into {args.target} vs the postgres engine, same rows")
    print(f"| step | {args.target} {small} days | {args.target} {big} days | ms per partition | "
          f"postgres {small} days | postgres {big} days | ms per partition |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for step in results[args.target][small]:
        cells = []
        for name in (args.target, "postgres"):
            a, b = results[name][small][step], results[name][big][step]
            cells += [f"{a:.2f} s", f"{b:.2f} s", f"{(b - a) / (big - small) * 1000:.1f}"]
        print(f"| {step} | " + " | ".join(cells) + " |")
    whole = {name: sum(results[name][big].values()) for name in results}
    print(f"whole flow over {big} days: {args.target} {whole[args.target]:.2f} s, postgres {whole['postgres']:.2f} s "
          f"= {whole[args.target] / whole['postgres']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
