"""What every engine shares of the lake: Delta and Iceberg tables as targets (``target``,
``tables``, ``delta``, ``iceberg``), lake sources pinned at a version (``sources``) and the
sensor's question about them (``watch``), and a partition's format-3 readings from Arrow data
handed to DuckDB (``arrow``, ``digest``, ``kinds``, ``texts``, ``stage_arrow``)."""
