"""The benchmark: ours against the raw read limit and the naive way, side by side in one run.

    .venv/bin/python benchmarks/bench.py [--rows 2000000] [--out BENCHMARKS.md]

It starts the embedded PostgreSQL (database ``bench``), generates a deterministic source of
``--rows`` rows over 20 daily partitions (about 20% duplicate keys differing by ordering
columns, ties on updated_at broken by seq, a few NULL keys, unicode and control characters),
measures, prints a table of ratios and writes it to BENCHMARKS.md. Timings on this kind of
machine are noisy (differences under ~30% are noise); every figure is a ratio of two
measurements taken in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import psycopg
from psycopg import sql

from backfill_assets.core import embedded
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan, find_plan
from backfill_assets.core.catalog import table_columns
from backfill_assets.core.db import connection_factory, repeatable_read
from backfill_assets.core.fingerprint import (
    business_key_order, content_hash, fingerprint_partition, sorts_disabled,
)
from backfill_assets.core.plan import make_plan
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.spec import PartitionRequest, TableRef, spec_from_mapping
from backfill_assets.core.sqlbuild import copy_canonical_stream, in_partition, partition_readings

DAYS = 20
COLUMNS = ["d", "k", "updated_at", "seq", "amount", "status", "note"]
SPEC = {
    "name": "bench", "database_url_env": "BENCH_URL",
    "source": {"table": "bench.src", "snapshot": "copy"}, "target": {"table": "bench.tgt"},
    "partition_key": "d", "business_key": ["k"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    "columns": COLUMNS, "total": "amount", "transform_version": "bench-v1",
    "partitions": {"type": "daily", "start": "2024-01-01", "end": "2025-01-01"},
}

_DDL = [
    "DROP SCHEMA IF EXISTS bench CASCADE",
    "DROP SCHEMA IF EXISTS backfill_control CASCADE",
    "CREATE SCHEMA bench",
    "CREATE TABLE bench.src (d date, k bigint, updated_at timestamptz NOT NULL, seq bigint NOT NULL, "
    "amount numeric(12,2), status text, note text)",
    "CREATE TABLE bench.tgt (d date NOT NULL, k bigint NOT NULL, updated_at timestamptz, seq bigint, "
    "amount numeric(12,2), status text, note text, UNIQUE (d, k))",
    "CREATE TABLE bench.tgt_naive (LIKE bench.tgt INCLUDING ALL)",
]
# Per day: `distinct` first versions, then later versions of keys (r * 7919) % distinct; one
# duplicate in ten keeps the original updated_at (a tie that seq breaks); a few NULL keys.
_GENERATE = sql.SQL(
    "INSERT INTO bench.src (d, k, updated_at, seq, amount, status, note) "
    "SELECT date '2024-01-01' + i, "
    "CASE WHEN r %% 49999 = 7 THEN NULL WHEN r < %(distinct)s THEN r ELSE (r * 7919) %% %(distinct)s END, "
    "timestamptz '2024-01-01 00:00+00' + make_interval(days => i, secs => "
    "CASE WHEN r < %(distinct)s THEN r ELSE (r * 7919) %% %(distinct)s END) "
    "+ CASE WHEN r >= %(distinct)s AND r %% 10 <> 0 THEN interval '1 hour' ELSE interval '0' END, "
    "i::bigint * %(per_day)s + r, ((r * 37) %% 100000) / 100.0, "
    "CASE WHEN r >= %(distinct)s THEN 'corrected' ELSE 'placed' END, "
    "'note ' || r || CASE r %% 7 WHEN 0 THEN E'\\t☕' WHEN 1 THEN E'\\nline' WHEN 2 THEN 'é' ELSE '' END "
    "FROM generate_series(0, %(days)s - 1) AS i, generate_series(0, %(per_day)s - 1) AS r"
)
_NAIVE = sql.SQL(
    "INSERT INTO bench.tgt_naive (d, k, updated_at, seq, amount, status, note) "
    "SELECT DISTINCT ON (s.d, s.k) s.d, s.k, s.updated_at, s.seq, s.amount, s.status, s.note "
    "FROM bench.src AS s WHERE s.d = %(day)s AND s.k IS NOT NULL ORDER BY s.d, s.k, s.updated_at DESC, s.seq DESC"
)
_RAW = sql.SQL(
    "COPY (SELECT t.d, t.k, t.updated_at, t.seq, t.amount, t.status, t.note FROM {stage} AS t "
    "WHERE t.d = %(day)s ORDER BY t.k) TO STDOUT (FORMAT binary)"
)
_MD5 = sql.SQL(
    "SELECT count(*), sum(('x' || substr(md5(t::text), 1, 16))::bit(64)::bigint) "
    "FROM {stage} AS t WHERE t.d = %(day)s"
)


def days() -> list:
    import datetime as dt
    return [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(DAYS)]


def load(conn: psycopg.Connection, rows: int, n_days: int = DAYS) -> None:
    for statement in _DDL:
        conn.execute(statement.encode())
    per_day = rows // n_days
    conn.execute(_GENERATE, {"distinct": int(per_day * 0.8), "per_day": per_day, "days": n_days})
    conn.execute(b"ANALYZE bench.src")


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def step_seconds(marks: list[tuple[float, ProgressEvent]], t_plan: float, t_approve: float,
                 total: float) -> dict[str, float]:
    """Seconds per step, from the progress events' times (seconds since the start) and
    fields: the builds run from the stages' first event (their ``done=0`` announcement) to
    their last partition."""
    built = [t for t, e in marks if e.step in ("stage a", "stage b")]
    first, last = built[0], built[-1]
    return {
        "inspect + snapshot (fingerprint source, copy, check)": first,
        "build A and B at once, each with its fingerprints": last - first,
        "compare and store the plan": t_plan - last,
        "approve (recheck the stage, read the target it is given against)": t_approve - t_plan,
        "apply (check the stage and the target, then per partition: target and stage under the lock, replace, verify twice)": total - t_approve,
    }


def safe_backfill(spec, factory) -> tuple[float, dict[str, float], str]:
    """Plan (snapshot, two builds, compare), approve, apply; seconds per step from progress."""
    marks: list[tuple[float, ProgressEvent]] = []
    start = time.perf_counter()

    def mark(event: ProgressEvent) -> None:
        marks.append((time.perf_counter() - start, event))

    request = PartitionRequest("2024-01-01..2024-01-20")
    plan = make_plan(spec, request, factory, progress=mark)
    t_plan = time.perf_counter() - start
    with factory() as conn:
        approve_plan(conn, factory, spec, find_plan(conn, spec, plan.plan_id), "bench")
    t_approve = time.perf_counter() - start
    apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, progress=mark)
    total = time.perf_counter() - start
    return total, step_seconds(marks, t_plan, t_approve, total), plan.plan_id


def naive_backfill(conn: psycopg.Connection) -> float:
    start = time.perf_counter()
    for day in days():
        with conn.transaction():
            conn.execute(b"DELETE FROM bench.tgt_naive WHERE d = %(day)s", {"day": day})
            conn.execute(_NAIVE, {"day": day})
    return time.perf_counter() - start


def fingerprint_all(factory, stage: TableRef) -> float:
    with factory() as conn:
        cols = [c for c in table_columns(conn, stage) if c.name in COLUMNS]
        cols = [next(c for c in cols if c.name == n) for n in COLUMNS]
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True):
            for day in days():
                # As plan, approve and apply read a stage: its unique index rules duplicates out
                # and gives the key order.
                fingerprint_partition(conn, stage, cols, "d", ["k"], "amount", day, key_unique=True, indexed=True)
        return time.perf_counter() - start


def raw_read_all(factory, stage: TableRef) -> float:
    with factory() as conn:
        start = time.perf_counter()
        # The same planner setting as ours (read the index, do not sort): the limit, not a plan choice.
        with repeatable_read(conn, read_only=True), sorts_disabled(conn), conn.cursor() as cur:
            for day in days():
                with cur.copy(_RAW.format(stage=sql.Identifier(stage.schema, stage.name)), {"day": day}) as copy:
                    for _ in copy:
                        pass
        return time.perf_counter() - start


def text_read_all(factory, stage: TableRef, *, hashed: bool) -> float:
    """The canonical stream alone (every column cast to text, in key order through the index),
    discarded or fed to SHA-256: the floor of any text-canonical fingerprint."""
    with factory() as conn:
        cols = [c for c in table_columns(conn, stage) if c.name in COLUMNS]
        cols = [next(c for c in cols if c.name == n) for n in COLUMNS]
        order = business_key_order(cols, ["k"])
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True):
            for day in days():
                if hashed:
                    content_hash(conn, stage, cols, "d", order, day, indexed=True)
                    continue
                query, params = copy_canonical_stream(stage, COLUMNS, in_partition("d"), order, {"partition": day})
                with sorts_disabled(conn), conn.cursor() as cur, cur.copy(query, params) as copy:
                    for _ in copy:
                        pass
        return time.perf_counter() - start


def readings_all(factory, stage: TableRef) -> float:
    """The readings query alone (count, NULL keys, total), the fingerprint's other pass."""
    with factory() as conn:
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True):
            for day in days():
                conn.execute(*partition_readings(stage, "d", ["k"], "amount", day, key_unique=True)).fetchone()
        return time.perf_counter() - start


