"""What every engine shares of the lake: Delta and Iceberg tables as targets (``engine``,
``target``, ``tables``, ``delta``, ``iceberg``), lake sources pinned at a version (``sources``)
and the sensor's question about them (``watch``), DuckDB's types as PostgreSQL's
(``duck_types``), a partition's format-3 readings from Arrow data handed to DuckDB (``arrow``,
``digest``, ``kinds``, ``texts``, ``stage_arrow``), two relations compared by canonical text
(``compare``), and what the build engines over a pinned source share (``pinned_engine``)."""
