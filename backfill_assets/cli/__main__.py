import sys

from backfill_assets.cli.commands import main

sys.exit(main())
