"""What the duckdb engine supports: a lake source read where it lies, both builds in an
embedded DuckDB (core.engines.duckdb), a lake target."""

from __future__ import annotations

from backfill_assets.core.engines.supports import Supports, refused, supported

SUPPORTS = Supports(
    engine="duckdb",
    builds="backfill_assets.core.engines.duckdb.engine:DuckBuildEngine",
    sources=("delta", "iceberg", "parquet"),
    targets=("delta", "iceberg"),
    reads="a lake source",
    writes="a lake target",
    options={
        "records_can_move": supported(
            "delta", "iceberg",
            why="a key's versions are looked for in every partition of the pinned version, and a Parquet pin "
                "holds only the planned partitions' files"),
        "parallel": refused("one run builds every partition; remove it", yet=True),
        "replace_batch_rows": refused("each lake partition is replaced in a commit of its own; remove it", yet=True),
        "trusted_functions": refused("they name PostgreSQL functions, and engine duckdb trusts DuckDB's built-in "
                                     "functions only; remove them"),
    },
    settings=("database", "memory_limit", "threads"),
)
