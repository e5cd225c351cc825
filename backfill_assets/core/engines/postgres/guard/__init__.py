"""The PostgreSQL engine's transform guard: ``transform_sql`` is parsed (``querytree``), checked
for anything that could give another result on another run (``determinism``, ``roworder``,
``userfunctions``), against the server's own catalog of functions and operators
(``catalog``); ``transform`` is its entry point. The DuckDB and Spark engines keep the guard in
their dialects in their own folders (core.engines.duckdb.guard, core.engines.spark.guard)."""
