"""The ``engine`` mapping of a spec on this engine (``type: duckdb``): where its DuckDB database
file lives and how much of the machine DuckDB may take."""

from __future__ import annotations

from typing import Annotated, Literal

import pydantic
from pydantic import Field

from backfill_assets.core.spec_formats import Strict, check_location


class DuckDBEngineSpec(Strict):
    """``engine: {type: duckdb, ...}``: an embedded DuckDB over a lake source (core.engines.duckdb)."""

    type: Literal["duckdb"]
    # The database file the stages live in (default: <home>/duckdb/<spec name>.duckdb).
    database: Annotated[str, Field(min_length=1)] | None = None
    # Its memory_limit setting (for example 4GB); beyond it, DuckDB spills to disk.
    memory_limit: Annotated[str, Field(pattern=r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$")] | None = None
    threads: Annotated[int, Field(strict=True, ge=1, le=256)] | None = None

    @pydantic.model_validator(mode="after")
    def _location(self) -> DuckDBEngineSpec:
        if self.database is not None:
            check_location("duckdb database", self.database)
        return self
