"""The build engines, one folder each: what a step asks of one is core.build's protocol; what each supports (its ``supports.toml``, read by core.supports), and which class it is."""
