"""Where the server's time goes in one shape's backfill, and the floor it sets.

    .venv/bin/python benchmarks/floor.py current|wide|small [exported|copy]

Runs the shape's naive backfill, then plan, approve and apply as processes (benchmarks/
shapes.py) on the embedded PostgreSQL with every statement logged (database ``floor``, its
log in ``$BACKFILL_ASSETS_HOME/pgdata/log``), and splits the server's time by what each
statement is for. The floor adds the passes the process requires (snapshot copy and hash, the
source checks, both builds with their fingerprints run at once, the approval's change preview,
the replace, the target's fingerprints), in server time only, against the naive way. With
``snapshot: exported`` (the shapes' default) nothing is copied and the source's hash starts
when the first build ends, beside the other: it counts with the shorter build. BENCHMARKS.md
quotes its output.
"""
import collections
import dataclasses
import re
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import shapes

from backfill_assets.core.pg import embedded

if len(sys.argv) not in (2, 3) or sys.argv[1] not in ("current", "wide", "small") or sys.argv[2:] not in ([], ["exported"], ["copy"]):
    sys.exit(__doc__.split("\n\n")[1])
which = sys.argv[1]
shape = {"current": lambda: shapes.current(2_000_000), "wide": shapes.wide, "small": shapes.small}[which]()
if sys.argv[2:]:  # the source's snapshot mode (default: the spec's default, exported)
    shape = dataclasses.replace(shape, spec={**shape.spec, "source": {**shape.spec["source"], "snapshot": sys.argv[2]}})
url = embedded.database_url("floor")
LOG = embedded.home() / "pgdata" / "log"
with psycopg.connect(url.reveal(), autocommit=True) as conn:
    shapes.load(conn, shape)
    shapes.reset(conn, shape)
    t = time.perf_counter()
    shapes.naive_backfill(conn, shape)
    naive = time.perf_counter() - t
    shapes.reset(conn, shape)
    conn.execute(b"ALTER DATABASE floor SET log_min_duration_statement = 0")
start = len(LOG.read_text(errors="replace").split("\n"))
with tempfile.TemporaryDirectory(prefix="bench-floor-") as folder:
    run = shapes.run_cli(shape, url.reveal(), Path(folder))
with psycopg.connect(url.reveal(), autocommit=True) as conn:
    conn.execute(b"ALTER DATABASE floor RESET log_min_duration_statement")
lines = LOG.read_text(errors="replace").split("\n")[start:]
# Each statement goes to the first pass whose pattern it matches (format 3: a stage build
# hashes its rows in the INSERT that writes them; every other fingerprint is one aggregate).
cats = [
    ("snapshot: copy + index", r"INSERT INTO \S+\.\"snap_new_|CREATE INDEX ON \S+\.\"snap_new_"),
    ("snapshot: hash", r"__backfill_bits.*(\"snap_|\"src\" AS t)"),
    ("build A, hashed as written", r"INSERT INTO \S+__stage_a\""),
    ("build B, hashed as written", r"INSERT INTO \S+__stage_b\"|WITH \"__backfill_written\" AS \(SELECT"),
    ("source checks (ties, NULLs, report)", r"FROM \(SELECT .*(\"snap_|\"src\")|SELECT \"g\"|SELECT 1 FROM \(|count\(\*\) FILTER \(WHERE \"i\""),
    ("stage A fingerprints", r"__backfill_bits.*__stage_a\" AS t"),
    ("stage B fingerprints", r"__backfill_bits.*__stage_b\" AS t"),
    ("seal checks", r"xmin IS DISTINCT"),
    ("change preview (approve)", r"WITH j AS MATERIALIZED|SELECT coalesce\(a\.__pk"),
    ("target: delete + insert", r"(DELETE FROM|INSERT INTO) \"[a-z_]+\"\.\"tgt\""),
    ("target fingerprints", r"__backfill_bits.*\"tgt\" AS t"),
    ("commits", r"^COMMIT"),
]
agg: collections.Counter = collections.Counter()
cnt: collections.Counter = collections.Counter()
total, n = 0.0, 0
for line in lines:
    m = re.search(r"duration: ([\d.]+) ms\s+(?:statement|execute [^:]*): (.*)", line)
    if not m:
        continue
    ms, text = float(m.group(1)), m.group(2)
    total += ms
    n += 1
    name = next((name for name, pat in cats if re.search(pat, text)), "everything else")
    agg[name] += ms
    cnt[name] += 1
wall = run.seconds
print(f"{which}: naive {naive:.2f} s; ours (3 processes) {wall:.2f} s = {wall/naive:.2f}x; "
      f"{n} statements, server time {total/1000:.2f} s")
for name, _ in cats + [("everything else", "")]:
    print(f"   {name:38s} {agg[name]/1000:6.2f} s  {cnt[name]:6d} statements")


def s(k: str) -> float:
    return agg[k] / 1000


copied = agg["snapshot: copy + index"] > 0  # else exported: the source's hash follows the shorter build
builds = sorted([s("build A, hashed as written") + s("stage A fingerprints"),
                 s("build B, hashed as written") + s("stage B fingerprints")])
at_once = max(builds[1], builds[0] + (0 if copied else s("snapshot: hash")))
floor_par = (s("snapshot: copy + index") + (s("snapshot: hash") if copied else 0) + s("source checks (ties, NULLs, report)")
             + at_once + s("change preview (approve)") + s("target: delete + insert") + s("target fingerprints"))
print(f"   floor (the passes required, builds at once, server time only): {floor_par:.2f} s = {floor_par/naive:.2f}x naive")
top = max((name for name, _ in cats), key=lambda name: agg[name])
print(f"   the pass at the top: {top}, {s(top):.2f} s = {s(top) / naive:.2f}x the naive way on its own")
