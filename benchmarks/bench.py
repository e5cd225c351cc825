"""The benchmark: ours against the raw read limit and the naive way, side by side in one run.

    .venv/bin/python benchmarks/bench.py [--rows 2000000] [--out BENCHMARKS.md] [--only GROUP[,GROUP]]
                                         [--skip-big] [--big-rows 10000000] [--skip-scaling]

It starts the embedded PostgreSQL (database ``bench``), generates a deterministic source of
``--rows`` rows over 20 daily partitions (about 20% duplicate keys differing by ordering
columns, ties on updated_at broken by seq, a few NULL keys, unicode and control characters),
measures, prints a table of ratios and writes it to BENCHMARKS.md. Timings on this kind of
machine are noisy (differences under ~30% are noise); every figure is a ratio of two
measurements taken in the same run, and each ratio figure (3, 7a-c, 13a, 14) is the median of
`--pairs` alternated pairs of ours and the naive way (default 3; benchmarks/pairs.py), so that
one noisy run cannot move it.

Figure 7 runs the whole backfill as a user does, `backfill-assets plan`, `approve` and `apply`
as three processes, against the naive way on three shapes (benchmarks/shapes.py); figure 8 the
same at --big-rows rows (time per million rows, peak RSS); figure 9 the source sensor's tick
through benchmarks/sensor_tick.py, when it exists. Figures 3 and 7a-c run again on the
machine's own PostgreSQL (Debian's package, 15 on this image), which the benchmark starts with
initdb's defaults (group `pgdefault`; rows tagged `-pg<major>`). `--only shapes` (or fig3, big,
...; see --help) runs a few figures to iterate on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import audit_bench  # benchmarks/audit_bench.py
import dagster as dg
import duck_lake  # benchmarks/duck_lake.py
import lake_fingerprint  # benchmarks/lake_fingerprint.py
import lake_targets  # benchmarks/lake_targets.py
import pairs  # benchmarks/pairs.py
import psycopg
import pyarrow as pa
import shapes  # benchmarks/shapes.py, next to this script
import spark_lake  # benchmarks/spark_lake.py
from psycopg import sql
from psycopg.conninfo import make_conninfo

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.fingerprint.partition import fingerprint_partition, fingerprint_partitions
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.pg.db import ConnectionFactory, DatabaseUrl, connection_factory, repeatable_read
from backfill_assets.core.plan import make_plan
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.spec import Spec, spec_from_mapping
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, Limits, PartitionRequest, TableRef

# The test suite's default-settings server (Debian's PostgreSQL, initdb's defaults), from this checkout.
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from backfill_assets_tests.support.servers import default_settings_server  # noqa: E402

DAYS = 20
BIG_ROWS = 10_000_000  # figure 8's large size
COLUMNS = shapes.CURRENT_COLUMNS
SPEC = shapes.CURRENT_SPEC
# The bench's own connections (loading, the naive way, the raw reads): finite waits, and the
# server's own work_mem, as a naive backfill would run with.
SERVER_SETTINGS = Limits(DEFAULT_LIMITS.lock_timeout_ms, DEFAULT_LIMITS.statement_timeout_ms, work_mem=None)
_RAW = sql.SQL(
    "COPY (SELECT t.d, t.k, t.updated_at, t.seq, t.amount, t.status, t.note FROM {stage} AS t "
    "WHERE t.d = %(day)s ORDER BY t.k) TO STDOUT (FORMAT binary)"
)
_RAW_UNORDERED = sql.SQL(
    "COPY (SELECT t.d, t.k, t.updated_at, t.seq, t.amount, t.status, t.note FROM {stage} AS t "
    "WHERE t.d = %(day)s) TO STDOUT (FORMAT binary)"
)
_MD5 = sql.SQL(
    "SELECT count(*), sum(('x' || substr(md5(t::text), 1, 16))::bit(64)::bigint) "
    "FROM {stage} AS t WHERE t.d = %(day)s"
)


def days() -> list:
    return shapes.day_list(DAYS)


def load(conn: psycopg.Connection, rows: int, n_days: int = DAYS) -> None:
    """The current shape (shapes.current): ``rows`` rows over ``n_days`` daily partitions."""
    shapes.load(conn, shapes.current(rows, n_days))


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def step_seconds(marks: list[tuple[float, ProgressEvent]], t_plan: float, t_approve: float,
                 total: float) -> dict[str, float]:
    """Seconds per step, from the progress events' times (seconds since the start) and
    fields: the builds run from the stages' first event (their ``done=0`` announcement) to
    their last partition."""
    built = [t for t, e in marks if e.step in ("stage a", "stage b")
             or (e.step == "snapshot" and e.status == "taken")]  # an exported snapshot is identified after B
    first, last = built[0], built[-1]
    return {
        "inspect + snapshot (exported: check the source in it; copy: copy, fingerprint, check)": first,
        "build A and B at once, each with its fingerprints (exported: then the source's, after B)": last - first,
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
    with factory() as conn, factory.control(conn) as store:
        approve_plan(conn, factory, spec, find_plan(store, spec, plan.plan_id), "bench")
    t_approve = time.perf_counter() - start
    apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, progress=mark)
    total = time.perf_counter() - start
    return total, step_seconds(marks, t_plan, t_approve, total), plan.plan_id


def naive_backfill(conn: psycopg.Connection, rows: int) -> float:
    """Per partition, one transaction: DELETE, then INSERT ... SELECT DISTINCT ON (shapes.py)."""
    return shapes.naive_backfill(conn, shapes.current(rows))


def _stage_columns(conn: psycopg.Connection, stage: TableRef):
    cols = {c.name: c for c in table_columns(conn, stage)}
    return [cols[n] for n in COLUMNS]


def _workers(conn: psycopg.Connection, workers: int | None) -> None:
    """The server's parallel workers per Gather for this session (None: the server's own)."""
    if workers is not None:
        conn.execute(sql.SQL("SELECT set_config('max_parallel_workers_per_gather', {}, false)").format(
            sql.Literal(str(workers))))


def fingerprint_all(factory, stage: TableRef, *, workers: int | None = None, grouped: bool = False,
                    jit: bool = False) -> float:
    """Format 3 of the 20 partitions: one aggregate per partition (as apply verifies them), or
    one aggregate over all of them (as a plan's snapshot and the stage checks read them).
    ``jit``: with the server's JIT setting instead of the tool's (off)."""
    with factory() as conn:
        cols = _stage_columns(conn, stage)
        _workers(conn, workers)
        if jit:
            shapes.server_defaults(conn)
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True):
            if grouped:
                fingerprint_partitions(conn, stage, cols, "d", ["k"], "amount", days(), key_unique=True, utf8=True)
            else:
                for day in days():
                    fingerprint_partition(conn, stage, cols, "d", ["k"], "amount", day, key_unique=True, utf8=True)
        return time.perf_counter() - start


_SORTS_OFF = sql.SQL("SELECT set_config('enable_sort', 'off', true)")


def raw_read_all(factory, stage: TableRef, *, ordered: bool = True) -> float:
    """Every row of the 20 partitions as binary COPY, bytes discarded: the read limit (in key
    order through the index, as format 1 read them; or in physical order, as format 3 may)."""
    query = _RAW if ordered else _RAW_UNORDERED
    with shapes.server_defaults(factory()) as conn:
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True), conn.cursor() as cur:
            cur.execute(_SORTS_OFF)
            for day in days():
                with cur.copy(query.format(stage=sql.Identifier(stage.schema, stage.name)), {"day": day}) as copy:
                    for _ in copy:
                        pass
        return time.perf_counter() - start


# Format 1, the format before this one, re-created here to be measured next to it: the
# readings query, then every column's text in key order through the index, as one binary COPY
# stream hashed by the client.
_V1_READINGS = sql.SQL(
    "SELECT count(*), count(*) FILTER (WHERE t.k IS NULL), coalesce(sum(t.amount), 0)::text "
    "FROM {stage} AS t WHERE t.d = %(day)s"
)
_V1_STREAM = sql.SQL(
    "COPY (SELECT t.d::text, t.k::text, t.updated_at::text, t.seq::text, t.amount::text, t.status::text, "
    "t.note::text FROM {stage} AS t WHERE t.d = %(day)s ORDER BY t.k) TO STDOUT (FORMAT binary)"
)


def format_1_all(factory, stage: TableRef) -> float:
    rel = sql.Identifier(stage.schema, stage.name)
    with shapes.server_defaults(factory()) as conn:
        start = time.perf_counter()
        with repeatable_read(conn, read_only=True), conn.cursor() as cur:
            cur.execute(_SORTS_OFF)
            for day in days():
                cur.execute(_V1_READINGS.format(stage=rel), {"day": day}).fetchone()
                h = hashlib.sha256()
                with cur.copy(_V1_STREAM.format(stage=rel), {"day": day}) as copy:
                    for chunk in copy:
                        h.update(chunk)
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
    with shapes.server_defaults(factory()) as conn:
        start = time.perf_counter()
        for day in days():
            conn.execute(_MD5.format(stage=sql.Identifier(stage.schema, stage.name)), {"day": day}).fetchone()
        return time.perf_counter() - start


def best(fn, n: int = 3) -> float:
    return min(fn() for _ in range(n))


_MEMORY_CHILD = """
import resource, sys, datetime as dt
from backfill_assets.core.pg.db import connection_factory, DatabaseUrl, repeatable_read
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, TableRef
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.fingerprint.partition import fingerprint_partition
url, day = sys.argv[1], dt.date.fromisoformat(sys.argv[2])
ref = TableRef("bench", "mem")
with connection_factory(DatabaseUrl(url, "bench"), DEFAULT_LIMITS)() as conn, repeatable_read(conn, read_only=True):
    cols = table_columns(conn, ref)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fp = fingerprint_partition(conn, ref, cols, "d", ["k"], "amount", day, utf8=True)
print(fp.row_count, before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_memory(url: str, conn: psycopg.Connection, folder: Path) -> tuple[float, float]:
    """Peak RSS (MiB) of a fresh process fingerprinting 100k rows vs 2M rows in one partition.

    Started through shapes.run_process's launcher: a direct child of this process would
    report this process's peak RSS as its own (see shapes._LAUNCHER)."""
    conn.execute(b"DROP TABLE IF EXISTS bench.mem")
    conn.execute(b"CREATE TABLE bench.mem (d date, k bigint, amount numeric(12,2), note text)")
    conn.execute(b"INSERT INTO bench.mem SELECT date '2024-01-01', g, g % 1000, repeat('x', 60) FROM generate_series(1, 100000) g")
    conn.execute(b"INSERT INTO bench.mem SELECT date '2024-01-02', g, g % 1000, repeat('x', 60) FROM generate_series(1, 2000000) g")
    conn.execute(b"CREATE INDEX ON bench.mem (d, k)")
    conn.execute(b"ANALYZE bench.mem")
    peaks = []
    for day in ("2024-01-01", "2024-01-02"):
        out = shapes.run_process([sys.executable, "-c", _MEMORY_CHILD, url, day], dict(os.environ), folder,
                                 f"memory-{day}")
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
    from backfill_assets.dagster_layer.definitions import build_definitions
    from backfill_assets.dagster_layer.names import PLAN_TAG
    from backfill_assets.dagster_layer.resources import PostgresResource

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
        preview = next(e.metadata for e in stages.get_asset_check_evaluations()
                       if e.check_name == "target_change_preview")
        plan_id, review_id = preview["plan_id"].value, preview["review_id"].value
        defs.resolve_job_def("approve_backfill").execute_in_process(
            run_config={**quiet, "ops": {"approve_plan_gate": {"config": {
                "plan_id": plan_id, "review_id": review_id, "approved_by": "bench"}}}},
            resources=resources, instance=instance)
        dg.materialize(assets, selection=[dg.AssetKey(["bench", "target"])], instance=instance,
                       resources=resources, tags={**tags, PLAN_TAG: plan_id}, run_config=quiet)
        return time.perf_counter() - start


# --- the figures: each a function of the run's state, so `--only` can pick a few -------------

GROUPS = {
    "fig3": "3: the safe backfill in process vs the naive way, and where its time goes",
    "fp": "1, 2: the fingerprint vs the raw read and vs the md5 method (runs fig3 first, for its stage)",
    "shapes": "7: plan, approve and apply as processes vs the naive way on three shapes; 9: the sensor tick; "
              "15: the audit",
    "dagster": "4: the same backfill through Dagster (runs fig3 first)",
    "memory": "5: peak RSS fingerprinting one partition",
    "scaling": "6: the safe backfill at 1/4, 1/2 and all --rows (runs fig3 first)",
    "big": "8: the CLI at --rows, --big-rows / 2 and --big-rows rows: seconds per million rows and peak RSS",
    "year": "4b: 365 partitions through Dagster",
    "sensor": "9 and 15 alone: the 365-partition shape through the CLI, then the sensor tick and the audit",
    "lake": "10: the safe backfill into a Delta and an Iceberg table vs the naive overwrite and the raw read; "
            "11: the fingerprint of a lake partition",
    "diff": "12: the diff of a 1M-row partition pair vs one fingerprint of it",
    "duckdb": "13: the whole process on DuckDB, Delta to Delta, vs the naive way and the raw read; one partition "
              "above DuckDB's memory_limit, its peak RSS (a process of its own)",
    "spark": "14: the whole process on Spark local[2], Parquet to Parquet, vs Spark's dynamic partition overwrite "
             "and the raw read",
    "pgdefault": "3 and 7a-c again on the machine's own PostgreSQL (Debian's), started by the benchmark with "
                 "initdb's defaults",
    "windows": "16: a year of hourly time windows (8,760) through the CLI vs the naive per-window DELETE+INSERT, "
               "the fixed cost per window; the same rows by New York's days as windows and as a date column's values",
    "lakewin": "16c: New York's days into a Delta table, as day windows of a time stamp and as a date column's values",
    "inputs": "17: a transform joining a dimension a tenth the source's size, through the CLI, vs the naive join "
              "and vs the same backfill without the join",
}
_NEED_FIG3 = {"fp", "dagster", "scaling"}
# Rows and notes are written in this order, whatever order the figures ran in.
FIGURES = ("1", "2", "3", "4", "5", "6", "4b", "7a", "7b", "7c", "7c+batch", "8", "8b", "9", "15a", "15b", "10a", "10b",
           "11", "12", "13a", "13b", "14", "16a", "16b", "16c", "17a", "17b")
SECTIONS = ("fp", "fig3", "shapes", "big", "sensor", "lake", "diff", "duckdb", "spark", "windows", "inputs")


@dataclass
class Report:
    """The table's rows and the notes under it, by figure and section."""

    rows: dict[str, tuple[str, str, str, float | None, str, bool | None]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)

    def row(self, figure: str, ours: float, reference: float | None, unit: str, target: str,
            ratio: float | None, met: bool | None) -> None:
        ref = "-" if reference is None else f"{reference:.2f} {unit}"
        self.rows[figure.split(".")[0]] = (figure, f"{ours:.2f} {unit}", ref, ratio, target, met)
        verdict = "-" if met is None else ("met" if met else "NOT met")
        shown = "-" if ratio is None else f"{ratio:5.2f}"
        print(f"{figure:<62} ours {ours:8.2f} {unit:<3} ref {ref:>12} ratio {shown}  {target:<9} {verdict}", flush=True)

    def note(self, section: str, *lines: str) -> None:
        self.notes.setdefault(section, []).extend(lines)
        for line in lines:
            print(line, flush=True)


@dataclass
class Bench:
    """What the figures share: the database, the command line's folder, and results that a
    later figure reuses (figure 3's naive run on the loaded source, figure 7a's CLI run)."""

    args: argparse.Namespace
    url: DatabaseUrl
    factory: ConnectionFactory
    folder: Path
    # Which server: "" for the embedded one; "-pg<major>" for the default-settings server
    # (figure ids and note sections carry it).
    tag: str = ""
    naive_current: float | None = None
    safe: float | None = None
    cli_current: shapes.CliRun | None = None

    def tool(self, spec) -> ConnectionFactory:
        """The tool's own connections for ``spec`` (its limits and work_mem), for what runs in
        process; ``factory`` opens connections with the server's settings, for the naive side."""
        return connection_factory(self.url, spec.limits, application_name="backfill_assets:bench")


def figure_3(b: Bench, report: Report) -> None:
    spec = spec_from_mapping(SPEC)
    shape = shapes.current(b.args.rows)
    with b.factory() as conn:
        t_load, _ = timed(lambda: load(conn, b.args.rows))
        print(f"generated {b.args.rows} source rows in {t_load:.1f} s", flush=True)

        def naive() -> float:
            shapes.reset(conn, shape)
            return naive_backfill(conn, b.args.rows)

        def ours() -> tuple[float, dict[str, float]]:
            shapes.reset(conn, shape)
            safe, steps, _ = safe_backfill(spec, b.tool(spec))
            return safe, steps

        paired = pairs.alternated(b.args.pairs, naive, ours)
    b.naive_current, b.safe = paired.naive, paired.ours
    report.row(f"3{b.tag}. whole safe backfill of 20 partitions vs naive DELETE+INSERT", paired.ours, paired.naive,
               "s", "<= 3.0x", paired.ratio, paired.ratio <= 3.0)
    report.note("fig3" + b.tag, f"Where the safe backfill's time goes (figure 3{b.tag}, in process; "
                f"{paired.spread()}, the median pair's steps):",
                *(f"   - {name}: {seconds:.2f} s" for name, seconds in paired.detail.items()))


def figures_1_2(b: Bench, report: Report) -> None:
    """On figure 3's stage A (still in place): format 3 at 0, 1 and 2 parallel workers, per
    partition and in one statement, next to format 1 and the raw reads."""
    factory = b.factory
    stage = TableRef("backfill_control", "bench__stage_a")
    with factory() as conn:
        stage_rows = conn.execute(b"SELECT count(*) FROM backfill_control.bench__stage_a").fetchone()[0]
    raw = best(lambda: raw_read_all(factory, stage))
    raw_unordered = best(lambda: raw_read_all(factory, stage, ordered=False))
    v1 = best(lambda: format_1_all(factory, stage))
    per = {w: best(lambda w=w: fingerprint_all(factory, stage, workers=w)) for w in (0, 1, 2)}
    grouped = {w: best(lambda w=w: fingerprint_all(factory, stage, workers=w, grouped=True)) for w in (0, 1, 2)}
    with_jit = best(lambda: fingerprint_all(factory, stage, jit=True))
    md5 = best(lambda: md5_all(factory, stage))
    one, two = two_backends(factory)
    ours = per[2]  # the server's default: max_parallel_workers_per_gather = 2
    report.row(f"1. fingerprint {stage_rows} stage rows: format 3 (per partition, 2 workers) vs format 1", ours, v1,
               "s", "report", ours / v1, None)
    # Both in the database now: a SHA-256 per row and three exact sums against an md5 per row
    # and one 64-bit sum (which loses the carries and is not a multiset digest past 2^64).
    report.row("2. fingerprint (format 3, one statement, 2 workers) vs in-database sum of md5 (data-diff style)",
               grouped[2], md5, "s", "report", grouped[2] / md5, None)
    report.note(
        "fp",
        "Where the fingerprint's time goes (figures 1 and 2, 20 partitions of stage A; each the best of 3):",
        f"   - raw binary COPY read in key order, bytes discarded (format 1's read limit): {raw:.2f} s",
        f"   - raw binary COPY read in physical order, bytes discarded: {raw_unordered:.2f} s",
        f"   - format 1 (the readings query, then every column's text in key order hashed by the client): "
        f"{v1:.2f} s = {v1 / raw:.2f}x the ordered read",
        "   - format 3, one aggregate per partition (as apply verifies a partition), by parallel workers per "
        "Gather: " + ", ".join(f"{w}: {per[w]:.2f} s ({per[w] / v1:.2f}x format 1)" for w in (0, 1, 2)),
        "   - format 3, one aggregate over the 20 partitions (as a snapshot, read_stages and approve read them): "
        + ", ".join(f"{w}: {grouped[w]:.2f} s ({grouped[w] / v1:.2f}x format 1)" for w in (0, 1, 2)),
        f"   - serial over 2 workers: per partition {per[0] / per[2]:.2f}x, one statement {grouped[0] / grouped[2]:.2f}x",
        f"   - format 3 per partition, 2 workers, with the server's JIT on (the tool turns it off): {with_jit:.2f} s "
        f"= {with_jit / per[2]:.2f}x",
        f"   - in-database sum of md5 over each row's text (data-diff style): {md5:.2f} s",
        "",
        f"This machine's parallelism: 20 sorted reads of the source on one connection {one:.2f} s, "
        f"split over two at once {two:.2f} s ({one / two:.2f}x).",
        "",
    )


def tool_work_mem() -> str | None:
    """The work_mem the core sets on its own connections (core.vocabulary.Limits)."""
    return DEFAULT_LIMITS.work_mem


def _cli_note(title: str, paired: pairs.Paired[shapes.CliRun], partitions: int, rows: int,
              startup: float, naive_tool_mem: float | None = None) -> str:
    run, naive = paired.detail, paired.naive
    cpu = sum(p.cpu for p in run.steps.values())
    extra = (run.seconds - naive) / partitions
    same_mem = ("" if naive_tool_mem is None else
                f"; the naive way with work_mem={tool_work_mem()}, as the tool sets for its own transactions, "
                f"{naive_tool_mem:.2f} s ({run.seconds / naive_tool_mem:.2f}x)")
    return (f"   - {title}, {rows} source rows: ours {run.seconds:.2f} s = {run.shares()}; naive {naive:.2f} s "
            f"({run.seconds / naive:.2f}x, the {paired.spread()}){same_mem}; (ours - naive) / {partitions} partitions = {1000 * extra:.0f} ms; "
            f"process start-up 3 x {startup:.2f} s = {100 * 3 * startup / run.seconds:.0f}% of ours; "
            f"the processes' own CPU {cpu:.2f} s (the rest is the server, or waiting for it); "
            f"peak RSS {run.peak_mib:.0f} MiB")


def _timed_pair(b: Bench, conn: psycopg.Connection, shape: shapes.Shape,
                n_days: int | None = None) -> tuple[pairs.Paired[shapes.CliRun], float | None]:
    """The naive way and ours through the CLI in alternated pairs (benchmarks/pairs.py), each
    from the same state: empty targets, no control schema, a checkpoint. Also, once, the naive
    way with the work_mem the core sets for its own transactions, when it sets one (the
    server's stays the default)."""
    def naive() -> float:
        shapes.reset(conn, shape)
        return shapes.naive_backfill(conn, shape, n_days)

    def ours() -> tuple[float, shapes.CliRun]:
        shapes.reset(conn, shape)
        run = shapes.run_cli(shape, b.url.reveal(), b.folder, n_days)
        return run.seconds, run

    naive_tool_mem = None
    if tool_work_mem() is not None:
        shapes.reset(conn, shape)
        naive_tool_mem = shapes.naive_backfill(conn, shape, n_days, work_mem=tool_work_mem())
    # Ours runs last (an odd number of pairs ends with naive, then ours): what follows (the
    # sensor figure) finds the state our run left.
    return pairs.alternated(b.args.pairs, naive, ours), naive_tool_mem


def _source_rows(conn: psycopg.Connection, shape: shapes.Shape, n_days: int | None = None) -> int:
    days = shape.days_list(n_days)
    query = sql.SQL("SELECT count(*) FROM {} WHERE {} BETWEEN %(first)s AND %(last)s").format(
        shape.table("src"), sql.Identifier(shape.spec["partition_key"]))
    return int(conn.execute(query, {"first": days[0], "last": days[-1]}).fetchone()[0])


def figure_shapes(b: Bench, report: Report, *, with_sensor: bool = True) -> None:
    """Figure 7: plan, approve and apply as the CLI runs them (three processes) against the
    naive way, on the current shape, a wide duplicate-heavy one and 365 small partitions; the
    fixed cost per partition from the small shape at 73 and 365 partitions; then figure 9."""
    startup, startup_mib = shapes.startup_seconds(b.folder)
    report.note("shapes" + b.tag, "Plan, approve and apply as processes (figure 7; `backfill-assets plan --json`, "
                "`approve --yes`, `apply`; each from empty targets, no control schema, after a CHECKPOINT):",
                f"   - one process's start-up (`backfill-assets --help`: the interpreter and the command line's "
                f"imports), best of 3: {startup:.2f} s, peak RSS {startup_mib:.0f} MiB")
    current = shapes.current(b.args.rows)
    with b.factory() as conn:
        if b.naive_current is None:
            shapes.load(conn, current)
        paired, naive_mem = _timed_pair(b, conn, current)
        rows = _source_rows(conn, current)
    run, naive = paired.detail, paired.naive
    b.cli_current = run
    report.row(f"7a{b.tag}. CLI backfill vs naive: {current.title}", run.seconds, naive, "s", "<= 3.0x",
               paired.ratio, paired.ratio <= 3.0)
    report.note("shapes" + b.tag, _cli_note(current.title, paired, current.days, rows, startup, naive_mem))
    if b.safe is not None:
        report.note("shapes" + b.tag, f"     the same backfill in process (figure 3): {b.safe:.2f} s; as processes "
                              f"{run.seconds - b.safe:+.2f} s")

    wide = shapes.wide()
    with b.factory() as conn:
        t_load, rows = timed(lambda: shapes.load(conn, wide))
        print(f"generated {rows} wide source rows in {t_load:.1f} s", flush=True)
        paired, naive_mem = _timed_pair(b, conn, wide)
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(wide.control_schema)))
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(wide.schema)))
    # Issue 35's target for this shape.
    report.row(f"7b{b.tag}. CLI backfill vs naive: {wide.title}", paired.ours, paired.naive, "s", "<= 5.0x",
               paired.ratio, paired.ratio <= 5.0)
    report.note("shapes" + b.tag, _cli_note(wide.title, paired, wide.days, rows, startup, naive_mem))

    small = shapes.small()
    fewer = 73
    with b.factory() as conn:
        t_load, rows = timed(lambda: shapes.load(conn, small))
        print(f"generated {rows} source rows over {small.days} partitions in {t_load:.1f} s", flush=True)
        few, few_naive_mem = _timed_pair(b, conn, small, fewer)
        few_rows = _source_rows(conn, small, fewer)
        paired, naive_mem = _timed_pair(b, conn, small)
    run, naive, few_run, few_naive = paired.detail, paired.naive, few.detail, few.naive
    slope, naive_slope, per_step = _fixed_cost(run, few_run, naive, few_naive, small.days - fewer)
    # Issue 35's targets for this shape: the ratio, and the fixed cost per partition.
    met = paired.ratio <= 5.0 and slope - naive_slope <= 0.010
    report.row(f"7c{b.tag}. CLI backfill vs naive: {small.title}", run.seconds, naive, "s",
               "<= 5.0x, +10 ms/p", paired.ratio, met)
    report.note("shapes" + b.tag, _cli_note(shapes.small(fewer).title, few, fewer, few_rows, startup, few_naive_mem),
                _cli_note(small.title, paired, small.days, rows, startup, naive_mem))
    report.note(
        "shapes" + b.tag,
        f"   - fixed cost per partition, the slope between {fewer} and {small.days} partitions of ~1k rows "
        f"(the same rows per partition): ours {1000 * slope:.0f} ms ({per_step}), naive {1000 * naive_slope:.0f} ms; "
        f"{1000 * (slope - naive_slope):.0f} ms per partition more than the naive way. Per run, apart from "
        f"partitions (the intercept): ours {run.seconds - small.days * slope:.2f} s, of which process "
        f"start-up {3 * startup:.2f} s.",
    )
    figure_batched(b, report, small, fewer)
    if with_sensor:
        figure_sensor(b, report, small)
        figure_audit(b, report, small)


