"""What every engine shares of the lake: Delta and Iceberg tables as targets (``engine``,
``target``, ``tables``, ``delta``, ``iceberg``, with what their files say in ``lake_files``),
lake sources pinned at a version (``sources``) and the sensor's question about them
(``watch``), DuckDB's types as PostgreSQL's (``duck_types``), and what the build engines over a
pinned source share (``pinned_engine``)."""
