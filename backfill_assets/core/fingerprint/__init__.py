"""A partition's fingerprint (row count, NULL and duplicate keys, total, content hash): in
SQL (``partition``), and in Arrow for lake tables (``arrow``), identical for the same rows;
and the ids of plans and snapshots (``identity``)."""
