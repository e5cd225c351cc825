"""The source sensor's tick over snapshotted partitions, timed, against the old full check.

    .venv/bin/python benchmarks/sensor_tick.py [--days 365] [--rows-per-day 5000]

For ``benchmarks/bench.py``: :func:`tick_seconds` times one tick of ``source_snapshot_sensor``'s
work (``core.engines.postgres.watch.watch_tick``, connection included) over a spec's snapshotted,
unchanged partitions, and :func:`full_check_seconds` the old sensor's work on the same data
(``core.engines.postgres.snapshot.source_changes``: every snapshotted partition fingerprinted). Run alone, it
loads ``--days`` daily partitions into the embedded PostgreSQL (database ``bench_sensor``),
snapshots them all, and prints both, then a tick after an INSERT and after a DELETE.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import time

from psycopg import sql

from backfill_assets.core.engines.postgres.snapshot import source_changes
from backfill_assets.core.engines.postgres.watch import Tick, WatchState, watch_tick
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import ConnectionFactory, connection_factory
from backfill_assets.core.plan import snapshot_step
from backfill_assets.core.spec import Spec, spec_from_mapping
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, PartitionRequest

SETTLE_S = 60.0


def _tick(factory: ConnectionFactory, spec: Spec, state: WatchState | None) -> tuple[float, Tick]:
    start = time.perf_counter()
    with factory() as conn:
        tick = watch_tick(conn, spec, state)
    return time.perf_counter() - start, tick


def settled_state(factory: ConnectionFactory, spec: Spec, deadline_s: float = SETTLE_S) -> WatchState:
    """The state after a first tick (every snapshotted partition fingerprinted, as any first
    tick does) and as many more as it takes for one to find the table quiet: writes made
    just before (the load, the snapshot's own bookkeeping) reach the counters within seconds.

    Raises:
        RuntimeError: the source kept moving for ``deadline_s`` seconds.
    """
    _, tick = _tick(factory, spec, None)
    deadline = time.monotonic() + deadline_s
    while True:
        _, tick = _tick(factory, spec, tick.state)
        if tick.mode == "quiet" and not tick.pending:
            return tick.state
        if time.monotonic() > deadline:
            raise RuntimeError(f"the source of {spec.name} did not stop moving: {tick.summary()}")
        time.sleep(0.5)


def tick_seconds(factory: ConnectionFactory, spec: Spec, *, repeat: int = 5) -> float:
    """Seconds of one source-sensor tick over the spec's snapshotted, unchanged partitions
    (the median of ``repeat`` ticks, each opening its connection as the sensor does).

    Needs the partitions snapshotted and the source left alone meanwhile; the untimed
    baseline (see :func:`settled_state`) reads every partition in full once.

    Raises:
        RuntimeError: a timed tick found the table moving (something writes to the source).
    """
    state = settled_state(factory, spec)
    times = []
    for _ in range(repeat):
        seconds, tick = _tick(factory, spec, state)
        if tick.mode != "quiet":
            raise RuntimeError(f"the source of {spec.name} moved during the measurement: {tick.summary()}")
        times.append(seconds)
    return statistics.median(times)


def full_check_seconds(factory: ConnectionFactory, spec: Spec) -> float:
    """Seconds of the old sensor's tick on the same data: every snapshotted partition of the
    source fingerprinted and compared with its newest snapshot."""
    start = time.perf_counter()
    with factory() as conn:
        source_changes(conn, spec)
    return time.perf_counter() - start


# --- run alone ---------------------------------------------------------------------------

_DDL = (
    "DROP SCHEMA IF EXISTS sensor_bench CASCADE",
    "DROP SCHEMA IF EXISTS backfill_control CASCADE",
    "CREATE SCHEMA sensor_bench",
    "CREATE TABLE sensor_bench.src (d date NOT NULL, k bigint, seq bigint NOT NULL, amount numeric(12,2), note text)",
    ("CREATE TABLE sensor_bench.tgt (d date NOT NULL, k bigint NOT NULL, seq bigint, amount numeric(12,2), "
     "note text, UNIQUE (d, k))"),
)
_GENERATE = sql.SQL(
    "INSERT INTO sensor_bench.src (d, k, seq, amount, note) "
    "SELECT date '2024-01-01' + i, r, i::bigint * %(per_day)s + r, ((r * 37) %% 100000) / 100.0, 'note ' || r "
    "FROM generate_series(0, %(days)s - 1) AS i, generate_series(0, %(per_day)s - 1) AS r"
)
_INDEX = "CREATE INDEX src_d_seq ON sensor_bench.src (d, seq)"
_INSERT_ONE = ("INSERT INTO sensor_bench.src (d, k, seq, amount, note) "
               "SELECT date '2024-04-10', -1, max(seq) + 1, 1.00, 'late' FROM sensor_bench.src")
_DELETE_ONE = "DELETE FROM sensor_bench.src WHERE d = date '2024-07-01' AND k = 7"


def spec_for(days: int, change_column: str | None) -> Spec:
    source = {"table": "sensor_bench.src", "snapshot": "immutable"}
    if change_column:
        source["change_column"] = change_column
    return spec_from_mapping({
        "name": "sensor_bench", "database_url_env": "BENCH_URL", "source": source,
        "target": {"table": "sensor_bench.tgt"}, "partition_key": "d", "business_key": ["k"],
        "ordering": [{"column": "seq", "direction": "desc"}], "columns": ["d", "k", "seq", "amount", "note"],
        "transform_version": "bench", "partitions": {"type": "daily", "start": "2024-01-01"},
    })


def _write(factory: ConnectionFactory, statement: str) -> None:
    with factory() as conn:
        conn.execute(statement.encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--rows-per-day", type=int, default=5000)
    args = parser.parse_args()
    factory = connection_factory(embedded.database_url("bench_sensor"), DEFAULT_LIMITS, application_name="backfill_assets:bench")
    with factory() as conn:
        for statement in _DDL:
            conn.execute(statement.encode())
        conn.execute(_GENERATE, {"per_day": args.rows_per_day, "days": args.days})
        conn.execute(_INDEX.encode())
        conn.execute(b"VACUUM (ANALYZE) sensor_bench.src")
    watching, plain = spec_for(args.days, "seq"), spec_for(args.days, None)
    first, last = dt.date(2024, 1, 1), dt.date(2024, 1, 1) + dt.timedelta(days=args.days - 1)
    t0 = time.perf_counter()
    snapshot_step(plain, PartitionRequest(f"{first.isoformat()}..{last.isoformat()}"), factory)
    rows = args.days * args.rows_per_day
    print(f"{args.days} partitions, {rows} rows, snapshotted in {time.perf_counter() - t0:.1f} s", flush=True)

    new = tick_seconds(factory, watching)
    new_plain = tick_seconds(factory, plain)
    old = min(full_check_seconds(factory, plain) for _ in range(3))
    print(f"unchanged tick, new sensor (change_column declared): {new * 1000:8.1f} ms")
    print(f"unchanged tick, new sensor (no change_column):       {new_plain * 1000:8.1f} ms")
    print(f"unchanged tick, old sensor (fingerprint everything): {old * 1000:8.1f} ms  ({old / new:.0f}x)")

    state = settled_state(factory, watching)
    for what, statement in (("an INSERT into one partition", _INSERT_ONE), ("a DELETE in one partition", _DELETE_ONE)):
        _write(factory, statement)  # its counters are published when its backend exits
        deadline = time.monotonic() + SETTLE_S
        while True:
            seconds, tick = _tick(factory, watching, state)
            state = tick.state
            if tick.mode != "quiet" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        print(f"tick after {what}: {seconds * 1000:8.1f} ms  ({tick.summary()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
