"""A Delta or Iceberg target of the demo spec on local disk, and the rows it should hold."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa

from backfill_assets.core.lake.delta import delta_predicate
from backfill_assets_tests.support.flows import newest_wins
from backfill_assets_tests.support.specs import make_spec

COLUMNS = ["order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note"]


def lake_spec(fmt: str, where: Path, **changes: Any):
    target: dict[str, Any] = (
        {"format": "delta", "location": str(where / "orders_daily")} if fmt == "delta"
        else {"format": "iceberg", "table": "sales.orders_daily",
              "catalog": {"type": "sql", "warehouse": str(where / "warehouse")}}
    )
    return make_spec(**{"target": target, "records_can_move": False, **changes})


class Lake:
    """Read and write the test's lake table directly, as another writer would."""

    def __init__(self, fmt: str, spec, conn) -> None:
        from backfill_assets.core.targets import engine_for
        self.fmt, self.spec = fmt, spec
        self.table = engine_for(spec).table(conn)

    def rows(self, day: dt.date | None = None) -> list[tuple]:
        handle = self.table.open()
        if handle is None:
            return []
        if day is None:
            data = (handle.to_pyarrow_table() if self.fmt == "delta"
                    else handle.scan().to_arrow())
        else:
            data = self.table.read(handle, "order_date", [day])
        out = [tuple(r[c] for c in COLUMNS) for r in data.select(COLUMNS).to_pylist()]
        return sorted(out, key=lambda r: (r[0], r[1]))

    def version(self) -> str | None:
        return self.table.version(self.table.open())

    def overwrite(self, day: dt.date, rows: list[tuple], schema: pa.Schema) -> None:
        data = pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=schema)
        handle = self.table.open()
        if self.fmt == "delta":
            from deltalake import write_deltalake
            write_deltalake(handle, data, mode="overwrite", predicate=delta_predicate("order_date", [day]))
        else:
            from pyiceberg.expressions import EqualTo
            handle.overwrite(data, overwrite_filter=EqualTo("order_date", day.isoformat()))

    def commit_metadata(self) -> dict[str, str]:
        handle = self.table.open()
        if self.fmt == "delta":
            return {k: str(v) for k, v in handle.history(1)[0].items()}
        return dict(handle.current_snapshot().summary.additional_properties)


def expected_rows(conn) -> list[tuple]:
    rows = conn.execute(
        "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note "
        "FROM public.orders_raw WHERE order_date BETWEEN '2024-01-01' AND '2024-01-07'"
    ).fetchall()
    by_day = newest_wins(rows, per_day=True)
    return sorted((r for day in by_day.values() for r in day), key=lambda r: (r[0], r[1]))
