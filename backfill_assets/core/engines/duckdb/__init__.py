"""The DuckDB build engine: a lake source read where it lies, both stages in an embedded DuckDB."""
