"""The Parquet folder target's own cost per partition as the folder grows (no Spark, no rows to
speak of): per partition, the table opened, the partition read, replaced (written, switched in)
and read back, as apply does it, on folders of 73 and 365 one-file partitions.

    .venv/bin/python benchmarks/parquet_folder.py [--partitions 73,365] [--writes 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from backfill_assets.core.engines.spark.parquet import ParquetFolderTable, partition_dir


def per_partition_ms(partitions: int, writes: int) -> float:
    with tempfile.TemporaryDirectory(prefix="parquet-folder-") as folder:
        root = Path(folder) / "t"
        days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(partitions)]
        for day in days:
            (root / partition_dir("d", day)).mkdir(parents=True)
            pq.write_table(pa.table({"k": list(range(900))}), root / partition_dir("d", day) / "part-0.parquet")
        table = ParquetFolderTable(str(root), "d")
        start = time.perf_counter()
        for day in days[:writes]:
            handle = table.open()
            table.read(handle, "d", [day])
            version = table.overwrite(handle, "d", [day], pa.table({"k": list(range(900)), "d": [day] * 900}), {})
            table.read_version(version, "d", [day])
        return 1000 * (time.perf_counter() - start) / writes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="73,365")
    parser.add_argument("--writes", type=int, default=30)
    args = parser.parse_args()
    for n in (int(x) for x in args.partitions.split(",")):
        print(f"{n:>5} partitions: {per_partition_ms(n, args.writes):6.1f} ms per partition "
              "(open, read, replace, read back)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
