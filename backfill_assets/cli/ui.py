"""The UI launcher (``backfill-assets ui``): ``dagster dev`` on loopback, with Dagster's
instance storage and the demo data on the embedded PostgreSQL."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from backfill_assets.cli import demo
from backfill_assets.core.errors import SpecError
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.catalog import table_kind
from backfill_assets.core.pg.db import connection_factory
from backfill_assets.core.vocabulary import DEFAULT_LIMITS, TableRef
from backfill_assets.dagster_layer.names import pool_limits

# The checkout this package was installed from (``pip install -e .``): deploy/ and workspace.yaml
# sit beside the package, not in it.
REPO = Path(__file__).resolve().parents[2]


def launch(port: int, say: Callable[[str], None]) -> int:
    """Start dagster-webserver and dagster-daemon (``dagster dev``) on 127.0.0.1:``port``
    and wait for them; load the demo tables first if they are missing.

    Returns ``dagster dev``'s exit status (0 after Ctrl-C).
    """
    from backfill_assets.dagster_layer.definitions import load_specs

    missing = [p for p in (REPO / "deploy" / "dagster.yaml", REPO / "workspace.yaml") if not p.is_file()]
    if missing:
        raise SpecError(f"`ui` runs from a clone of the project, installed with `pip install -e .`: "
                        f"{', '.join(str(p) for p in missing)} not found")
    home = embedded.home()
    dagster_home = home / "dagster_home"
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = dict(os.environ, DAGSTER_HOME=str(dagster_home))
    if not env.get("DAGSTER_PG_URL"):
        env["DAGSTER_PG_URL"] = embedded.database_url("dagster").reveal()
    data = embedded.database_url()
    factory = connection_factory(data, DEFAULT_LIMITS, application_name="backfill_assets:ui")
    with factory() as conn:
        if table_kind(conn, TableRef("public", "orders_raw")) is None:
            demo.load(conn)
    specs = load_specs()
    for spec in specs:
        if spec.database_url_env is not None:
            env[spec.database_url_env] = data.reveal()  # the embedded default, for this process tree only
    dagster = Path(sys.executable).parent / "dagster"
    for spec in specs:
        for pool, limit in pool_limits(spec).items():  # a spec with `parallel`
            subprocess.run([str(dagster), "instance", "concurrency", "set", pool, str(limit)],
                           env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
            say(f"pool {pool}: at most {limit} run(s) at once")
    say(f"Dagster UI on http://127.0.0.1:{port} (instance storage and data on the "
        f"embedded PostgreSQL under {home}); Ctrl-C stops it.")
    cmd = [str(dagster), "dev", "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)]
    try:
        return subprocess.call(cmd, env=env, cwd=REPO)
    except KeyboardInterrupt:
        return 0
