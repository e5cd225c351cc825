"""A source pinned at one version that cannot change, as the DuckDB and Spark engines read it:
the pin, the snapshot that names it and their records (``pins``); the lake source and what
every format answers (``source``), each format's (``delta``, ``iceberg``, ``parquet``) and the
spec's by its format (``by_format``); DuckDB's types of the pinned rows as PostgreSQL's
(``duck_types``); the sensor's question about a pinned source (``watch``); and what the build
engines over a pinned source share (``engine``)."""
