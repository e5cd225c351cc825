"""The command line (``backfill-assets``, or ``python -m backfill_assets.cli``): the commands
(``commands``, whose ``main`` is the entry point), the progress bar (``progress_bar``), the
demo (``demo``, ``demo_run``) and the UI launcher (``ui``)."""
