"""Jobs: per spec, the stages job and the target job; and the manual approval gate."""


import dagster as dg

from backfill_assets.assets import Keys
from backfill_assets.core.approve import (
    check_data_unchanged, check_spec_unchanged, find_plan, record_approval,
)
from backfill_assets.core.errors import SpecError
from backfill_assets.core.plan import Plan
from backfill_assets.core.spec import Spec
from backfill_assets.render import plan_markdown, render_plan, render_replacement, render_target_now
from backfill_assets.resources import PostgresResource, resource_key


def stages_job_name(spec: Spec) -> str:
    return f"{spec.name}__build_stages"


def target_job_name(spec: Spec) -> str:
    return f"{spec.name}__replace_target"


def spec_jobs(spec: Spec) -> list:
    """Snapshot and both stages (what a source change reruns); the target (what an approval runs)."""
    keys = Keys.of(spec)
    return [
        dg.define_asset_job(stages_job_name(spec), selection=[keys.snapshot, keys.stage_a, keys.stage_b],
                            description=f"Snapshot and build both stages of {spec.name}."),
        dg.define_asset_job(target_job_name(spec), selection=[keys.target],
                            description=f"Replace approved partitions of {spec.target_ref}."),
    ]


class ApproveConfig(dg.Config):
    """What a person fills in on the launchpad."""

    plan_id: str
    approved_by: str
    spec: str = ""  # needed only when the code location loads several specs


def approval_job(specs: list[Spec]) -> dg.JobDefinition:
    """``approve_backfill``: the manual gate. Its op shows the plan, refuses one that no longer
    matches the stages, and records the approval through the core."""
    by_name = {s.name: s for s in specs}

    @dg.op(required_resource_keys={resource_key(s) for s in specs}, out=dg.Out(int))
    def approve_plan_gate(context: dg.OpExecutionContext, config: ApproveConfig) -> int:
        if config.spec:
            if config.spec not in by_name:
                raise SpecError(f"no spec named {config.spec}; loaded: {', '.join(by_name)}")
            spec = by_name[config.spec]
        elif len(specs) == 1:
            spec = specs[0]
        else:
            raise SpecError(f"several specs are loaded ({', '.join(by_name)}); set `spec` in the config")
        resource: PostgresResource = getattr(context.resources, resource_key(spec))
        factory = resource.factory(f"backfill_assets:{spec.name}:approve")
        with factory() as conn:
            stored = find_plan(conn, spec, config.plan_id)
            context.log.info(render_plan(Plan(stored.plan_id, stored.status, (), stored.document)))
            context.log.info(render_replacement(stored.document))
            ctx = check_spec_unchanged(conn, factory, spec, stored)
            target = check_data_unchanged(conn, ctx, stored)
            context.log.info(render_target_now(stored.document, target))
            approval_id = record_approval(conn, spec, stored, config.approved_by, target=target)
        context.add_output_metadata({
            "approval_id": approval_id, "plan_id": stored.plan_id, "approved_by": config.approved_by,
            "partitions": ", ".join(stored.labels),
            "plan": dg.MetadataValue.md(plan_markdown(stored.document, stored.plan_id)),
        })
        context.log.info(f"approved plan {stored.plan_id} as approval {approval_id} by {config.approved_by}")
        return approval_id

    @dg.job(name="approve_backfill", description=(
        "The manual approval gate: launch it with the plan_id shown by the stages_match check and "
        "your name. It refuses a plan that no longer matches the stages; approval_sensor then "
        "launches the target for exactly the approved partitions."))
    def approve_backfill() -> None:
        approve_plan_gate()

    return approve_backfill


__all__ = ["ApproveConfig", "approval_job", "spec_jobs", "stages_job_name", "target_job_name"]