def _fixed_cost(run: shapes.CliRun, few_run: shapes.CliRun, naive: float, few_naive: float,
                span: int) -> tuple[float, float, str]:
    """The slope between two runs ``span`` partitions apart: ours and the naive way's, in
    seconds per partition, and ours per process as text."""
    per_step = ", ".join(f"{name} {1000 * (p.seconds - few_run.steps[name].seconds) / span:.0f} ms"
                         for name, p in run.steps.items())
    return (run.seconds - few_run.seconds) / span, (naive - few_naive) / span, per_step


# The batch size the small shape is measured with (spec replace_batch_rows): ~50 of its partitions.
BATCH_ROWS = 50_000


def figure_batched(b: Bench, report: Report, small: shapes.Shape, fewer: int) -> None:
    """Figure 7c again with the spec's replace_batch_rows: consecutive small partitions
    replaced several per transaction (core.apply.batched), in pairs of its own."""
    shape = dataclasses.replace(small, key="small-batched", title=f"{small.title}, replace_batch_rows {BATCH_ROWS}",
                                spec={**small.spec, "replace_batch_rows": BATCH_ROWS})
    with b.factory() as conn:
        few, _ = _timed_pair(b, conn, shape, fewer)
        paired, _ = _timed_pair(b, conn, shape)
    run, naive = paired.detail, paired.naive
    report.row(f"7c+batch{b.tag}. the same, replace_batch_rows {BATCH_ROWS}", run.seconds, naive, "s", "<= 3.5x",
               paired.ratio, paired.ratio <= 3.5)
    slope, naive_slope, per_step = _fixed_cost(run, few.detail, naive, few.naive, small.days - fewer)
    report.note("shapes" + b.tag, f"   - with replace_batch_rows {BATCH_ROWS}: ours {run.seconds:.2f} s "
                f"({run.shares()}; the {paired.spread()}); fixed cost per partition {1000 * slope:.0f} ms ({per_step}), "
                f"{1000 * (slope - naive_slope):.0f} ms more than the naive way's")


