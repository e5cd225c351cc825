"""Figure 12 on the DuckDB and Spark engines: ``diff`` of a partition pair with five planted
differences (a changed text, a changed amount, a NULL in place of a value, a key removed, a key
added) against one fingerprint of that partition, on each engine, side by side in one run.

- DuckDB: both sides DuckDB tables (the engine's stage and a target read into DuckDB);
  the diff is core.comparison.diff, the fingerprint the stage readings (core.engines.duckdb.stages).
- Spark: both sides Parquet partitions as Spark writes them; the diff is the Spark engine's
  (core.engines.spark.compare: Spark jobs over both sides' files, then the first differing
  keys' rows compared in DuckDB), the fingerprint Spark's format-3 aggregate over the
  partition's files.

    .venv/bin/python benchmarks/diff_engines.py [--rows 1000000] [--no-spark]
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.comparison.diff import diff_relations
from backfill_assets.core.duck import connect
from backfill_assets.core.engines.duckdb.stages import readings_of

DAY = dt.date(2024, 1, 1)
COLUMNS = [ColumnInfo("d", "date", "D", False, "date"), ColumnInfo("k", "bigint", "N", False, "int8"),
           ColumnInfo("updated_at", "timestamp with time zone", "D", False, "timestamptz"),
           ColumnInfo("seq", "bigint", "N", False, "int8"),
           ColumnInfo("amount", "numeric(12,2)", "N", False, "numeric"),
           ColumnInfo("status", "text", "S", True, "text"), ColumnInfo("note", "text", "S", True, "text")]


def sides(rows: int) -> tuple[pa.Table, pa.Table]:
    """The partition, and the same with the five differences of figure 12."""
    k = pa.array(range(1, rows + 1), pa.int64())
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    src = pa.table({
        "d": pa.array([DAY] * rows, pa.date32()), "k": k,
        "updated_at": pc.add(pa.scalar(t0, pa.timestamp("us", tz="UTC")),
                             pc.cast(pc.multiply(k, 1_000_000), pa.duration("us"))),
        "seq": k, "amount": pa.array([decimal.Decimal(i % 100_000) / 100 for i in range(1, rows + 1)],
                                     pa.decimal128(12, 2)),
        "status": pc.if_else(pc.equal(pc.bit_wise_and(k, 1), 0), "open", "closed"),
        "note": pc.binary_join_element_wise("note ", pc.cast(k, pa.string()), ""),
    })
    rows_ = {name: src[name].to_pylist() for name in ("note", "amount", "status")}
    rows_["note"][9] += "!"
    rows_["amount"][499_999 % rows] += decimal.Decimal("0.01")
    rows_["status"][777_776 % rows] = None
    tgt = src.set_column(6, "note", pa.array(rows_["note"])).set_column(
        4, "amount", pa.array(rows_["amount"], pa.decimal128(12, 2))).set_column(5, "status", pa.array(rows_["status"]))
    tgt = tgt.filter(pc.not_equal(tgt["k"], 20))
    extra = tgt.slice(0, 1).set_column(1, "k", pa.array([rows + 1], pa.int64()))
    return src, pa.concat_tables([tgt, extra])


def best(run: Callable[[], Any], times: int = 3) -> float:
    found = []
    for _ in range(times):
        start = time.perf_counter()
        run()
        found.append(time.perf_counter() - start)
    return min(found)


def on_duckdb(src: pa.Table, tgt: pa.Table) -> tuple[float, float]:
    duck = connect()
    duck.register("s", src)
    duck.register("t", tgt)
    duck.execute("CREATE TABLE stage AS SELECT * FROM s")
    duck.execute("CREATE TABLE target AS SELECT * FROM t")

    def diff() -> None:
        found = diff_relations(duck, "stage", "target", COLUMNS, "d", ["k"], DAY.isoformat(), DAY, 10)
        assert (found.added, found.removed, found.changed) == (1, 1, 3), found

    return best(diff), best(lambda: readings_of(duck, "stage", COLUMNS, "d", ["k"], "amount", [DAY]))


def on_spark(src: pa.Table, tgt: pa.Table, folder: Path) -> tuple[float, float]:
    from pyspark.sql import SparkSession

    from backfill_assets.core.engines.spark import compare as spark_compare
    from backfill_assets.core.engines.spark import fingerprint as spark_fp
    for name, data in (("stage", src), ("target", tgt)):
        pads.write_dataset(data, folder / name, format="parquet", partitioning=["d"], partitioning_flavor="hive",
                           max_rows_per_file=250_000, max_rows_per_group=250_000)
    session = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC").getOrCreate())

    # What the engine's diff is given: each side's files of the partition, and the context's
    # columns and keys (a stand-in: the diff reads nothing else of it).
    ctx: Any = SimpleNamespace(spec=SimpleNamespace(partition_key="d", business_key=["k"], columns=[c.name for c in COLUMNS]),
                               target_columns=COLUMNS, value_of=lambda label: DAY)
    files = {name: {DAY.isoformat(): sorted(str(p) for p in (folder / name / f"d={DAY.isoformat()}").glob("*.parquet"))}
             for name in ("stage", "target")}

    def diff() -> None:  # as the Spark engine's diff: Spark jobs, then the first keys' rows in DuckDB
        found = spark_compare.diffs(session, ctx, files["stage"], files["target"], 10)[DAY.isoformat()]
        assert (found.added, found.removed, found.changed) == (1, 1, 3), found

    frame = session.read.parquet(str(folder / "stage"))
    try:
        return best(diff), best(lambda: spark_fp.readings(frame, COLUMNS, ["k"], "d", "amount"))
    finally:
        session.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--no-spark", action="store_true")
    args = parser.parse_args()
    src, tgt = sides(args.rows)
    found = {"duckdb": on_duckdb(src, tgt)}
    if not args.no_spark:
        with tempfile.TemporaryDirectory(prefix="diff-engines-") as folder:
            found["spark"] = on_spark(src, tgt, Path(folder))
    print(f"{'engine':<8} {'diff':>9} {'one fingerprint':>16} {'ratio':>7}   ({args.rows} rows, 5 differences, best of 3)")
    for engine, (diff, fingerprint) in found.items():
        print(f"{engine:<8} {diff:>8.2f}s {fingerprint:>15.2f}s {diff / fingerprint:>6.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
