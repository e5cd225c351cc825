"""The transform guard: ``transform_sql`` is parsed (``querytree``), checked for anything that
could give another result on another run (``determinism``, ``roworder``, ``userfunctions``),
against the server's own catalog of functions and operators (``catalog``); ``transform`` is
its entry point."""
