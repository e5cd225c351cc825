"""Profiling a source to propose a business key and a newest-wins ordering from the data
(``propose``), with the key rule (``keyrule``) and the search for candidate keys
(``keysearch``)."""