SENSOR_TICK = Path(__file__).with_name("sensor_tick.py")  # another engineer's: tick_seconds(factory, spec)


def figure_sensor(b: Bench, report: Report, small: shapes.Shape, module_path: Path = SENSOR_TICK) -> None:
    """Figure 9: one tick of the source sensor over the 365 partitions just backfilled (their
    snapshot in place, the source unchanged), through benchmarks/sensor_tick.py when it exists."""
    title = f"9. sensor tick over {small.days} snapshotted, unchanged partitions"
    if not module_path.exists():
        report.note("sensor", f"{title}: skipped, benchmarks/sensor_tick.py does not exist yet.")
        return
    found = importlib.util.spec_from_file_location("sensor_tick", module_path)
    sensor_tick = importlib.util.module_from_spec(found)
    found.loader.exec_module(sensor_tick)
    spec = spec_from_mapping(small.spec)
    try:
        seconds = float(sensor_tick.tick_seconds(b.tool(spec), spec))
        # The old sensor's work on the same partitions (every one fingerprinted), when offered.
        full = getattr(sensor_tick, "full_check_seconds", None)
        reference = None if full is None else float(full(b.tool(spec), spec))
    except Exception as err:  # noqa: BLE001 - a hook under construction must not lose the run; reported
        report.note("sensor", f"{title}: failed: {err.__class__.__name__}: {err}")
        return
    report.row(title + ("" if reference is None else " vs fingerprinting them all"), seconds, reference, "s",
               "report (x faster)", None if reference is None else reference / seconds, None)


