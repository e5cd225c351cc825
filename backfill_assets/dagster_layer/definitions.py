"""The code location: one set of assets, checks, jobs and sensors per spec.

Specs are read from the files or folders named in ``BACKFILL_SPECS`` (separated by the
platform's path separator; default: the ``backfills/`` folder). Connection URLs are not
read here: each spec's resource reads its variable when a run uses it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import dagster as dg

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import Spec, load_spec
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.jobs import approval_job, audit_schedule, not_launched_job, spec_jobs
from backfill_assets.dagster_layer.resources import engine_resources, resource_for, resource_key
from backfill_assets.dagster_layer.sensors import approval_sensor, approvals_board, source_snapshot_sensor

# Partitioned asset checks are a preview feature in Dagster 1.13; this project relies on them
# on purpose (per-partition check status), so the warning is expected, not news.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")

SPECS_ENV = "BACKFILL_SPECS"
DEFAULT_SPECS = "backfills"


def load_specs(value: str | None = None) -> list[Spec]:
    """The specs named by ``BACKFILL_SPECS`` (files, or folders of ``*.yaml``)."""
    value = value if value is not None else os.environ.get(SPECS_ENV, DEFAULT_SPECS)
    files: list[Path] = []
    for item in filter(None, value.split(os.pathsep)):
        path = Path(item)
        if not path.exists():
            raise SpecError(f"{SPECS_ENV} names {path}, which does not exist; name spec files or folders")
        files.extend(sorted(path.glob("*.yaml")) + sorted(path.glob("*.yml")) if path.is_dir() else [path])
    if not files:
        raise SpecError(f"no spec files found in {SPECS_ENV}={value!r}; name YAML files or folders")
    specs = [load_spec(f) for f in files]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise SpecError(f"two specs share a name: {sorted(n for n in names if names.count(n) > 1)}")
    return specs


def build_definitions(specs: list[Spec]) -> dg.Definitions:
    """Assets, checks, jobs, schedules, sensors and resources for ``specs``."""
    jobs = {s.name: spec_jobs(s) for s in specs}
    stage_jobs = [j[0] for j in jobs.values()]
    target_jobs = [j[1] for j in jobs.values()]
    audit_jobs = [j[2] for j in jobs.values()]
    not_launched = not_launched_job()
    # A run's steps are a chain (snapshot, stages and their checks, target): in the run's own
    # process, not a new process per step importing Dagster and the code location again.
    return dg.Definitions(
        executor=dg.in_process_executor,
        assets=[a for s in specs for a in spec_assets(s)],
        jobs=[*stage_jobs, *target_jobs, *audit_jobs, approval_job(specs), not_launched],
        schedules=[audit_schedule(s, jobs[s.name][2]) for s in specs],
        sensors=[approval_sensor(specs, [*target_jobs, not_launched]), source_snapshot_sensor(specs, stage_jobs),
                 approvals_board(specs)],
        resources={**{resource_key(s): resource_for(s) for s in specs}, **engine_resources(specs)},
    )


defs = build_definitions(load_specs())
