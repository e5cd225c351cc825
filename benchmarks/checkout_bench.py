"""Run another checkout's benchmarks/bench.py (or another of its benchmarks, named first) with
that checkout's own backfill_assets, from this project's virtualenv: two versions measured side
by side in one session.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/checkout_bench.py /tmp/before --only fig3 --out /tmp/before.md
    .venv/bin/python benchmarks/checkout_bench.py /tmp/before lake_many.py --target delta

The checkout's code is imported instead of the editable install's (its finder is removed and
the checkout put first on the path), and the run happens in the checkout's folder, so it
starts its own embedded server under the checkout's .backfill_assets. Alternate it with this
checkout's own `bench.py` a few times and compare run by run: this machine's speed drifts.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    root = Path(sys.argv[1]).resolve()
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    for name in [m for m in sys.modules if m == "backfill_assets" or m.startswith("backfill_assets.")]:
        del sys.modules[name]
    sys.path[:0] = [str(root), str(root / "benchmarks")]
    os.chdir(root)
    import backfill_assets

    if not Path(backfill_assets.__file__).resolve().is_relative_to(root):
        raise SystemExit(f"imported {backfill_assets.__file__}, not the checkout's backfill_assets")
    script, args = ((sys.argv[2], sys.argv[3:]) if len(sys.argv) > 2 and sys.argv[2].endswith(".py")
                    else ("bench.py", sys.argv[2:]))
    sys.argv = [str(root / "benchmarks" / script), *args]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
