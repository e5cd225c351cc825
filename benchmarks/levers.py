"""Three of issue 25's levers, each measured against what the tool does now, on the bench's shape.

    .venv/bin/python benchmarks/levers.py [--rows 2000000] [--default-server]

On the embedded PostgreSQL (database ``levers``), or with ``--default-server`` on the
machine's own PostgreSQL started with initdb's defaults (as ``make bench`` does), with the settings the tool's sessions use
(work_mem 64MB, JIT off), over the bench's source copied as the snapshot is (an unlogged table
with an index on the partition key) and a stage as the tool makes one (unlogged, unique on the
grain), 20 daily partitions, each statement built by core.pg.sqlbuild:

1. the target's fingerprint before the commit: a parallel aggregate after the INSERT (now),
   against the INSERT's own rows hashed as it writes them (``INSERT ... RETURNING``);
2. stage B: written and hashed as written (now), against only hashed, never kept;
3. the tie check's first pass: a ``GROUP BY`` over the key and ordering columns (now), against
   a tie signal computed in build B's window (``lag`` over the ordering).

Each pair runs alternately, twice; the best of each is printed. BENCHMARKS.md quotes it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import shapes
from psycopg import sql

from backfill_assets.core.fingerprint.partition import fields, parallel_plan
from backfill_assets.core.pg import embedded, sqlbuild
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.vocabulary import TableRef

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from backfill_assets_tests.support.servers import default_settings_server  # noqa: E402

SPEC = shapes.CURRENT_SPEC
COLUMNS = SPEC["columns"]
ORDERING = [sqlbuild.OrderKey(o["column"], o["direction"]) for o in SPEC["ordering"]]
SNAP, STAGE_A, STAGE_B, TARGET = (TableRef("bench", n) for n in ("snap", "stage_a", "stage_b", "tgt"))
_SETUP = (
    "CREATE UNLOGGED TABLE bench.snap AS SELECT d, k, updated_at, seq, amount, status, note FROM bench.src",
    "CREATE INDEX ON bench.snap (d)",
    "CREATE UNLOGGED TABLE bench.stage_a (LIKE bench.tgt INCLUDING ALL)",
    "CREATE UNLOGGED TABLE bench.stage_b (LIKE bench.tgt INCLUDING ALL)",
    "INSERT INTO bench.stage_a (d, k, updated_at, seq, amount, status, note) SELECT DISTINCT ON (d, k) "
    "d, k, updated_at, seq, amount, status, note FROM bench.snap WHERE k IS NOT NULL ORDER BY d, k, updated_at DESC, seq DESC",
    "VACUUM ANALYZE bench.snap",
    "VACUUM ANALYZE bench.stage_a",
)
_INPUT = sql.SQL("SELECT {} FROM {} AS s").format(sql.SQL(", ").join(sql.Identifier("s", c) for c in COLUMNS),
                                                 sql.Identifier(SNAP.schema, SNAP.name))
# The window of build B with, for each row after a key's first, whether it ties with the row
# before it on every ordering column; counted over the whole input.
_TIE_SIGNAL = sql.SQL(
    "SELECT count(*) FILTER (WHERE x.tie) FROM (SELECT row_number() OVER w > 1 "
    "AND lag(s.updated_at) OVER w IS NOT DISTINCT FROM s.updated_at AND lag(s.seq) OVER w IS NOT DISTINCT FROM s.seq "
    "AS tie FROM bench.snap AS s WHERE s.k IS NOT NULL "
    "WINDOW w AS (PARTITION BY s.d, s.k ORDER BY s.updated_at DESC, s.seq DESC)) AS x"
)
_WINDOW_ALONE = sql.SQL(
    "SELECT count(*) FROM (SELECT row_number() OVER w AS rn FROM bench.snap AS s WHERE s.k IS NOT NULL "
    "WINDOW w AS (PARTITION BY s.d, s.k ORDER BY s.updated_at DESC, s.seq DESC)) AS x WHERE x.rn = 1"
)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@contextlib.contextmanager
def server(default: bool) -> Iterator[str]:
    """The URL of the database to measure in: the embedded server's, or a default-settings one's."""
    if not default:
        yield embedded.database_url("levers").reveal()
        return
    with tempfile.TemporaryDirectory(prefix="bench-levers-") as folder, \
            default_settings_server(Path(folder) / "server") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--default-server", action="store_true",
                        help="the machine's own PostgreSQL with initdb's defaults instead of the embedded one")
    args = parser.parse_args()
    with server(args.default_server) as url, psycopg.connect(url, autocommit=True) as conn:
        print(conn.execute(b"SELECT version()").fetchone()[0].split(" on ")[0])
        shape = shapes.current(args.rows)
        shapes.load(conn, shape)
        for statement in _SETUP:
            conn.execute(statement.encode())
        conn.execute(b"SET work_mem = '64MB'")
        conn.execute(b"SET jit = off")
        fl = fields(table_columns(conn, TARGET))
        days = [shapes.DAY0 + dt.timedelta(days=i) for i in range(shape.days)]
        rows = int(conn.execute(b"SELECT count(*) FROM bench.stage_a").fetchone()[0])
        per_partition = rows // len(days)

        def replace(returning: bool) -> None:
            conn.execute(b"TRUNCATE bench.tgt")
            conn.execute(b"CHECKPOINT")
            for day in days:
                with conn.transaction():
                    conn.execute(*sqlbuild.delete_partition(TARGET, "d", day))
                    insert = sqlbuild.insert_from_stage(TARGET, STAGE_A, COLUMNS, "d", [sqlbuild.OrderKey("k")], day)
                    if returning:
                        conn.execute(*sqlbuild.written_readings(insert, COLUMNS, fl, ["k"], "amount", utf8=True)).fetchone()
                    else:
                        conn.execute(*insert)
                        query, params = sqlbuild.partition_readings(TARGET, fl, "d", ["k"], "amount", [day], utf8=True)
                        with parallel_plan(conn, per_partition):
                            conn.execute(query, params).fetchall()

        def build_b(kept: bool) -> None:
            conn.execute(b"TRUNCATE bench.stage_b")
            conn.execute(b"CHECKPOINT")
            for day in days:
                with conn.transaction():
                    insert = sqlbuild.build_stage("b", STAGE_B, _INPUT, COLUMNS, "d", ["k"], ORDERING, {}, day)
                    if kept:
                        conn.execute(*sqlbuild.written_readings(insert, COLUMNS, fl, ["k"], "amount", utf8=True)).fetchone()
                    else:  # the same SELECT, hashed and thrown away
                        text = insert[0].as_string(conn)
                        select = sql.SQL("({})").format(sql.SQL(text[text.index("SELECT"):]))
                        query, _ = sqlbuild.digest(select, fl, sql.SQL("true"), {}, utf8=True, business_key=["k"],
                                                   total="amount")
                        conn.execute(query, insert[1]).fetchone()

        tied = sqlbuild.any_tied_group(_INPUT, "d", ["k"], ["updated_at", "seq"], {})[0]
        pairs = [
            ("1. the target's fingerprint before the commit (INSERT of each partition, then its readings)",
             ("a parallel aggregate after the INSERT (now)", lambda: replace(False)),
             ("hashed by the INSERT as it writes (RETURNING)", lambda: replace(True))),
            ("2. stage B, built per partition from the snapshot",
             ("written and hashed as written (now)", lambda: build_b(True)),
             ("hashed only, never kept", lambda: build_b(False))),
            ("3. the tie check's first pass over the snapshot",
             ("GROUP BY the key and ordering columns (now)", lambda: conn.execute(tied).fetchall()),
             ("the window of build B with a tie signal (lag); the window alone below",
              lambda: conn.execute(_TIE_SIGNAL).fetchall())),
        ]
        print(f"{args.rows} source rows, {rows} stage rows over {len(days)} partitions; best of 2, alternated")
        for title, (now_name, now), (other_name, other) in pairs:
            times = {now_name: [], other_name: []}
            for _ in range(2):
                times[now_name].append(timed(now))
                times[other_name].append(timed(other))
            best_now, best_other = min(times[now_name]), min(times[other_name])
            print(title)
            print(f"   {now_name}: {best_now:.2f} s")
            print(f"   {other_name}: {best_other:.2f} s = {best_other / best_now:.2f}x")
        print(f"   the window alone: {min(timed(lambda: conn.execute(_WINDOW_ALONE).fetchall()) for _ in range(2)):.2f} s")


if __name__ == "__main__":
    main()