def figure_sensor_alone(b: Bench, report: Report) -> None:
    small = shapes.small()
    with b.factory() as conn:
        shapes.load(conn, small)
        shapes.reset(conn, small)
    shapes.run_cli(small, b.url.reveal(), b.folder)
    figure_sensor(b, report, small)
    figure_audit(b, report, small)


def figure_audit(b: Bench, report: Report, small: shapes.Shape) -> None:
    """Figure 15: the audit of the 365 partitions just backfilled (nobody changed them since):
    by the target's signal against a full audit, and the full audit against one fingerprint
    pass over the same partitions (benchmarks/audit_bench.py)."""
    spec = spec_from_mapping(small.spec)
    figures = audit_bench.audit_figures(b.tool(spec), spec)
    n = figures.partitions
    report.row(f"15a. audit of {n} unchanged partitions by their signal ({figures.signal}) vs a full audit",
               figures.cheap, figures.full, "s", "report (x faster)", figures.full / figures.cheap, None)
    report.row(f"15b. full audit of {n} partitions vs one fingerprint pass over them", figures.full,
               figures.one_pass, "s", "<= 1.5x", figures.full / figures.one_pass, figures.full / figures.one_pass <= 1.5)
    report.note("sensor", f"Figure 15 ({n} verified partitions of ~1k rows, PostgreSQL target, medians of 3): the "
                f"audit by the table's counters {figures.cheap:.2f} s (no row read; its cost is the ledger's and the "
                f"audit's own records), the full audit {figures.full:.2f} s (every partition fingerprinted, compared "
                f"and recorded), one fingerprint pass {figures.one_pass:.2f} s.")


def figure_4(b: Bench, report: Report) -> None:
    with b.factory() as conn:  # the state the CLI path started from: no stages, no snapshot, empty target
        conn.execute(b"DROP SCHEMA IF EXISTS backfill_control CASCADE")
        conn.execute(b"TRUNCATE bench.tgt")
    t_dagster = dagster_backfill(spec_from_mapping(SPEC), b.url.reveal())
    # The CLI path is figure 7a's three processes on the same data; without it (--only), the
    # same backfill in process, a stricter reference (no process start-ups).
    cli = b.cli_current.seconds if b.cli_current is not None else None
    reference, what = (cli, "the CLI path (7a, as processes)") if cli is not None else (b.safe, "the same backfill in process")
    report.row(f"4. the same backfill through Dagster (in process) vs {what}", t_dagster, reference, "s", "<= 1.2x",
               t_dagster / reference, t_dagster / reference <= 1.2)
    report.note("fig3", f"Figure 4 against the backfill in process (figure 3, no process start-ups): "
                        f"{t_dagster:.2f} s vs {b.safe:.2f} s = {t_dagster / b.safe:.2f}x.")


def figure_5(b: Bench, report: Report) -> None:
    with b.factory() as conn:
        small, big = peak_memory(b.url.reveal(), conn, b.folder)
    report.row("5. peak RSS fingerprinting 2M vs 100k rows in one partition", big, small, "MiB", "+32 MiB",
               big - small, big - small <= 32)


