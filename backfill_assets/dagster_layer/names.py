"""The names the Dagster layer shares: asset keys, job names, run tags and run keys.

``assets``, ``jobs`` and ``sensors`` stand side by side over this module; none imports
another for a name.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

import dagster as dg

from backfill_assets.core.spec import Spec

PLAN_TAG = "backfill_assets/plan_id"
APPROVAL_TAG = "backfill_assets/approval_id"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"

APPROVE_JOB = "approve_backfill"
APPROVE_OP = "approve_plan_gate"
BOARD_SENSOR = "approvals_board"
# Where the UI is served, for the links in metadata (default: the same origin, no prefix).
UI_URL_ENV = "BACKFILL_DAGSTER_UI_URL"
# A run of this job stands for an approval the sensor could not launch: it fails with the reason.
UNLAUNCHABLE_JOB = "approval_not_launched"
UNLAUNCHABLE_OP = "report_approval_not_launched"


@dataclass(frozen=True)
class Keys:
    """The asset keys of one spec."""

    source: dg.AssetKey
    snapshot: dg.AssetKey
    stage_a: dg.AssetKey
    stage_b: dg.AssetKey
    target: dg.AssetKey
    # Not data: the plans waiting for an approval and the approvals not yet applied, observed
    # by approvals_board.
    approvals: dg.AssetKey

    # The spec's other inputs (core.spec_inputs), by name: upstream of the snapshot, as the source.
    inputs: dict[str, dg.AssetKey] = field(default_factory=dict, hash=False)

    @classmethod
    def of(cls, spec: Spec) -> Keys:
        return cls(*(dg.AssetKey([spec.name, n])
                     for n in ("source", "snapshot", "stage_a", "stage_b", "target", "approvals")),
                   inputs={name: dg.AssetKey([spec.name, f"input_{name}"]) for name in spec.inputs})


def build_pool(spec: Spec) -> str:
    """The Dagster concurrency pool of a spec's snapshot and stages steps (spec ``parallel``):
    its limit on the instance is how many of them build at once."""
    return f"backfill_assets.{spec.name}.build"


def replace_pool(spec: Spec) -> str:
    """The pool of a spec's target step (spec ``parallel``): its limit on the instance is 1,
    so the runs replacing the target go one at a time."""
    return f"backfill_assets.{spec.name}.replace"


def pool_limits(spec: Spec) -> dict[str, int]:
    """The limits a Dagster instance must give a spec's pools (none without ``parallel``):
    ``dagster instance concurrency set <pool> <limit>`` for each."""
    if spec.parallel is None:
        return {}
    return {build_pool(spec): spec.parallel.max_concurrent_builds, replace_pool(spec): 1}


def stages_job_name(spec: Spec) -> str:
    return f"{spec.name}__build_stages"


def target_job_name(spec: Spec) -> str:
    return f"{spec.name}__replace_target"


def _ui(base: str | None) -> str:
    """Where the UI is served: ``base``, else ``UI_URL_ENV``, else the same origin ("")."""
    return (os.environ.get(UI_URL_ENV, "") if base is None else base).rstrip("/")


def approve_link(spec_name: str, plan_id: str, review_id: str, base: str | None = None) -> str:
    """The launchpad of the approval gate with the reviewed plan already chosen: Dagster's UI
    route ``/guess/<job>/playground/setup?config=...`` finds the job's code location and opens
    its launchpad with that run config (ui-core GuessJobLocationRoot and LaunchpadSetupRoot).
    The config names the spec, the plan and the preview (as JSON strings, which YAML reads as
    strings whatever they spell); ``approved_by`` is left for the person, so the launchpad
    refuses to launch until a name is entered."""
    quoted = {k: json.dumps(v) for k, v in (("spec", spec_name), ("plan_id", plan_id), ("review_id", review_id))}
    config = (f"ops:\n  {APPROVE_OP}:\n    config:\n      spec: {quoted['spec']}\n      plan_id: {quoted['plan_id']}\n"
              f"      review_id: {quoted['review_id']}\n      approved_by: ")
    return f"{_ui(base)}/guess/{APPROVE_JOB}/playground/setup?" + urlencode({"config": config}, quote_via=quote)


def checks_link(key: dg.AssetKey, base: str | None = None) -> str:
    """The checks tab of an asset's page."""
    return f"{_ui(base)}/assets/{'/'.join(quote(p, safe='') for p in key.path)}?view=checks"


def partition_link(key: dg.AssetKey, partition: str, base: str | None = None) -> str:
    """One partition of an asset's partitions tab, where it is materialized again (for a stage:
    planned again)."""
    return (f"{_ui(base)}/assets/{'/'.join(quote(p, safe='') for p in key.path)}?"
            + urlencode({"view": "partitions", "partition": partition}, quote_via=quote))


def audit_job_name(spec: Spec) -> str:
    return f"{spec.name}__audit_target"


def approval_run_key(spec: Spec, approval_id: int, segment: int) -> str:
    """Unique to its approval (run keys are deduplicated forever): approving the same
    partitions again launches again."""
    return f"approval-{spec.name}-{approval_id}-{segment}"


def unlaunchable_run_key(spec: Spec, approval_id: int) -> str:
    return f"approval-{spec.name}-{approval_id}-not-launched"
