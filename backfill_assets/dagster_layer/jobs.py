"""Jobs: per spec, the stages job and the target job; and the manual approval gate."""


import dagster as dg

from backfill_assets.core.approve import confirm, review
from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import Spec
from backfill_assets.dagster_layer.names import (
    APPROVE_JOB,
    APPROVE_OP,
    UNLAUNCHABLE_JOB,
    UNLAUNCHABLE_OP,
    Keys,
    stages_job_name,
    target_job_name,
)
from backfill_assets.dagster_layer.resources import (
    SPARK_RESOURCE,
    PostgresResource,
    resource_key,
    spark_keys,
    transient_retry,
)
from backfill_assets.render import plan_markdown, render_review


def spec_jobs(spec: Spec) -> list:
    """Snapshot and both stages (what a source change reruns); the target (what an approval runs)."""
    keys = Keys.of(spec)
    return [
        dg.define_asset_job(stages_job_name(spec), selection=[keys.snapshot, keys.stage_a, keys.stage_b],
                            description=f"Snapshot and build both stages of {spec.name}."),
        dg.define_asset_job(target_job_name(spec), selection=[keys.target],
                            description=f"Replace approved partitions of {spec.target_name}."),
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

    needs = {resource_key(s) for s in specs} | {k for s in specs for k in spark_keys(s)}

    @dg.op(name=APPROVE_OP, required_resource_keys=needs, out=dg.Out(int))
    def approve_plan_gate(context: dg.OpExecutionContext, config: ApproveConfig) -> int:
        if config.spec:
            if config.spec not in by_name:
                raise SpecError(f"no spec named {config.spec}; loaded: {', '.join(by_name)}")
            spec = by_name[config.spec]
        elif len(specs) == 1:
            spec = specs[0]
        else:
            raise SpecError(f"several specs are loaded ({', '.join(by_name)}); set `spec` in the config")
        if spec.on_spark:  # the review resolves the spec in Spark: the location's session
            getattr(context.resources, SPARK_RESOURCE).start()
        resource: PostgresResource = getattr(context.resources, resource_key(spec))
        factory = resource.factory(spec, f"backfill_assets:{spec.name}:approve")
        with transient_retry(factory, spec), factory() as conn:
            checked = review(conn, factory, spec, config.plan_id)
            context.log.info(render_review(checked, spec.parallel))
            with factory.control(conn) as control:
                approval_id = confirm(control, checked, config.approved_by)
        stored = checked.stored
        context.add_output_metadata({
            "approval_id": approval_id, "plan_id": stored.plan_id, "approved_by": config.approved_by,
            "partitions": ", ".join(stored.labels),
            "plan": dg.MetadataValue.md(plan_markdown(stored.document, stored.plan_id, spec.parallel)),
        })
        context.log.info(f"approved plan {stored.plan_id} as approval {approval_id} by {config.approved_by}")
        return approval_id

    @dg.job(name=APPROVE_JOB, description=(
        "The manual approval gate: launch it with the plan_id shown by the stages_match check and "
        "your name. It refuses a plan that no longer matches the stages; approval_sensor then "
        "launches the target for exactly the approved partitions."))
    def approve_backfill() -> None:
        approve_plan_gate()

    return approve_backfill


class NotLaunchedConfig(dg.Config):
    """What approval_sensor found: the approval it could not launch, and why."""

    spec: str
    approval_id: int
    plan_id: str
    partitions: list[str]
    reason: str


def not_launched_job() -> dg.JobDefinition:
    """``approval_not_launched``: approval_sensor requests one run of it per approval it cannot
    launch (run key per approval). Its op fails with the reason, so the approval shows in
    Runs as a failed run, tagged with its plan and approval, instead of being consumed
    silently; the sensor's cursor moves on, so later approvals are not held up."""

    @dg.op(name=UNLAUNCHABLE_OP)
    def report(context: dg.OpExecutionContext, config: NotLaunchedConfig) -> None:
        context.log.error(config.reason)
        raise dg.Failure(
            description=(f"approval {config.approval_id} of plan {config.plan_id[:16]} ({config.spec}) "
                         f"was not launched: {config.reason}"),
            metadata={"approval_id": config.approval_id, "plan_id": config.plan_id,
                      "partitions": ", ".join(config.partitions)},
            allow_retries=False,
        )

    @dg.job(name=UNLAUNCHABLE_JOB, description=(
        "Launched by approval_sensor, never by hand: one failed run per approval the sensor could "
        "not launch, with the reason. Widen the spec's partitions (or plan within them) and approve again."))
    def approval_not_launched() -> None:
        report()

    return approval_not_launched


__all__ = ["ApproveConfig", "NotLaunchedConfig", "approval_job", "not_launched_job", "spec_jobs"]