def figure_6(b: Bench, report: Report) -> None:
    # Each size twice from a fresh load (a rerun would skip verified partitions), the
    # faster run kept: single runs here vary by up to ~20% (autovacuum, a noisy host).
    spec, rows = spec_from_mapping(SPEC), b.args.rows
    times: dict[int, float] = {}
    for n in (rows // 4, rows // 2, rows):
        runs = [b.safe] if n == rows else []
        while len(runs) < 2:
            with b.factory() as conn:
                load(conn, n)
            runs.append(safe_backfill(spec, b.tool(spec))[0])
        times[n] = min(runs)
    ratio = times[rows] / times[rows // 4]
    report.row(f"6. safe backfill scaling: {rows} vs {rows // 4} rows (4x)", times[rows], times[rows // 4],
               "s", "<= 4.4x", ratio, ratio <= 4.4)
    report.note("fig3", "   - scaling (best of 2 runs each): " + ", ".join(f"{n} rows {t:.1f} s" for n, t in sorted(times.items())))


def figure_big(b: Bench, report: Report) -> None:
    """Figure 8: the CLI on the current shape at --rows, half --big-rows and --big-rows rows:
    seconds per million source rows (linear: the same at every size) and the processes' peak
    RSS (flat). Figure 7a's run is the --rows point when it ran."""
    runs: dict[int, shapes.CliRun] = {}
    if b.cli_current is not None:
        runs[b.args.rows] = b.cli_current
    for n in sorted({b.args.rows, b.args.big_rows // 2, b.args.big_rows}):
        if n in runs:
            continue
        shape = shapes.current(n)
        with b.factory() as conn:
            t_load, _ = timed(lambda: shapes.load(conn, shape))
            print(f"generated {n} source rows in {t_load:.1f} s", flush=True)
            shapes.reset(conn, shape)
        runs[n] = shapes.run_cli(shape, b.url.reveal(), b.folder)
    small_n, big_n = b.args.rows, b.args.big_rows
    per_m = {n: run.seconds / (n / 1e6) for n, run in runs.items()}
    ratio = per_m[big_n] / per_m[small_n]
    report.row(f"8. CLI backfill, seconds per million rows: {big_n} vs {small_n} rows", per_m[big_n], per_m[small_n],
               "s/M", "<= 1.1x", ratio, ratio <= 1.1)
    grow = runs[big_n].peak_mib - runs[small_n].peak_mib
    report.row(f"8b. peak RSS of the CLI processes: {big_n} vs {small_n} rows", runs[big_n].peak_mib,
               runs[small_n].peak_mib, "MiB", "+32 MiB", grow, grow <= 32)
    report.note("big", "The CLI at several sizes of the current shape (figure 8; 20 partitions, each from empty targets):",
                *(f"   - {n} rows: {run.seconds:.1f} s = {per_m[n]:.2f} s per million rows; {run.shares()}; "
                  "peak RSS " + ", ".join(f"{name} {p.peak_mib:.0f} MiB" for name, p in run.steps.items())
                  for n, run in sorted(runs.items())))


def figures_default_server(b: Bench, report: Report) -> None:
    """Figures 3 and 7a-c on the machine's own PostgreSQL (Debian's package), started in a
    folder of the run with initdb's defaults (a Unix socket only), next to the embedded one."""
    with default_settings_server(b.folder / "pg-default-server") as admin:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(b"CREATE DATABASE bench")
            major = conn.execute(b"SELECT current_setting('server_version_num')::int / 10000").fetchone()[0]
        url = DatabaseUrl(make_conninfo(admin, dbname="bench"), "the default-settings server")
        other = Bench(b.args, url, connection_factory(url, SERVER_SETTINGS, application_name="backfill_assets:bench"),
                      b.folder / "pg-default", tag=f"-pg{major}")
        with other.factory() as conn:
            added = server_header(shapes.server_defaults(conn), f"Debian's package, initdb's defaults, rows tagged -pg{major}")
        report.header.extend(added)
        for line in added:
            print(line, flush=True)
        figure_3(other, report)
        figure_shapes(other, report, with_sensor=False)


def figure_4b(b: Bench, report: Report) -> None:
    with b.factory() as conn:
        load(conn, 365 * 50, n_days=365)
    t_year = dagster_backfill(spec_from_mapping(SPEC), b.url.reveal(), last_day="2024-12-30")
    with b.factory() as conn:
        verified = conn.execute(b"SELECT count(DISTINCT partition) FROM backfill_control.ledger "
                                b"WHERE status = 'verified'").fetchone()[0]
    report.row("4b. 365 daily partitions (50 rows each) in one single-run Dagster backfill", t_year, None, "s",
               "completes", float(verified), verified == 365)


def _groups(text: str) -> set[str]:
    chosen = {g.strip() for g in text.split(",") if g.strip()}
    unknown = chosen - set(GROUPS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown figure group(s) {', '.join(sorted(unknown))}; "
                                         f"choose from {', '.join(GROUPS)}")
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="figure groups for --only:\n" + "\n".join(
                                         f"  {name:<8} {text}" for name, text in GROUPS.items()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--big-rows", type=int, default=BIG_ROWS, help=f"figure 8's large size (default {BIG_ROWS})")
    parser.add_argument("--out", default=None,
                        help="the report to write (default: BENCHMARKS.md for a whole run; a run with --only "
                             "writes none unless given one, so that it never replaces a whole run's report)")
    parser.add_argument("--only", type=_groups, default=None, metavar="GROUP[,GROUP]",
                        help="run only these figure groups (default: all but `sensor`, which `shapes` includes)")
    parser.add_argument("--pairs", type=int, default=3,
                        help="each ratio figure (3, 7a-c, 13a, 14) is the median of this many alternated pairs of "
                             "ours and the naive way (odd; default 3)")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-big", action="store_true", help="leave out figure 8 (the large run)")
    parser.add_argument("--database", default="bench", help="the embedded server's database to use (default bench)")
    args = parser.parse_args()
    only = set(args.only) if args.only is not None else set(GROUPS) - {"sensor"}
    if "shapes" in only:
        only.discard("sensor")
    if args.skip_scaling:
        only.discard("scaling")
    if args.skip_big:
        only.discard("big")
    if only & _NEED_FIG3:
        only.add("fig3")
    url = embedded.database_url(args.database)
    report = Report()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as folder:
        b = Bench(args, url, connection_factory(url, SERVER_SETTINGS, application_name="backfill_assets:bench"), Path(folder))
        with b.factory() as conn:
            report.header = server_header(shapes.server_defaults(conn))
        for line in report.header:
            print(line, flush=True)
        steps = [("fig3", figure_3), ("fp", figures_1_2), ("shapes", figure_shapes), ("dagster", figure_4),
                 ("memory", figure_5), ("scaling", figure_6), ("big", figure_big), ("year", figure_4b),
                 ("sensor", figure_sensor_alone), ("lake", figure_lake), ("lake", figure_lake_fingerprint),
                 ("diff", figure_diff), ("duckdb", figure_duckdb), ("spark", figure_spark),
                 ("windows", figure_windows), ("lakewin", figure_lake_windows), ("inputs", figure_inputs),
                 ("pgdefault", figures_default_server)]
        for group, figure in steps:
            if group in only:
                t, _ = timed(lambda: figure(b, report))
                print(f"[{group}: {t:.0f} s]", flush=True)
    elapsed = time.perf_counter() - started
    if args.out is None and args.only is not None:
        print("no report written (a run with --only writes one only with --out FILE)")
        return 0
    write_report(Path(args.out or "BENCHMARKS.md"), args, only, report, elapsed)
    return 0


def figure_windows(b: Bench, report: Report) -> None:
    """Figure 16: time windows. 16a: New York's 8,760 hours of 2023 as hour windows of a
    timestamptz column, plan, approve and apply as processes, against the naive way per window
    (DELETE and INSERT ... DISTINCT ON of the window's range, one transaction each); the fixed
    cost per window from the slope between a quarter of them and all. 16b: the same rows by New
    York's days, as 365 day windows of the column and as the 365 values of a date column holding
    each row's day: a window must cost no more than a value partition."""
    hours = shapes.hourly()
    quarter = hours.days // 4
    with b.factory() as conn:
        t_load, rows = timed(lambda: shapes.load(conn, hours))
        print(f"generated {rows} source rows over {hours.days} hours in {t_load:.1f} s", flush=True)

        def naive(n: int | None) -> Callable[[], float]:
            def run() -> float:
                shapes.reset(conn, hours)
                return shapes.naive_window_backfill(conn, hours, n)
            return run

        def ours(n: int | None) -> Callable[[], tuple[float, shapes.CliRun]]:
            def run() -> tuple[float, shapes.CliRun]:
                shapes.reset(conn, hours)
                done = shapes.run_cli(hours, b.url.reveal(), b.folder, n)
                return done.seconds, done
            return run

        few = pairs.alternated(b.args.pairs, naive(quarter), ours(quarter))
        paired = pairs.alternated(b.args.pairs, naive(None), ours(None))
        written = int(conn.execute(sql.SQL("SELECT count(*) FROM bench_hourly.tgt")).fetchone()[0])
    run = paired.detail
    slope, naive_slope, per_step = _fixed_cost(run, few.detail, paired.naive, few.naive, hours.days - quarter)
    report.row("16a. CLI backfill vs naive: a year of hour windows (8,760 x ~40 rows)", run.seconds, paired.naive,
               "s", "-", paired.ratio, None)
    report.note("windows", "Time windows (figure 16; benchmarks/shapes.py `hourly`, New York's hours of 2023, 40 "
                "source rows and 36 target rows an hour, an index on the column; each run from empty targets and no "
                "control schema, after a CHECKPOINT):",
                f"   - 16a. {hours.days} hour windows, {rows} source rows, {written} written: ours {run.seconds:.2f} s "
                f"({run.shares()}; the {paired.spread()}), naive per-window DELETE+INSERT {paired.naive:.2f} s; "
                f"peak RSS {run.peak_mib:.0f} MiB. Fixed cost per window, the slope between {quarter} and {hours.days} "
                f"windows: ours {1000 * slope:.1f} ms ({per_step}), naive {1000 * naive_slope:.1f} ms")

    day_windows = shapes.hourly(spec=shapes.DAY_WINDOWS_SPEC, windows=365)
    day_values = dataclasses.replace(shapes.hourly(spec=shapes.DAY_VALUES_SPEC, windows=365), key="dayval")
    with b.factory() as conn:
        def side(shape: shapes.Shape) -> Callable[[], tuple[float, shapes.CliRun]]:
            def run() -> tuple[float, shapes.CliRun]:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(shape.control_schema)))
                conn.execute(sql.SQL("TRUNCATE {}").format(shape.table(shape.spec["target"]["table"].split(".")[1])))
                conn.execute(sql.SQL("CHECKPOINT"))
                done = shapes.run_cli(shape, b.url.reveal(), b.folder)
                return done.seconds, done
            return run

        values = side(day_values)
        days = pairs.alternated(b.args.pairs, lambda: values()[0], side(day_windows))
    report.row("16b. 365 day windows of a timestamptz vs 365 values of a date column (the same rows)", days.ours,
               days.naive, "s", "<= 1.1x", days.ratio, days.ratio <= 1.1)
    report.note("windows", f"   - 16b. the same rows by New York's days: as 365 day windows of `at` {days.ours:.2f} s "
                f"({days.detail.shares()}), as the 365 values of a date column `d` holding each row's day "
                f"{days.naive:.2f} s; {days.ratio:.2f}x ({days.spread()})")


def figure_lake_windows(b: Bench, report: Report, n: int = 60) -> None:
    """16c: the first ``n`` of New York's days of figure 16's rows into a Delta table, as day
    windows of `at` (a table not partitioned, each window overwritten by its range predicate and
    its commit checked in the log) and as the values of `d` (a table partitioned by them): a
    window must cost no more than a value partition here either."""
    with b.factory() as conn:
        shapes.load(conn, shapes.hourly())  # figure 16's rows, made afresh

    def lake(spec: dict[str, Any], name: str) -> shapes.Shape:
        shape = shapes.hourly(spec={**spec, "target": {"format": "delta", "location": str(b.folder / name)}},
                              windows=365)
        return dataclasses.replace(shape, key=name)

    day_windows, day_values = lake(shapes.DAY_WINDOWS_SPEC, "delta_daywin"), lake(shapes.DAY_VALUES_SPEC, "delta_dayval")
    with b.factory() as conn:
        def side(shape: shapes.Shape) -> Callable[[], tuple[float, shapes.CliRun]]:
            def run() -> tuple[float, shapes.CliRun]:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(shape.control_schema)))
                shutil.rmtree(shape.spec["target"]["location"], ignore_errors=True)
                done = shapes.run_cli(shape, b.url.reveal(), b.folder, n)
                return done.seconds, done
            return run

        values = side(day_values)
        days = pairs.alternated(b.args.pairs, lambda: values()[0], side(day_windows))
    report.row(f"16c. {n} day windows vs {n} date values into a Delta table (the same rows)", days.ours,
               days.naive, "s", "<= 1.1x", days.ratio, days.ratio <= 1.1)
    report.note("windows", f"   - 16c. the first {n} of those days into a Delta table: as day windows (a table not "
                f"partitioned, each window overwritten by its range) {days.ours:.2f} s ({days.detail.shares()}), as the "
                f"values of `d` (a table partitioned by them) {days.naive:.2f} s; {days.ratio:.2f}x ({days.spread()})")


def figure_inputs(b: Bench, report: Report) -> None:
    """Figure 17: a transform over two inputs. small's 365 days (~385k rows), each row's status
    its customer's region from a dimension a tenth the source's size (38,500 customers), read
    whole in the source's exported snapshot and pinned in the plan: plan, approve and apply as
    processes. 17a against the naive way (per day, DELETE and INSERT ... DISTINCT ON over the
    source joined with the dimension as it is); 17b against the same backfill without the join
    (the dimension's cost: its read and pin, and the join, in both builds)."""
    joined, unjoined = shapes.joined(), shapes.joined(spec=shapes.UNJOINED_SPEC)
    with b.factory() as conn:
        t_load, rows = timed(lambda: shapes.load(conn, joined))
        print(f"generated {rows} source rows and {shapes.JOINED_CUSTOMERS} customers in {t_load:.1f} s", flush=True)

        def reset() -> None:
            for shape in (joined, unjoined):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(shape.control_schema)))
            for name in ("tgt", "tgt_unjoined", "tgt_naive"):
                conn.execute(sql.SQL("TRUNCATE {}").format(joined.table(name)))
            conn.execute(sql.SQL("CHECKPOINT"))

        def naive() -> float:
            reset()
            return shapes.naive_join_backfill(conn, joined)

        def ours(shape: shapes.Shape) -> Callable[[], tuple[float, shapes.CliRun]]:
            def run() -> tuple[float, shapes.CliRun]:
                reset()
                done = shapes.run_cli(shape, b.url.reveal(), b.folder)
                return done.seconds, done
            return run

        vs_naive = pairs.alternated(b.args.pairs, naive, ours(joined))
        shapes.naive_join_backfill(conn, joined)  # the naive rows beside ours (the last run, ours, emptied them)
        same = conn.execute(sql.SQL(
            "SELECT count(*) FROM (SELECT d, k, updated_at, seq, amount, status, note FROM bench_joined.tgt "
            "EXCEPT ALL SELECT d, k, updated_at, seq, amount, status, note FROM bench_joined.tgt_naive) AS x")).fetchone()
        written = int(conn.execute(sql.SQL("SELECT count(*) FROM bench_joined.tgt")).fetchone()[0])
        unjoined_run = ours(unjoined)
        vs_unjoined = pairs.alternated(b.args.pairs, lambda: unjoined_run()[0], ours(joined))
    run = vs_naive.detail
    report.row("17a. CLI backfill with a dimension join vs the naive join (365 x ~1k rows)", run.seconds,
               vs_naive.naive, "s", "-", vs_naive.ratio, None)
    report.row("17b. the same backfill with the dimension join vs without it", vs_unjoined.ours, vs_unjoined.naive,
               "s", "-", vs_unjoined.ratio, None)
    report.note("inputs", "Several inputs (figure 17; benchmarks/shapes.py `joined`: small's 365 days, each row's "
                f"status its customer's region, {shapes.JOINED_CUSTOMERS} customers read whole; each run from empty "
                "targets and no control schema, after a CHECKPOINT):",
                f"   - 17a. {rows} source rows, {written} written ({same[0]} rows differ from the naive join's): "
                f"ours {run.seconds:.2f} s ({run.shares()}; the {vs_naive.spread()}), naive per-day DELETE+INSERT over "
                f"the join {vs_naive.naive:.2f} s; peak RSS {run.peak_mib:.0f} MiB",
                f"   - 17b. with the join {vs_unjoined.ours:.2f} s ({vs_unjoined.detail.shares()}), without it "
                f"{vs_unjoined.naive:.2f} s: the dimension costs {vs_unjoined.ratio:.2f}x ({vs_unjoined.spread()})")


