"""The Dagster code location, a thin layer over the core: ``definitions`` wires one
``Definitions`` of the assets (``assets``), their checks and events (``events``), the jobs
(``jobs``), the sensors (``sensors``) and the resources (``resources``), over one
partitions definition (``partitions``) and shared names (``names``)."""
