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
_I = sql.Identifier


def _cols(alias: str | None = None) -> sql.Composed:
    return sql.SQL(", ").join(_I(alias, c) if alias else _I(c) for c in COLUMNS)


_NAMES = {"snap": _I(SNAP.schema, SNAP.name), "src": _I("bench", "src"), "tgt": _I(TARGET.schema, TARGET.name),
          "stage_a": _I(STAGE_A.schema, STAGE_A.name), "stage_b": _I(STAGE_B.schema, STAGE_B.name),
          "cols": _cols(), "s_cols": _cols("s"), "d": _I("d"), "k": _I("k"), "s_d": _I("s", "d"), "s_k": _I("s", "k"),
          "s_upd": _I("s", "updated_at"), "s_seq": _I("s", "seq")}
_SETUP = tuple(sql.SQL(text).format(**_NAMES) for text in (
    "CREATE UNLOGGED TABLE {snap} AS SELECT {cols} FROM {src}",
    "CREATE INDEX ON {snap} ({d})",
    "CREATE UNLOGGED TABLE {stage_a} (LIKE {tgt} INCLUDING ALL)",
    "CREATE UNLOGGED TABLE {stage_b} (LIKE {tgt} INCLUDING ALL)",
    "INSERT INTO {stage_a} ({cols}) SELECT DISTINCT ON ({s_d}, {s_k}) {s_cols} FROM {snap} AS s "
    "WHERE {s_k} IS NOT NULL ORDER BY {s_d}, {s_k}, {s_upd} DESC, {s_seq} DESC",
    "VACUUM ANALYZE {snap}",
    "VACUUM ANALYZE {stage_a}",
))
_INPUT = sql.SQL("SELECT {s_cols} FROM {snap} AS s").format(**_NAMES)
_WINDOW = sql.SQL("WINDOW w AS (PARTITION BY {s_d}, {s_k} ORDER BY {s_upd} DESC, {s_seq} DESC)").format(**_NAMES)
# Build B's SELECT for one partition (core.pg.sqlbuild.builds' window build, without its INSERT).
_BUILD_B_SELECT = sql.SQL(
    "SELECT {r_cols} FROM (SELECT {s_cols}, row_number() OVER w AS rn FROM {snap} AS s "
    "WHERE {s_d} = %(partition)s AND {s_k} IS NOT NULL {window}) AS r WHERE r.rn = 1"
).format(r_cols=_cols("r"), window=_WINDOW, **_NAMES)
# The window of build B with, for each row after a key's first, whether it ties with the row
# before it on every ordering column; counted over the whole input.
_TIE_SIGNAL = sql.SQL(
    "SELECT count(*) FILTER (WHERE x.tie) FROM (SELECT row_number() OVER w > 1 "
    "AND lag({s_upd}) OVER w IS NOT DISTINCT FROM {s_upd} AND lag({s_seq}) OVER w IS NOT DISTINCT FROM {s_seq} "
    "AS tie FROM {snap} AS s WHERE {s_k} IS NOT NULL {window}) AS x"
).format(window=_WINDOW, **_NAMES)
_WINDOW_ALONE = sql.SQL(
    "SELECT count(*) FROM (SELECT row_number() OVER w AS rn FROM {snap} AS s WHERE {s_k} IS NOT NULL {window}) AS x "
    "WHERE x.rn = 1"
).format(window=_WINDOW, **_NAMES)


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
            conn.execute(statement)
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
                        query, _ = sqlbuild.digest(sql.SQL("({})").format(_BUILD_B_SELECT), fl, sql.SQL("true"), {},
                                                   utf8=True, business_key=["k"], total="amount")
                        conn.execute(query, {"partition": day}).fetchone()

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
