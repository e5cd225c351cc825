"""Two relations compared in DuckDB by the canonical text of their rows (docs/fingerprint.md),
for every engine whose stages or target DuckDB can read: the statements (``compare``) and one
partition key by key, as ``diff`` shows it (``diff``)."""
