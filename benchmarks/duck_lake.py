"""Figure 13 of benchmarks/bench.py: the whole safe backfill on DuckDB, Delta to Delta, side by
side with the naive way and the raw read; and, run as its own process, one partition larger
than DuckDB's memory_limit (its peak RSS).

- ours: plan (pin the Delta source's version, check it, two builds in DuckDB, compare),
  approve and apply into a new Delta table, in process, as bench.safe_backfill runs it.
- naive: per partition, DuckDB's newest-wins read of the Delta source (DISTINCT ON over the
  table as a PyArrow dataset) written with the lake's own partition overwrite
  (``write_deltalake(mode="overwrite", predicate=...)``); no pin, no second build, no
  fingerprint, no verification.
- raw read: every row of those partitions read from the Delta source by DuckDB, the limit of
  any build that reads the source.

    .venv/bin/python benchmarks/duck_lake.py prepare --folder F --rows 1500000
    BENCH_DUCK_URL=<a PostgreSQL URL> .venv/bin/python benchmarks/duck_lake.py memory --folder F --memory-limit 256MB
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
from psycopg import sql

SCHEMA = pa.schema([
    ("d", pa.date32()), ("k", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC")), ("seq", pa.int64()),
    ("amount", pa.decimal128(12, 2)), ("status", pa.string()), ("note", pa.string()),
])
_EXPORT = sql.SQL("COPY (SELECT s.d, s.k, s.updated_at, s.seq, s.amount, s.status, s.note FROM bench.src AS s) "
                  "TO STDOUT (FORMAT csv)")
_NEWEST = ("SELECT DISTINCT ON (k) d, k, updated_at, seq, amount, status, note FROM src "
           "WHERE d = $day AND k IS NOT NULL ORDER BY k, updated_at DESC, seq DESC")
_RAW = "SELECT count(*), sum(length(note)) FROM src WHERE d = $day"
URL_ENV = "BENCH_DUCK_URL"  # the control store's URL, for the memory figure's process


ICEBERG_ENV = "BENCH_DUCK_ICEBERG"  # the SQLite catalog of an Iceberg source (set by this script)


def spec(folder: Path, url_env: str, memory_limit: str | None = None, source: str = "delta",
         target: str = "delta") -> dict[str, Any]:
    """The bench's spec on DuckDB: the Delta (or Iceberg) source in ``folder``, a new Delta (or
    Iceberg) target there."""
    engine: dict[str, Any] = {"type": "duckdb", "database": str(folder / "stages.duckdb")}
    if memory_limit is not None:
        engine["memory_limit"] = memory_limit
    read = ({"format": "delta", "location": str(folder / "src")} if source == "delta" else
            {"format": "iceberg", "table": "raw.src",
             "catalog": {"type": "sql", "uri_env": ICEBERG_ENV, "warehouse": str(folder / "src_wh")}})
    return {
        "name": "bench_duck", "database_url_env": url_env, "engine": engine,
        "source": read,
        "target": ({"format": "delta", "location": str(folder / "tgt")} if target == "delta" else
                   {"format": "iceberg", "table": "bench.tgt", "catalog": {"type": "sql", "warehouse": str(folder / "tgt_wh")}}),
        "partition_key": "d", "business_key": ["k"],
        "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
        "columns": ["d", "k", "updated_at", "seq", "amount", "status", "note"], "total": "amount",
        "transform_version": "bench-v1",
    }


def source_rows(conn: psycopg.Connection) -> pa.Table:
    """bench.src (as loaded by bench.load) in Arrow, as SCHEMA types it."""
    with conn.cursor() as cur, cur.copy(_EXPORT) as copy:
        return pcsv.read_csv(
            io.BytesIO(b"".join(bytes(chunk) for chunk in copy)),
            read_options=pcsv.ReadOptions(column_names=SCHEMA.names),
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(column_types=SCHEMA, null_values=[""], strings_can_be_null=True,
                                                quoted_strings_can_be_null=False),
        )


def export_source(conn: psycopg.Connection, folder: Path) -> int:
    """bench.src written to a Delta table partitioned by day. Rows."""
    from deltalake import write_deltalake
    data = source_rows(conn)
    write_deltalake(str(folder / "src"), data, mode="overwrite", partition_by=["d"])
    return data.num_rows


def naive(folder: Path, days: list) -> float:
    """The naive way into a new Delta table over ``days``. Seconds."""
    import duckdb
    from deltalake import DeltaTable, write_deltalake
    start = time.perf_counter()
    con = duckdb.connect()
    con.register("src", DeltaTable(str(folder / "src")).to_pyarrow_dataset())
    for day in days:
        data = con.sql(_NEWEST, params={"day": day}).to_arrow_table()
        write_deltalake(str(folder / "naive"), data, mode="overwrite", predicate=f"d = '{day.isoformat()}'",
                        partition_by=["d"])
    con.close()
    return time.perf_counter() - start


def raw_read(folder: Path, days: list) -> tuple[float, int]:
    """Every row of ``days`` read from the Delta source by DuckDB. (seconds, rows)"""
    import duckdb
    from deltalake import DeltaTable
    start, rows = time.perf_counter(), 0
    con = duckdb.connect()
    con.register("src", DeltaTable(str(folder / "src")).to_pyarrow_dataset())
    for day in days:
        rows += con.execute(_RAW, {"day": day}).fetchall()[0][0]
    con.close()
    return time.perf_counter() - start, rows


def _big_partition(rows: int, note_bytes: int) -> pa.Table:
    """One day of ``rows`` rows, 1.25 versions per key, each with a ``note_bytes``-long note
    (generated by DuckDB)."""
    import duckdb
    query = (
        "SELECT DATE '2024-01-01' AS d, CAST(CASE WHEN i < $distinct THEN i ELSE hash(i) % $distinct END AS BIGINT) AS k, "
        "TIMESTAMPTZ '2024-01-01 00:00:00+00' + to_microseconds(CAST(hash(i, 1) % 86400000000 AS BIGINT)) AS updated_at, "
        "CAST(i AS BIGINT) AS seq, CAST(NULL AS DECIMAL(12,2)) AS amount, 'ok' AS status, "
        "repeat('n', $pad) || lpad(CAST(i AS VARCHAR), 8, '0') AS note FROM range($rows) AS t(i)"
    )
    with duckdb.connect() as con:
        data = con.sql(query, params={"distinct": int(rows * 0.8), "pad": note_bytes - 8, "rows": rows}).to_arrow_table()
    return data.cast(SCHEMA)


def prepare(folder: Path, rows: int, note_bytes: int, source: str = "delta") -> int:
    """Write the memory figure's one-partition Delta (or Iceberg) source into ``folder``. Its
    size in Arrow (bytes)."""
    data = _big_partition(rows, note_bytes)
    if source == "delta":
        from deltalake import write_deltalake
        write_deltalake(str(folder / "src"), data, partition_by=["d"])
        return data.nbytes
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.transforms import IdentityTransform
    (folder / "src_wh").mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("default", uri=_iceberg_catalog(folder), warehouse=f"file://{folder / 'src_wh'}")
    catalog.create_namespace("raw")
    table = catalog.create_table("raw.src", schema=SCHEMA)
    with table.update_spec() as update:
        update.add_field("d", IdentityTransform(), "d")
    table.append(data)
    return data.nbytes


def _iceberg_catalog(folder: Path) -> str:
    return f"sqlite:///{folder / 'cat.db'}"


def _peak_rss_mib(reset: bool = False) -> float:
    """This process's peak RSS (VmHWM: its own image's high-water mark; ru_maxrss would start at
    the peak of the process it was forked from, the benchmark). ``reset``: the mark is set back
    to the current RSS afterwards (Linux's clear_refs), so the next reading is the next step's."""
    found = None
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            found = int(line.split()[1]) / 1024
    if found is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if reset:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
    return found


def memory(url: str, folder: Path, memory_limit: str, source: str = "delta", target: str = "delta") -> dict[str, Any]:
    """Plan, approve and apply the one partition in ``folder`` on DuckDB with ``memory_limit``,
    in this process (which did nothing else before); its peak RSS."""
    from backfill_assets.core.apply import apply_plan
    from backfill_assets.core.approve import approve_plan
    from backfill_assets.core.pg.db import DatabaseUrl, connection_factory
    from backfill_assets.core.plan import make_plan
    from backfill_assets.core.spec import spec_from_mapping
    from backfill_assets.core.vocabulary import PartitionRequest
    before = _peak_rss_mib()
    os.environ[ICEBERG_ENV] = _iceberg_catalog(folder)
    duck = spec_from_mapping(spec(folder, URL_ENV, memory_limit, source, target))
    factory = connection_factory(DatabaseUrl(url, "the bench database"), duck.limits)
    start = time.perf_counter()
    steps: dict[str, float] = {}
    plan = make_plan(duck, PartitionRequest("2024-01-01"), factory)
    steps["plan"] = _peak_rss_mib(reset=True)
    with factory() as conn:
        approve_plan(conn, factory, duck, plan, "bench")
    steps["approve"] = _peak_rss_mib(reset=True)
    result = apply_plan(duck, plan.plan_id, factory, run_id=uuid.uuid4().hex)
    steps["apply"] = _peak_rss_mib(reset=True)
    return {"source": source, "target": target, "memory_limit": memory_limit, "status": plan.status, "rows": plan.document.partitions[0].stage_a.row_count,
            "applied": [p["status"] for p in result.partitions], "seconds": time.perf_counter() - start,
            "peak_rss_mib": max(steps.values()), "peak_rss_by_step_mib": steps, "rss_before_mib": before}


def main() -> int:
    parser = argparse.ArgumentParser(description="Figure 13b: one partition above DuckDB's memory_limit.")
    parser.add_argument("what", choices=["prepare", "memory"])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1_500_000)
    parser.add_argument("--note-bytes", type=int, default=200)
    parser.add_argument("--memory-limit", default="256MB")
    parser.add_argument("--source", choices=["delta", "iceberg"], default="delta")
    parser.add_argument("--target", choices=["delta", "iceberg"], default="delta")
    args = parser.parse_args()
    if args.what == "prepare":
        print(json.dumps({"source_rows": args.rows, "partition_mib": prepare(args.folder, args.rows, args.note_bytes, args.source) / 2**20}))
        return 0
    url = os.environ.get(URL_ENV)
    if not url:
        parser.error(f"set {URL_ENV} to the PostgreSQL URL of the control store")
    print(json.dumps(memory(url, args.folder, args.memory_limit, args.source, args.target)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