_SORTED_READ = sql.SQL(
    "COPY (SELECT t.d::text, t.k::text, t.updated_at::text, t.seq::text, t.amount::text, t.status::text, "
    "t.note::text FROM bench.src AS t WHERE t.d = %(day)s ORDER BY t.note COLLATE \"C\", t.k) TO STDOUT (FORMAT binary)"
)


def two_backends(factory) -> tuple[float, float]:
    """How much two server processes gain over one on this machine: the same 20 sorted reads
    of the source, on one connection, then split over two at once."""
    def work(day_list) -> None:
        with factory() as conn, conn.cursor() as cur:
            for day in day_list:
                with cur.copy(_SORTED_READ, {"day": day}) as copy:
                    for _ in copy:
                        pass
    one, _ = timed(lambda: work(days()))
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(work, [days()[0::2], days()[1::2]]))
    return one, time.perf_counter() - start


def md5_all(factory, stage: TableRef) -> float:
    with factory() as conn:
        start = time.perf_counter()
        for day in days():
            conn.execute(_MD5.format(stage=sql.Identifier(stage.schema, stage.name)), {"day": day}).fetchone()
        return time.perf_counter() - start


def best(fn, n: int = 3) -> float:
    return min(fn() for _ in range(n))


_MEMORY_CHILD = """
import resource, sys, datetime as dt
from backfill_assets.core.db import connection_factory, DatabaseUrl, repeatable_read
from backfill_assets.core.catalog import table_columns
from backfill_assets.core.fingerprint import fingerprint_partition
from backfill_assets.core.spec import TableRef
url, day = sys.argv[1], dt.date.fromisoformat(sys.argv[2])
ref = TableRef("bench", "mem")
with connection_factory(DatabaseUrl(url, "bench"))() as conn, repeatable_read(conn, read_only=True):
    cols = table_columns(conn, ref)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fp = fingerprint_partition(conn, ref, cols, "d", ["k"], "amount", day)
print(fp.row_count, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(url: str, conn: psycopg.Connection) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh process fingerprinting 100k rows vs 2M rows in one partition."""
    conn.execute(b"DROP TABLE IF EXISTS bench.mem")
    conn.execute(b"CREATE TABLE bench.mem (d date, k bigint, amount numeric(12,2), note text)")
    conn.execute(b"INSERT INTO bench.mem SELECT date '2024-01-01', g, g % 1000, repeat('x', 60) FROM generate_series(1, 100000) g")
    conn.execute(b"INSERT INTO bench.mem SELECT date '2024-01-02', g, g % 1000, repeat('x', 60) FROM generate_series(1, 2000000) g")
    conn.execute(b"CREATE INDEX ON bench.mem (d, k)")
    conn.execute(b"ANALYZE bench.mem")
    peaks = []
    for day in ("2024-01-01", "2024-01-02"):
        out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, url, day], capture_output=True, text=True, check=True)
        rows, _, peak_kib = out.stdout.split()
        peaks.append(int(peak_kib) / 1024)
    return peaks[0], peaks[1]


