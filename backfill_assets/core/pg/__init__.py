"""PostgreSQL plumbing: connections with their limits (``db``), the embedded server
(``embedded``), read-only inspection of the catalog (``catalog``) and the SQL builders
(``sqlbuild``)."""
