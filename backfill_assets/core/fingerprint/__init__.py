"""A partition's fingerprint (row count, NULL and duplicate keys, total, content hash): its
specification (``rows``), computed in PostgreSQL's SQL (``partition``) and over Arrow data in
DuckDB's (``digest``, ``arrow``, with each PostgreSQL type's Arrow type in ``kinds``, its text
forms in ``texts`` and a PostgreSQL stage read into Arrow by ``stage_arrow``), identical for the
same rows; and the ids of plans and snapshots (``identity``)."""