def dagster_instance_url() -> str:
    """A fresh database for Dagster's own storage on the embedded server (as `make ui` and
    deploy/dagster.yaml use: dagster-postgres), so each Dagster figure starts empty."""
    admin = embedded.server_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(b"DROP DATABASE IF EXISTS bench_dagster")
        conn.execute(b"CREATE DATABASE bench_dagster")
    return embedded.database_url("bench_dagster").reveal()


def dagster_backfill(spec, url: str, last_day: str = "2024-01-20") -> float:
    """The same safe backfill through Dagster, in process, with the shipped instance storage
    (PostgreSQL through dagster-postgres): stages as one single-run backfill over the range,
    the approval gate job, then the target as a single-run backfill."""
    from backfill_assets.names import PLAN_TAG
    from backfill_assets.definitions import build_definitions
    from backfill_assets.resources import PostgresResource

    defs = build_definitions([spec])
    resources = {"pg_bench": PostgresResource(database_url=url, variable="BENCH_URL")}
    keys = [dg.AssetKey(["bench", n]) for n in ("snapshot", "stage_a", "stage_b")]
    tags = {"dagster/asset_partition_range_start": "2024-01-01", "dagster/asset_partition_range_end": last_day}
    assets = list(defs.assets)  # type: ignore[arg-type]
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
    storage = {"storage": {"postgres": {"postgres_url": dagster_instance_url()}}}
    with dg.instance_for_test(overrides=storage) as instance:  # an existing instance: not timed
        start = time.perf_counter()
        stages = dg.materialize(assets, selection=keys, instance=instance, resources=resources, tags=tags,
                                run_config=quiet)
        plan_id = next(e.metadata["plan_id"].value for e in stages.get_asset_check_evaluations()
                       if e.check_name == "stages_match")
        defs.resolve_job_def("approve_backfill").execute_in_process(
            run_config={**quiet, "ops": {"approve_plan_gate": {"config": {"plan_id": plan_id, "approved_by": "bench"}}}},
            resources=resources, instance=instance)
        dg.materialize(assets, selection=[dg.AssetKey(["bench", "target"])], instance=instance,
                       resources=resources, tags={**tags, PLAN_TAG: plan_id}, run_config=quiet)
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    url = embedded.database_url("bench")
    factory = connection_factory(url, application_name="backfill_assets:bench")
    spec = spec_from_mapping(SPEC)
    stage = TableRef("backfill_control", "bench__stage_a")
    rows: list[tuple[str, str, str, float, str, bool]] = []
    notes: list[str] = []

    def row(figure: str, ours: float, reference: float, unit: str, target: str, ratio: float, met: bool) -> None:
        rows.append((figure, f"{ours:.2f} {unit}", f"{reference:.2f} {unit}", ratio, target, met))
        print(f"{figure:<62} ours {ours:8.2f} {unit:<3} ref {reference:8.2f} {unit:<3} ratio {ratio:5.2f}  {target:<9} {'met' if met else 'NOT met'}", flush=True)

    with factory() as conn:
        t_load, _ = timed(lambda: load(conn, args.rows))
        print(f"generated {args.rows} source rows in {t_load:.1f} s", flush=True)
        naive = naive_backfill(conn)
        safe, steps, plan_id = safe_backfill(spec, factory)
        stage_rows = conn.execute(b"SELECT count(*) FROM backfill_control.bench__stage_a").fetchone()[0]
    raw = best(lambda: raw_read_all(factory, stage))
    ours_fp = best(lambda: fingerprint_all(factory, stage))
    md5 = best(lambda: md5_all(factory, stage))
    text_read = best(lambda: text_read_all(factory, stage, hashed=False))
    text_hashed = best(lambda: text_read_all(factory, stage, hashed=True))
    readings = best(lambda: readings_all(factory, stage))
    one, two = two_backends(factory)
    row(f"1. fingerprint {stage_rows} stage rows vs raw binary COPY read", ours_fp, raw, "s", "<= 1.25x", ours_fp / raw, ours_fp / raw <= 1.25)
    row("2. fingerprint vs in-database sum of md5 (data-diff style)", ours_fp, md5, "s", ">= 2x faster", md5 / ours_fp, md5 / ours_fp >= 2)
    row("3. whole safe backfill of 20 partitions vs naive DELETE+INSERT", safe, naive, "s", "<= 2.5x", safe / naive, safe / naive <= 2.5)
    fp_notes = [
        "Where the fingerprint's time goes (figure 1; each the best of 3):",
        f"   - raw binary COPY read in key order, bytes discarded (the reference): {raw:.2f} s",
        f"   - the same read with every column cast to text, discarded (floor of a text-canonical form): "
        f"{text_read:.2f} s = {text_read / raw:.2f}x",
        f"   - that stream fed to SHA-256 (the content hash alone): {text_hashed:.2f} s = {text_hashed / raw:.2f}x",
        f"   - the readings query alone (count, NULL keys, total): {readings:.2f} s",
        f"   - the whole fingerprint (readings, then the hash): {ours_fp:.2f} s = {ours_fp / raw:.2f}x",
        "",
        f"This machine's parallelism: 20 sorted reads of the source on one connection {one:.2f} s, "
        f"split over two at once {two:.2f} s ({one / two:.2f}x).",
        "",
        "Where the safe backfill's time goes (figure 3):",
    ]
    notes.extend(fp_notes)
    for name, seconds in steps.items():
        notes.append(f"   - {name}: {seconds:.2f} s")
    with factory() as conn:  # the state the CLI path started from: no stages, no snapshot, empty target
        conn.execute(b"DROP SCHEMA IF EXISTS backfill_control CASCADE")
        conn.execute(b"TRUNCATE bench.tgt")
    t_dagster = dagster_backfill(spec, url.reveal())
    row("4. the same backfill through Dagster (in process) vs the CLI path", t_dagster, safe, "s", "<= 1.2x", t_dagster / safe, t_dagster / safe <= 1.2)
    with factory() as conn:
        small, big = peak_memory(url.reveal(), conn)
    row("5. peak RSS fingerprinting 2M vs 100k rows in one partition", big, small, "MiB", "+32 MiB", big - small, big - small <= 32)
    if not args.skip_scaling:
        # Each size twice from a fresh load (a rerun would skip verified partitions), the
        # faster run kept: single runs here vary by up to ~20% (autovacuum, a noisy host).
        times: dict[int, float] = {}
        for n in (args.rows // 4, args.rows // 2, args.rows):
            runs = [safe] if n == args.rows else []
            while len(runs) < 2:
                with factory() as conn:
                    load(conn, n)
                runs.append(safe_backfill(spec, factory)[0])
            times[n] = min(runs)
        ratio = times[args.rows] / times[args.rows // 4]
        row(f"6. safe backfill scaling: {args.rows} vs {args.rows // 4} rows (4x)", times[args.rows], times[args.rows // 4],
            "s", "<= 4.4x", ratio, ratio <= 4.4)
        notes.append("   - scaling (best of 2 runs each): " + ", ".join(f"{n} rows {t:.1f} s" for n, t in sorted(times.items())))
    with factory() as conn:
        load(conn, 365 * 50, n_days=365)
    t_year = dagster_backfill(spec, url.reveal(), last_day="2024-12-30")
    with factory() as conn:
        verified = conn.execute(b"SELECT count(DISTINCT partition) FROM backfill_control.ledger "
                                b"WHERE status = 'verified'").fetchone()[0]
    rows.append(("4b. 365 daily partitions (50 rows each) in one single-run Dagster backfill",
                 f"{t_year:.2f} s", "-", float(verified), "completes", verified == 365))
    print(f"4b. 365 partitions through Dagster: {t_year:.1f} s, {verified} partitions verified", flush=True)
    write_report(Path(args.out), args, rows, notes)
    return 0


ANALYSIS = "## Reading the figures"


def write_report(path: Path, args, rows, notes) -> None:
    lines = [
        "# Benchmarks", "",
        "Produced by `make bench` (= `.venv/bin/python benchmarks/bench.py`), on "
        f"{platform.machine()} with {os.cpu_count()} cores, Python {platform.python_version()}, "
        "the embedded PostgreSQL 16 (pgserver). Every ratio compares two measurements taken in the "
        "same run; on this machine differences under ~30% are noise.", "",
        f"Source: {args.rows} rows over {DAYS} daily partitions, about 20% duplicate keys, ties "
        "broken by the tiebreak, a few NULL keys, unicode and control characters.", "",
        "| figure | ours | reference | ratio | target | met? |", "|---|---:|---:|---:|---|---|",
    ]
    for figure, ours, ref, ratio, target, met in rows:
        shown = f"{ratio:.0f} verified" if target == "completes" else f"{ratio:.2f}"
        lines.append(f"| {figure} | {ours} | {ref} | {shown} | {target} | {'yes' if met else '**no**'} |")
    lines += ["", *notes, ""]
    # The hand-written analysis below the table survives a new run.
    kept = ""
    if path.exists() and ANALYSIS in path.read_text(encoding="utf-8"):
        kept = ANALYSIS + path.read_text(encoding="utf-8").split(ANALYSIS, 1)[1]
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
