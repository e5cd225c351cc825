"""The lake as a target: Delta and Iceberg tables (``engine``, ``target``, ``tables``,
``delta``, ``iceberg`` with its SQL catalog in ``iceberg_catalog``), and what a lake's files say
without reading rows (``lake_files``)."""