def figure_lake(b: Bench, report: Report) -> None:
    """Figure 10: the safe backfill of the bench's source into a Delta and an Iceberg table
    (apply creates each) against the naive way (per partition, DISTINCT ON read into Arrow and
    the lake's own partition overwrite) and the raw read of the same partitions."""
    with b.factory() as conn:  # the bench's source at --rows (later figures load other sizes)
        load(conn, b.args.rows)
    for letter, fmt in (("a", "delta"), ("b", "iceberg")):
        folder = b.folder / f"lake_{fmt}"
        folder.mkdir(parents=True, exist_ok=True)
        spec = spec_from_mapping(lake_targets.spec(fmt, folder))
        with b.factory() as conn:
            catalog = lake_targets.catalog_for(conn, folder) if fmt == "iceberg" else None
            if catalog is not None:
                lake_targets.drop_iceberg(catalog)
            naive = lake_targets.naive(conn, fmt, folder, days(), catalog)
            read, rows = lake_targets.raw_read(fmt, folder, days(), catalog)
        safe, steps, _ = safe_backfill(spec, b.tool(spec))
        applied = next(v for k, v in steps.items() if k.startswith("apply"))
        report.row(f"10{letter}. whole safe backfill into {fmt} vs naive lake overwrite", safe, naive, "s", "-",
                   safe / naive, None)
        report.note(
            "lake",
            f"Figure 10{letter} ({fmt}, {rows} rows over {DAYS} partitions): ours {safe:.2f} s = "
            f"{safe / naive:.2f}x the naive overwrite ({naive:.2f} s); of it apply {applied:.2f} s "
            f"({applied / naive:.2f}x the naive way; it creates the table, then per partition reads the "
            f"stage into Arrow, fingerprints it, commits and reads the committed version back to "
            f"fingerprint it again). The raw read of the written partitions takes {read:.2f} s "
            f"({read / naive:.2f}x the naive way).",
        )


