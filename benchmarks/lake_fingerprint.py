"""The fingerprint of a lake partition: arrow_readings and read_stage_partition at 1M rows.

    .venv/bin/python benchmarks/lake_fingerprint.py [--rows 1000000] [--pgdata DIR] [--repeat 3]

Builds one partition of ``--rows`` rows in Arrow (bigint key, text, numeric(12,2), float8 with
1% of the values at 1e17 where PostgreSQL's float text needs the exact printer, date,
timestamptz), deterministic and without numpy, then times:

- ``arrow_readings`` on the rows in key order, on the same rows shuffled (every slice is a
  take from the chunked columns), and on the rows read back from a Delta table;
- the same rows loaded into the embedded PostgreSQL (database ``lake_bench``, or the server
  whose data directory ``--pgdata`` names): ``fingerprint_partition`` on the server for
  reference, then ``read_stage_partition`` and ``arrow_readings`` of what it read, whose
  readings must equal the server's.

Each time is the best of ``--repeat`` runs, in rows per second; memory is that of the first
run: the most Arrow memory the step held at once (its own allocations, through a proxy pool;
what the step returns counts) and the process's peak RSS above what it held before the step
(VmHWM, reset through /proc/self/clear_refs). Timings on a shared 2-core machine are noisy;
compare figures taken in one run.
"""

from __future__ import annotations

import argparse
import gc
import io
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from psycopg import sql

from backfill_assets.core.fingerprint.arrow import arrow_readings
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.partition import fingerprint_partition
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.fingerprint.stage_arrow import read_stage_partition
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.pg.db import connect, repeatable_read
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, TableRef

REL = TableRef("public", "lake_bench")
DDL = sql.SQL(
    "CREATE TABLE public.lake_bench (p int, k bigint, name text, amount numeric(12,2), "
    "score float8, day date, seen timestamptz)"
)
DROP = sql.SQL("DROP TABLE IF EXISTS public.lake_bench")
LOAD = sql.SQL("COPY public.lake_bench (p, k, name, amount, score, day, seen) FROM STDIN (FORMAT csv)")
KEY = ["k"]
TOTAL = "amount"


def build_partition(rows: int) -> pa.Table:
    """One partition (p = 1) in key order, from arithmetic on the key: full 17-digit floats,
    1% of them near 1e17, unicode in every seventh name, some NULLs."""
    k = pa.array(range(rows), pa.int64())
    kf = pc.cast(k, pa.float64())
    special = pc.equal(pc.bit_wise_and(k, 127), 0)
    name = pc.binary_join_element_wise(
        "name-", pc.cast(pc.multiply(k, 2654435761), pa.string()),
        pc.if_else(pc.equal(pc.bit_wise_and(k, 7), 0), ' é,"x" 🧾', ""), "",
    )
    name = pc.if_else(pc.equal(pc.bit_wise_and(k, 1023), 5), pa.scalar(None, pa.string()), name)
    cents = pc.cast(pc.subtract(pc.bit_wise_and(pc.multiply(k, 2654435761), (1 << 36) - 1), 1 << 35), pa.decimal128(38, 0))
    amount = pa.Array.from_buffers(pa.decimal128(12, 2), rows, cents.buffers(), null_count=0)  # unscaled: cents
    score = pc.multiply(pc.sin(kf), pc.if_else(pc.equal(pc.bit_wise_and(k, 99), 3), 1e17, 1e6))
    score = pc.if_else(special, pa.scalar(None, pa.float64()), score)
    day = pc.cast(pc.cast(pc.add(10957, pc.bit_wise_and(k, 8191)), pa.int32()), pa.date32())
    seen = pc.cast(pc.add(1577836800000000, pc.multiply(k, 1234567)), pa.timestamp("us", tz="UTC"))
    p = pa.array([1] * rows, pa.int32())
    return pa.table([p, k, name, amount, score, day, seen], names=["p", "k", "name", "amount", "score", "day", "seen"])


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


_POOL = pa.default_memory_pool()


