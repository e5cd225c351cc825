"""Lake sources of the DuckDB engine's tests: the demo's source rows with edge rows, written to a
Delta or an Iceberg table on disk, the DuckDB spec over them, and the answer computed
independently in Python."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from backfill_assets.cli import demo
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import make_spec

COLUMNS = ["order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note"]
SCHEMA = pa.schema([
    ("order_date", pa.date32()), ("order_id", pa.int64()), ("customer_id", pa.int64()),
    ("updated_at", pa.timestamp("us", tz="UTC")), ("ingest_seq", pa.int64()), ("amount", pa.decimal128(12, 2)),
    ("status", pa.string()), ("note", pa.string()),
])
DAYS = PartitionRequest("2024-01-01..2024-01-03")
LABELS = ["2024-01-01", "2024-01-02", "2024-01-03"]


def edge_rows() -> list[tuple]:
    """Rows the fingerprint must tell apart: NULLs, unicode, control characters, long text."""
    t = dt.datetime(2024, 1, 2, 12, 0, 0, 123456, tzinfo=dt.timezone.utc)
    return [
        (dt.date(2024, 1, 2), 900001, None, t, 1, None, "ünïcødé ✓", "tab\there|pipe~tilde"),
        (dt.date(2024, 1, 2), 900002, 7, t, 2, decimal.Decimal("-0.00"), "", "line\nbreak\x01ctl"),
        (dt.date(2024, 1, 2), 900003, 8, t, 3, decimal.Decimal("9999999999.99"), None, "x" * 5000),
    ]


def source_table(rows: list[tuple] | None = None) -> pa.Table:
    rows = demo.source_rows(orders_per_day=6, moved=False) + edge_rows() if rows is None else rows
    return pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=SCHEMA)


def load_postgres_source(conn: Any) -> None:
    """The same rows in the demo's PostgreSQL source table, public.orders_raw."""
    from backfill_assets.cli import demo
    demo.load(conn)
    conn.execute("TRUNCATE public.orders_raw")
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.orders_raw (order_date, order_id, customer_id, updated_at, ingest_seq, "
                        "amount, status, note) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", rows)
    conn.commit()


def write_delta(path: Path, data: pa.Table, mode: str = "overwrite") -> int:
    from deltalake import DeltaTable, write_deltalake
    write_deltalake(str(path), data, mode=mode, partition_by=["order_date"])
    return DeltaTable(str(path)).version()


def duck_spec(tmp_path: Path, source: dict[str, Any], target: str = "delta", **changes: Any):
    tgt: dict[str, Any] = (
        {"format": "delta", "location": str(tmp_path / "orders_daily")} if target == "delta"
        else {"format": "iceberg", "table": "sales.orders_daily",
              "catalog": {"type": "sql", "warehouse": str(tmp_path / "warehouse")}}
    )
    return make_spec(**{"engine": {"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
                        "source": source, "target": tgt, "records_can_move": False, **changes})


def newest(rows: list[tuple], day: dt.date) -> list[tuple]:
    best: dict[int, tuple] = {}
    for r in rows:
        if r[0] != day or r[1] is None:
            continue
        if r[1] not in best or (r[3], r[4]) > (best[r[1]][3], best[r[1]][4]):
            best[r[1]] = r
    return sorted(best.values(), key=lambda r: r[1])


REWRITES = ["a new file", "in place"]


def one_row_short(path: Path, how: str) -> None:
    """Rewrite a Parquet file with its first row left out, as another writer might: removed and
    written anew under its name (``"a new file"``), or written over (``"in place"``: a hard link
    to it sees the change)."""
    import pyarrow.parquet as pq
    rows = pq.read_table(path)
    if how == "a new file":
        path.unlink()
    pq.write_table(rows.slice(1), path)


def delta_rows(path: Path, day: dt.date) -> list[tuple]:
    from deltalake import DeltaTable
    data = DeltaTable(str(path)).to_pyarrow_table().select(COLUMNS).to_pylist()
    return sorted((tuple(r[c] for c in COLUMNS) for r in data if r["order_date"] == day), key=lambda r: r[1])



def delta_source(tmp_path: Path) -> dict[str, Any]:
    """The test's source rows in a Delta table; the spec's source mapping for it."""
    write_delta(tmp_path / "orders_raw", source_table())
    return {"format": "delta", "location": str(tmp_path / "orders_raw")}


class LakeSource:
    """A Delta table, an Iceberg table in a SQLite catalog named by a variable, or a
    Hive-partitioned Parquet folder, holding a test's source rows, which the test moves on as
    another writer would."""

    def __init__(self, fmt: str, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.fmt, self.folder = fmt, folder
        if fmt == "iceberg":
            from pyiceberg.catalog.sql import SqlCatalog
            uri = f"sqlite:///{folder}/source_catalog.db"
            monkeypatch.setenv("BFA_TEST_ICEBERG_SOURCE", uri)
            self.catalog = SqlCatalog("default", uri=uri, warehouse=f"file://{folder}/source_warehouse")
            self.catalog.create_namespace("raw")
            self.catalog.create_table("raw.orders_raw", schema=SCHEMA)
            self.spec: dict[str, Any] = {
                "format": "iceberg", "table": "raw.orders_raw",
                "catalog": {"type": "sql", "uri_env": "BFA_TEST_ICEBERG_SOURCE",
                            "warehouse": str(folder / "source_warehouse")},
            }
        else:
            self.spec = {"format": fmt, "location": str(folder / "orders_raw")}

    def write(self, data: pa.Table) -> None:
        """Replace the source's rows with ``data`` (a new version)."""
        if self.fmt == "delta":
            write_delta(self.folder / "orders_raw", data)
        elif self.fmt == "parquet":  # every partition's files rewritten, one per partition
            import shutil

            import pyarrow.dataset as pads
            shutil.rmtree(self.folder / "orders_raw", ignore_errors=True)
            pads.write_dataset(data, self.folder / "orders_raw", format="parquet", partitioning=["order_date"],
                               partitioning_flavor="hive")
        else:
            self.catalog.load_table("raw.orders_raw").overwrite(data)

    def drop_old_versions(self) -> None:
        """Make every version but the newest unreadable: Delta's vacuum, Iceberg's expiry."""
        if self.fmt == "delta":
            from deltalake import DeltaTable
            DeltaTable(str(self.folder / "orders_raw")).vacuum(retention_hours=0, enforce_retention_duration=False,
                                                              dry_run=False)
        else:
            table = self.catalog.load_table("raw.orders_raw")
            current = table.current_snapshot().snapshot_id
            old = [s.snapshot_id for s in table.snapshots() if s.snapshot_id != current]
            table.maintenance.expire_snapshots().by_ids(old).commit()