def figure_duckdb(b: Bench, report: Report) -> None:
    """Figure 13: the whole safe backfill on DuckDB, Delta to Delta (the bench's source at --rows
    over 20 partitions, exported to a Delta table), against the naive way (DuckDB's newest-wins
    read and the lake's predicate overwrite) and the raw read; then one partition above
    DuckDB's memory_limit, planned, approved and applied by a process of its own."""
    folder = b.folder / "duck"
    folder.mkdir(parents=True, exist_ok=True)
    with b.factory() as conn:
        load(conn, b.args.rows)
        exported = duck_lake.export_source(conn, folder)
    spec = spec_from_mapping(duck_lake.spec(folder, shapes.URL_ENV))
    paired = _lake_pairs(b, spec, folder, lambda: duck_lake.naive(folder, days()), "stages.duckdb")
    safe, steps, naive_s = paired.ours, paired.detail, paired.naive
    read, rows = duck_lake.raw_read(folder, days())
    # The same progress marks as for PostgreSQL, named for what they hold on DuckDB.
    steps = dict(zip(("inspect, pin the source's version, count and check it",
                      "build A (written, fingerprinted and sealed) and B (hashed) in DuckDB",
                      "compare and store the plan",
                      "approve (stage A by its seals, the target it is given against, the change preview)",
                      "apply (per partition: the target, stage A by its seals, its file written and "
                      "fingerprinted by DuckDB, the lake commit, the committed files proved by their bytes)"), steps.values()))
    applied = list(steps.values())[-1]
    report.row("13a. whole safe backfill on DuckDB, Delta to Delta, vs naive", safe, naive_s, "s", "<= 3.0x",
               paired.ratio, paired.ratio <= 3.0)
    report.note(
        "duckdb",
        f"Figure 13a ({exported} source rows over {DAYS} partitions in a Delta table, engine duckdb): ours "
        f"{safe:.2f} s = {paired.ratio:.2f}x the naive way ({naive_s:.2f} s: per partition DuckDB's DISTINCT ON "
        f"over the Delta table and write_deltalake with a predicate; the {paired.spread()}). Of ours: " + "; ".join(
            f"{name} {seconds:.2f} s" for name, seconds in steps.items())
        + f". The raw read of the {rows} source rows of those partitions by DuckDB takes {read:.2f} s "
        f"({read / naive_s:.2f}x the naive way). Apply is {applied / naive_s:.2f}x the naive way on its own.",
    )
    # The source is written by one process, the backfill run by another that does nothing else.
    script, big = str(Path(__file__).with_name("duck_lake.py")), b.folder / "duck_memory"
    big.mkdir(parents=True, exist_ok=True)
    made = json.loads(subprocess.run([sys.executable, script, "prepare", "--folder", str(big), "--rows", "1500000"],
                                     capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    run = subprocess.run(
        [sys.executable, script, "memory", "--folder", str(big), "--memory-limit", "256MB"],
        capture_output=True, text=True, check=True, env={**os.environ, duck_lake.URL_ENV: b.url.reveal()},
    )
    found = json.loads(run.stdout.strip().splitlines()[-1])
    report.row("13b. one partition above memory_limit 256MB: peak RSS", found["peak_rss_mib"], None, "MiB",
               "completes", None, found["status"] == "ready" and found["applied"] == ["verified"])
    report.note(
        "duckdb",
        f"Figure 13b (`.venv/bin/python benchmarks/duck_lake.py prepare --folder F --rows 1500000`, then "
        f"`BENCH_DUCK_URL=... .venv/bin/python benchmarks/duck_lake.py memory --folder F --memory-limit 256MB`): one "
        f"partition of {made['source_rows']:,} source rows ({made['partition_mib']:.0f} MiB in Arrow; "
        f"{found['rows']:,} after newest-wins) planned, approved and applied by a process of its own with DuckDB's "
        f"memory_limit at {found['memory_limit']}: plan {found['status']}, apply {', '.join(found['applied'])}, in "
        f"{found['seconds']:.1f} s; peak RSS {found['peak_rss_mib']:.0f} MiB ({found['rss_before_mib']:.0f} MiB "
        "after the imports; by step " + ", ".join(f"{k} {v:.0f}" for k, v in found["peak_rss_by_step_mib"].items())
        + " MiB). DuckDB spills its sorts and aggregates beyond the limit; the source and the Delta target's files "
        "are read and written by DuckDB, inside it.",
    )


def _lake_reset(b: Bench, spec: Spec | None, *paths: Path) -> None:
    """The state a lake figure's side starts from: ``paths`` (its target, its stages) gone and,
    for ours, the spec's control schema dropped."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    if spec is not None:
        with b.factory() as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(spec.control_schema)))


def _lake_pairs(b: Bench, spec: Spec, folder: Path, naive: Callable[[], float],
                stages: str) -> pairs.Paired[dict[str, float]]:
    """A lake figure's alternated pairs: the naive way into ``folder``/naive, ours (the safe
    backfill) into ``folder``/tgt with its stages at ``folder``/``stages``, each from nothing."""
    def naive_run() -> float:
        _lake_reset(b, None, folder / "naive")
        return naive()

    def ours() -> tuple[float, dict[str, float]]:
        _lake_reset(b, spec, folder / "tgt", folder / stages)
        safe, steps, _ = safe_backfill(spec, b.tool(spec))
        return safe, steps

    return pairs.alternated(b.args.pairs, naive_run, ours)


def figure_spark(b: Bench, report: Report) -> None:
    """Figure 14: the whole safe backfill on Spark local[2], Parquet to Parquet (the bench's
    source at --rows over 20 partitions, exported to a Hive-partitioned folder), against the
    naive way (Spark's newest-wins window and dynamic partition overwrite) and the raw read."""
    folder = b.folder / "spark"
    folder.mkdir(parents=True, exist_ok=True)
    with b.factory() as conn:
        load(conn, b.args.rows)
        exported = spark_lake.export_source(conn, folder)
    spark = spark_lake.session()  # started once, before any side: its start-up is nobody's
    spec = spec_from_mapping(spark_lake.spec(folder, shapes.URL_ENV))
    paired = _lake_pairs(b, spec, folder, lambda: spark_lake.naive(spark, folder), "staging")
    safe, steps, naive = paired.ours, paired.detail, paired.naive
    read, rows = spark_lake.raw_read(spark, folder)
    steps = dict(zip(("inspect, pin the folder's files (SHA-256), count and check them in Spark",
                      "build A and B in Spark (A written, read back, fingerprinted and sealed; B fingerprinted as "
                      "built)",
                      "compare and store the plan",
                      "approve (stage A by its seals, the target it is given against, the change preview)",
                      "apply (per partition: the target fingerprinted by Spark, stage A's files linked beside it and "
                      "proved by their bytes, swapped in, proved by their bytes again)"), steps.values()))
    report.row("14. whole safe backfill on Spark local[2], Parquet to Parquet, vs naive", safe, naive, "s",
               "<= 2.5x", paired.ratio, paired.ratio <= 2.5)
    report.note(
        "spark",
        f"Figure 14 ({exported} source rows over {DAYS} partitions in a Parquet folder, engine spark, local[2]): ours "
        f"{safe:.2f} s = {safe / naive:.2f}x the naive way ({naive:.2f} s: one Spark job, newest-wins by a window and "
        f"a dynamic partition overwrite; the {paired.spread()}). Of ours: " + "; ".join(f"{name} {seconds:.2f} s" for name, seconds in steps.items())
        + f". The raw read of the {rows} source rows by Spark takes {read:.2f} s ({read / naive:.2f}x the naive way).",
    )


def figure_lake_fingerprint(b: Bench, report: Report) -> None:
    """Figure 11: the canonical fingerprint of a 1M-row lake partition read back from a Delta
    table (benchmarks/lake_fingerprint.py's partition), in rows per second, and the most Arrow
    memory it holds at 1M and 2M rows (flat: bounded by the partition's own columns)."""
    from deltalake import DeltaTable, write_deltalake

    from backfill_assets.core.fingerprint.arrow import arrow_readings
    rows, peaks, rate = 1_000_000, {}, 0.0
    with b.factory() as conn:
        conn.execute(lake_fingerprint.DROP)
        conn.execute(lake_fingerprint.DDL)
        columns = table_columns(conn, lake_fingerprint.REL)
        conn.execute(lake_fingerprint.DROP)
    for n in (rows, 2 * rows):
        path = b.folder / f"fp_delta_{n}"
        write_deltalake(str(path), lake_fingerprint.build_partition(n), partition_by=["p"])
        data = DeltaTable(str(path)).to_pyarrow_table()
        pool = pa.default_memory_pool()  # saved first: once set, the proxy is the default
        proxy = pa.proxy_memory_pool(pool)
        pa.set_memory_pool(proxy)
        try:
            seconds = best(lambda: timed(lambda: arrow_readings(
                data, columns, lake_fingerprint.KEY, lake_fingerprint.TOTAL))[0])
        finally:
            pa.set_memory_pool(pool)
        peaks[n] = (proxy.max_memory() / 2**20, data.nbytes / 2**20)
        if n == rows:
            rate = n / seconds
    report.row("11. fingerprint of a 1M-row Delta partition from Arrow (rows/s)", rate / 1000, None, "k/s",
               ">= 300k/s", None, rate >= 300_000)
    report.note("lake", "Figure 11 (`arrow_readings` over benchmarks/lake_fingerprint.py's partition, read back from "
                "Delta): most Arrow memory held while fingerprinting " + "; ".join(
                    f"{n:,} rows: {peak:.0f} MiB for a {size:.0f} MiB table" for n, (peak, size) in peaks.items())
                + ". The time of `.venv/bin/python benchmarks/lake_fingerprint.py` splits it further.")


_DIFF_ROWS = 1_000_000
_DIFF_SETUP = (
    sql.SQL("DROP TABLE IF EXISTS bench.diff_src, bench.diff_tgt"),
    sql.SQL("CREATE TABLE bench.diff_src (d date, k bigint, updated_at timestamptz, seq bigint, "
            "amount numeric(12,2), status text, note text)"),
    sql.SQL("INSERT INTO bench.diff_src (d, k, updated_at, seq, amount, status, note) SELECT date '2024-01-01', g, "
            "timestamptz '2024-01-01' + g * interval '1 second', g, (g % 100000) / 100.0, 'status ' || (g % 7), "
            "'note ' || md5(g::text) FROM generate_series(1, {rows}) AS g"),
    sql.SQL("CREATE UNIQUE INDEX ON bench.diff_src (d, k)"),
    sql.SQL("CREATE TABLE bench.diff_tgt (LIKE bench.diff_src INCLUDING ALL)"),
    sql.SQL("INSERT INTO bench.diff_tgt (d, k, updated_at, seq, amount, status, note) "
            "SELECT d, k, updated_at, seq, amount, status, note FROM bench.diff_src"),
    # Five differences: a changed text, a changed amount, a NULL for an empty string's place,
    # a key only in the first, a key only in the second.
    sql.SQL("UPDATE bench.diff_tgt SET note = note || '!' WHERE k = 10"),
    sql.SQL("UPDATE bench.diff_tgt SET amount = amount + 0.01 WHERE k = 500000"),
    sql.SQL("UPDATE bench.diff_tgt SET status = NULL WHERE k = 777777"),
    sql.SQL("DELETE FROM bench.diff_tgt WHERE k = 20"),
    sql.SQL("INSERT INTO bench.diff_tgt (d, k, updated_at, seq, amount, status, note) "
            "VALUES ('2024-01-01', {extra}, '2024-01-01', 0, 0, 'extra', 'extra')"),
    sql.SQL("ANALYZE bench.diff_src"), sql.SQL("ANALYZE bench.diff_tgt"),
)


def figure_diff(b: Bench, report: Report) -> None:
    """Figure 12: the diff of a 1M-row partition pair with five differences (core.diff, as
    `backfill-assets diff` runs it) against one fingerprint of that partition."""
    from backfill_assets.core.engines.postgres.diff import diff_partition
    from backfill_assets.core.engines.postgres.resolve import resolve
    spec = spec_from_mapping({
        **SPEC, "name": "bench_diff", "source": {"table": "bench.diff_src", "snapshot": "copy"},
        "target": {"table": "bench.diff_tgt"}, "partitions": None,
    })
    with b.tool(spec)() as conn:  # the tool's limits and work_mem, for both figures
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS bench"))
        for statement in _DIFF_SETUP:
            conn.execute(statement.format(rows=sql.Literal(_DIFF_ROWS), extra=sql.Literal(_DIFF_ROWS + 1)))
        ctx = resolve(conn, spec, ["2024-01-01"])
        src = TableRef("bench", "diff_src")
        day = ctx.value_of("2024-01-01")

        def fingerprint() -> float:
            with repeatable_read(conn, read_only=True):
                return timed(lambda: fingerprint_partition(conn, src, ctx.target_columns, "d", ["k"], "amount", day,
                                                           key_unique=True, utf8=True))[0]

        def diff() -> float:
            with repeatable_read(conn, read_only=True):
                seconds, found = timed(lambda: diff_partition(conn, ctx, src, TableRef("bench", "diff_tgt"),
                                                              "2024-01-01", 10))
            assert (found.added, found.removed, found.changed) == (1, 1, 3), found
            return seconds

        t_fp, t_diff = best(fingerprint), best(diff)
        Path("/proc/self/clear_refs").write_text("5")
        before = lake_fingerprint._rss_kb("VmRSS")
        diff()
        grew = (lake_fingerprint._rss_kb("VmHWM") - before) / 1024
        conn.execute(sql.SQL("DROP TABLE bench.diff_src, bench.diff_tgt"))
    report.row("12. diff of a 1M-row partition pair (5 differences) vs one fingerprint of it", t_diff, t_fp, "s",
               "<= 2x", t_diff / t_fp, t_diff / t_fp <= 2)
    report.note("diff", f"Figure 12: `diff` found exactly the 5 planted differences in {t_diff:.2f} s against "
                f"{t_fp:.2f} s for one fingerprint of the partition (best of 3 each); the join runs in the server "
                f"(one pass over each side, materialized once), and the process grew by {grew:.1f} MiB while "
                "it ran (only the counts and 10 example keys come back).")


def server_header(conn: psycopg.Connection, what: str = "pgserver") -> list[str]:
    """The server and how its settings compare with PostgreSQL's built-in defaults."""
    version = conn.execute(sql.SQL("SELECT current_setting('server_version')")).fetchone()[0]
    shown, changed = shapes.server_settings(conn)
    verdict = ("all at PostgreSQL's built-in defaults" if not changed else "changed: " + "; ".join(changed))
    return [f"Server: PostgreSQL {version} ({what}, on a Unix socket). {', '.join(shown)}: {verdict}."]


ANALYSIS = "## Reading the figures"


def write_report(path: Path, args, only: set[str], report: Report, elapsed: float) -> None:
    everything = only >= set(GROUPS) - {"sensor"}
    command = ("`make bench` (= `.venv/bin/python benchmarks/bench.py`)" if everything else
               f"`.venv/bin/python benchmarks/bench.py --only {','.join(sorted(only))}`")
    lines = [
        "# Benchmarks", "",
        f"Produced by {command} in {elapsed / 60:.1f} min, on "
        f"{platform.machine()} with {os.cpu_count()} cores, Python {platform.python_version()}, "
        "the embedded PostgreSQL 16 (pgserver)" + (
            "; the rows tagged -pg<major> again on the machine's own PostgreSQL, started by the benchmark "
            "with initdb's defaults" if "pgdefault" in only else "")
        + ". Every ratio compares two measurements taken in the same run; figures 3, 7a-c, 7c+batch, 13a "
        f"and 14 are each the median of {args.pairs} alternated pairs (benchmarks/pairs.py), their seconds those "
        "of the median pair; on this machine differences under ~30% are noise.", "",
        *report.header, "",
        f"Source: {args.rows} rows over {DAYS} daily partitions, about 20% duplicate keys, ties "
        "broken by the tiebreak, a few NULL keys, unicode and control characters. Figures 7 and 9 "
        "add two shapes (benchmarks/shapes.py): 650k wide rows over 6 days, half of them copies "
        "or other versions, and 365 daily partitions of ~1k rows; figure 16, New York's 8,760 hours of 2023 as "
        "time windows of a time stamp.", "",
        "| figure | ours | reference | ratio | target | met? |", "|---|---:|---:|---:|---|---|",
    ]
    order = {key: n for n, key in enumerate(FIGURES)}
    for key in sorted(report.rows, key=lambda k: order.get(k, len(order))):
        figure, ours, ref, ratio, target, met = report.rows[key]
        if ratio is None:
            shown = "-"
        elif target == "completes":
            shown = f"{ratio:.0f} verified"
        else:
            shown = f"{ratio:.2f}"
        verdict = "-" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {figure} | {ours} | {ref} | {shown} | {target} | {verdict} |")
    lines.append("")
    for section in [*SECTIONS, *(s for s in report.notes if s not in SECTIONS)]:  # then the other server's
        if section in report.notes:
            lines += [*report.notes[section], ""]
    # The hand-written analysis below the table survives a new run.
    kept = ""
    if path.exists() and ANALYSIS in path.read_text(encoding="utf-8"):
        kept = ANALYSIS + path.read_text(encoding="utf-8").split(ANALYSIS, 1)[1]
    path.write_text("\n".join(lines) + ("\n" + kept if kept else ""), encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
