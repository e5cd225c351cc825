"""Figure 10 of benchmarks/bench.py: the safe backfill into a Delta and an Iceberg table, side by
side with the naive way and the raw read of the same partitions.

- ours: plan (snapshot, two builds, compare), approve and apply into the lake table, as
  bench.safe_backfill runs it for PostgreSQL; apply creates the table.
- naive: per partition, the newest-wins rows read from the source (DISTINCT ON, as CSV into
  Arrow) and written with the lake's own partition overwrite (``write_deltalake(mode="overwrite",
  predicate=...)``, pyiceberg ``overwrite(overwrite_filter=...)``); no snapshot, no second
  build, no fingerprint, no verification.
- raw read: reading those partitions back from the lake table into Arrow, the limit of any
  check that reads what was written.
"""

from __future__ import annotations

import io
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as pads
import shapes  # benchmarks/shapes.py
from psycopg import sql

SCHEMA = pa.schema([
    ("d", pa.date32()), ("k", pa.int64()), ("updated_at", pa.timestamp("us", tz="UTC")), ("seq", pa.int64()),
    ("amount", pa.decimal128(12, 2)), ("status", pa.string()), ("note", pa.string()),
])
_NEWEST = sql.SQL(
    "COPY (SELECT DISTINCT ON (s.k) s.d, s.k, s.updated_at, s.seq, s.amount, s.status, s.note "
    "FROM bench.src AS s WHERE s.d = {day} AND s.k IS NOT NULL ORDER BY s.k, s.updated_at DESC, s.seq DESC) "
    "TO STDOUT (FORMAT csv)"
)


def spec(fmt: str, folder: Path) -> dict[str, Any]:
    """The bench's spec (shapes.CURRENT_SPEC) with a lake target in ``folder``."""
    target: dict[str, Any] = (
        {"format": "delta", "location": str(folder / "delta_tgt")} if fmt == "delta"
        else {"format": "iceberg", "table": "bench.tgt_lake",
              "catalog": {"type": "sql", "warehouse": str(folder / "warehouse")}}
    )
    return {**shapes.CURRENT_SPEC, "name": f"bench_{fmt}", "target": target}


def _read_csv(data: bytes) -> pa.Table:
    return pcsv.read_csv(
        io.BytesIO(data),
        read_options=pcsv.ReadOptions(column_names=SCHEMA.names),
        parse_options=pcsv.ParseOptions(newlines_in_values=True),
        convert_options=pcsv.ConvertOptions(column_types=SCHEMA, null_values=[""], strings_can_be_null=True,
                                            quoted_strings_can_be_null=False),
    )


def naive(conn: psycopg.Connection, fmt: str, folder: Path, days: list, catalog: Any = None) -> float:
    """The naive way into a new lake table over ``days``. Seconds."""
    shapes.server_defaults(conn)
    start = time.perf_counter()
    if fmt == "delta":
        from deltalake import write_deltalake
        path = str(folder / "delta_naive")
    else:
        from pyiceberg.expressions import EqualTo
        catalog.create_namespace_if_not_exists("bench")
        table = catalog.create_table("bench.naive", schema=SCHEMA)
        with table.update_spec() as update:
            update.add_identity("d")
    for day in days:
        with conn.cursor() as cur, cur.copy(_NEWEST.format(day=sql.Literal(day))) as copy:
            data = _read_csv(b"".join(bytes(chunk) for chunk in copy))
        if fmt == "delta":
            write_deltalake(path, data, mode="overwrite", predicate=f"d = '{day.isoformat()}'", partition_by=["d"])
        else:
            with warnings.catch_warnings():  # the first write of a partition deletes nothing
                warnings.simplefilter("ignore", UserWarning)
                table.overwrite(data, overwrite_filter=EqualTo("d", day.isoformat()))
    return time.perf_counter() - start


def raw_read(fmt: str, folder: Path, days: list, catalog: Any = None) -> tuple[float, int]:
    """Read every partition of the naive table back into Arrow. (seconds, rows)"""
    start, rows = time.perf_counter(), 0
    if fmt == "delta":
        from deltalake import DeltaTable
        dataset = DeltaTable(str(folder / "delta_naive")).to_pyarrow_dataset()
        for day in days:
            rows += dataset.to_table(filter=pads.field("d") == day).num_rows
    else:
        from pyiceberg.expressions import EqualTo
        table = catalog.load_table("bench.naive")
        for day in days:
            rows += table.scan(row_filter=EqualTo("d", day.isoformat())).to_arrow().num_rows
    return time.perf_counter() - start, rows


def catalog_for(conn: psycopg.Connection, folder: Path) -> Any:
    """A pyiceberg SQL catalog in the bench's database, for the naive Iceberg table."""
    from pyiceberg.catalog.sql import SqlCatalog

    from backfill_assets.core.lake.iceberg_catalog import catalog_url
    from backfill_assets.core.spec import spec_from_mapping
    (folder / "warehouse").mkdir(parents=True, exist_ok=True)
    # The catalog the spec's own table is in (its name), so that both tables are dropped.
    iceberg = spec_from_mapping(spec("iceberg", folder))
    assert iceberg.target.catalog is not None
    return SqlCatalog(iceberg.target.catalog.name, uri=catalog_url(conn, iceberg),
                      warehouse=f"file://{folder / 'warehouse'}")


def drop_iceberg(catalog: Any) -> None:
    for name in ("bench.naive", "bench.tgt_lake"):
        try:
            catalog.drop_table(name)
        except Exception:  # noqa: BLE001 - absent is fine
            pass


__all__ = ["SCHEMA", "catalog_for", "drop_iceberg", "naive", "raw_read", "spec", "shapes"]
