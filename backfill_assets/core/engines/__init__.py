"""The build engines, one folder each: what a step asks of one is core.build's protocol; what each supports, and which class it is, core.engines.registry's."""
