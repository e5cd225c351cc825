"""The command line (``backfill-assets``, or ``python -m backfill_assets.cli``): the commands
(``commands``), how their results print (``render``, ``progress_bar``), the demo (``demo``,
``demo_run``) and the UI launcher (``ui``)."""

from backfill_assets.cli.commands import main

__all__ = ["main"]
