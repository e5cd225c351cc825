"""The PostgreSQL build engine: the source, its snapshot and both stages in the spec's database."""