def measure(label: str, rows: int, repeat: int, step: Callable[[], object]) -> object:
    """Best time of ``repeat`` runs. Memory of the first run: the most Arrow held at once for
    the step (a proxy pool counts its allocations) and the process's peak RSS above its RSS
    before (later runs reuse the allocator's freed pages, so their RSS says little)."""
    best, result, arrow_peak, rss_peak = float("inf"), None, 0, 0
    for run in range(repeat):
        result = None
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        before = _rss_kb("VmRSS")
        proxy = pa.proxy_memory_pool(_POOL)
        pa.set_memory_pool(proxy)
        start = time.perf_counter()
        try:
            result = step()
        finally:
            elapsed = time.perf_counter() - start
            pa.set_memory_pool(_POOL)
        best = min(best, elapsed)
        if run == 0:
            arrow_peak, rss_peak = proxy.max_memory(), (_rss_kb("VmHWM") - before) * 1024
    print(f"{label:<52} {best:6.2f} s {rows / best:>10,.0f} rows/s   Arrow peak {arrow_peak / 2**20:5.0f} MiB"
          f"   RSS peak +{rss_peak / 2**20:5.0f} MiB", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pgdata", type=Path, help="data directory of the embedded server (default: the project's)")
    args = parser.parse_args()
    n = args.rows

    t0 = time.perf_counter()
    table = build_partition(n)
    order = list(range(n))
    random.Random(1).shuffle(order)
    shuffled = table.take(pa.array(order, pa.int64()))
    del order
    print(f"{n:,} rows, Arrow data {table.nbytes / 2**20:.0f} MiB, built in {time.perf_counter() - t0:.1f} s; "
          f"RSS {_rss_kb('VmRSS') / 1024:.0f} MiB", flush=True)

    admin = embedded.server_url(args.pgdata.resolve() if args.pgdata else None)
    with psycopg.connect(admin, autocommit=True) as c:
        if not c.execute(sql.SQL("SELECT 1 FROM pg_database WHERE datname = 'lake_bench'")).fetchone():
            c.execute(sql.SQL("CREATE DATABASE lake_bench"))
    url = embedded.DatabaseUrl(psycopg.conninfo.make_conninfo(admin, dbname="lake_bench"), source="the embedded PostgreSQL")
    with connect(url, DEFAULT_LIMITS) as conn:
        conn.execute(DROP)
        conn.execute(DDL)
        data = io.BytesIO()
        pcsv.write_csv(table, data, pcsv.WriteOptions(include_header=False))
        with conn.cursor() as cur, cur.copy(LOAD) as copy:
            copy.write(data.getbuffer())
        del data
        conn.execute(sql.SQL("VACUUM ANALYZE public.lake_bench"))
        columns = table_columns(conn, REL)
        assert lake_schema(columns) == table.schema

        with tempfile.TemporaryDirectory() as tmp:
            from deltalake import DeltaTable, write_deltalake

            write_deltalake(tmp, table, partition_by=["p"])
            delta = measure("Delta read back (to_pyarrow_table, filter p = 1)", n, args.repeat,
                            lambda: DeltaTable(tmp).to_pyarrow_table(filters=[("p", "=", 1)]))
            assert isinstance(delta, pa.Table)

            sorted_fp = measure("arrow_readings, rows in key order", n, args.repeat,
                                lambda: arrow_readings(table, columns, KEY, TOTAL))
            shuffled_fp = measure("arrow_readings, rows shuffled", n, args.repeat,
                                  lambda: arrow_readings(shuffled, columns, KEY, TOTAL))
            delta_fp = measure("arrow_readings, rows read back from Delta", n, args.repeat,
                               lambda: arrow_readings(delta, columns, KEY, TOTAL))

        def server() -> Fingerprint:
            with repeatable_read(conn, read_only=True):
                return fingerprint_partition(conn, REL, columns, "p", KEY, TOTAL, 1, utf8=True)

        def read() -> pa.Table:
            with repeatable_read(conn, read_only=True):
                return read_stage_partition(conn, REL, columns, "p", 1, KEY)

        server_fp = measure("fingerprint_partition on PostgreSQL (reference)", n, args.repeat, server)
        stage = measure("read_stage_partition (CSV COPY -> pyarrow.csv)", n, args.repeat, read)
        assert isinstance(stage, pa.Table)
        stage_fp = measure("arrow_readings of the rows read", n, args.repeat,
                           lambda: arrow_readings(stage, columns, KEY, TOTAL))
        conn.execute(DROP)

    same = {sorted_fp, shuffled_fp, delta_fp, server_fp, stage_fp}
    print(f"readings: {server_fp}")
    print("all five readings equal" if len(same) == 1 else f"READINGS DIFFER: {same}")
    return 0 if len(same) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
