"""Jobs: per spec, the stages job, the target job and the audit job with its schedule; and the
manual approval gate."""


from typing import Any

import dagster as dg
from pydantic import Field

from backfill_assets.core.coverage import utc_text
from backfill_assets.core.errors import SpecError
from backfill_assets.core.preview import approve_previewed
from backfill_assets.core.spec import Spec
from backfill_assets.dagster_layer.events import AUDIT_CHECK
from backfill_assets.dagster_layer.names import (
    APPROVE_JOB,
    APPROVE_OP,
    UNLAUNCHABLE_JOB,
    UNLAUNCHABLE_OP,
    Keys,
    audit_job_name,
    stages_job_name,
    target_job_name,
)
from backfill_assets.dagster_layer.partitions import partitions_def
from backfill_assets.dagster_layer.resources import (
    PostgresResource,
    engine_keys,
    resource_key,
    start_engine,
    transient_retry,
)
from backfill_assets.render import plan_markdown, render_review


def spec_jobs(spec: Spec) -> list:
    """Snapshot and both stages (what a source change reruns); the target (what an approval
    runs); the audit of the target (what its schedule runs)."""
    keys = Keys.of(spec)
    return [
        dg.define_asset_job(stages_job_name(spec), selection=[keys.snapshot, keys.stage_a, keys.stage_b],
                            description=f"Snapshot and build both stages of {spec.name}."),
        dg.define_asset_job(target_job_name(spec), selection=[keys.target],
                            description=f"Replace approved partitions of {spec.target_name}."),
        dg.define_asset_job(audit_job_name(spec), selection=dg.AssetSelection.checks(
                                dg.AssetCheckKey(keys.target, AUDIT_CHECK)),
                            description=f"Audit the verified partitions of {spec.target_name} (read-only)."),
    ]


def audit_schedule(spec: Spec, job: Any) -> dg.ScheduleDefinition:
    """The audit of every verified partition of the spec's target, at the spec's
    ``audit_schedule`` (UTC): one run over the whole partition range."""
    parts = partitions_def(spec)

    @dg.schedule(name=f"{spec.name}__audit_schedule", cron_schedule=spec.audit_schedule, job=job,
                 execution_timezone="UTC", default_status=dg.DefaultScheduleStatus.RUNNING,
                 description=f"Audits the verified partitions of {spec.target_name} ({spec.audit_schedule}, UTC).")
    def _schedule(context: dg.ScheduleEvaluationContext):
        labels = parts.get_partition_keys(current_time=context.scheduled_execution_time)  # never dynamic
        if not labels:
            return dg.SkipReason("the spec has no partitions yet")
        return dg.RunRequest(tags={"dagster/asset_partition_range_start": labels[0],
                                   "dagster/asset_partition_range_end": labels[-1]})

    return _schedule


class ApproveConfig(dg.Config):
    """The launchpad's config. The approve link of a change preview (the target_change_preview
    check, or the approvals board) fills in everything but ``approved_by``."""

    review_id: str = Field(description="The change preview approved (its approve link fills it in).")
    approved_by: str = Field(description="Your name, recorded with the approval.")
    plan_id: str = Field(default="", description="The preview's plan, as shown; checked against the preview.")
    spec: str = Field(default="", description="The spec (needed only when the code location loads several).")


def approval_job(specs: list[Spec]) -> dg.JobDefinition:
    """``approve_backfill``: the manual gate. Its op approves exactly the change preview the
    person reviewed (core.preview.approve_previewed): it refuses a preview that is no longer
    current, a target that changed since and a plan that no longer matches the stages, and
    records the approval with the review shown."""
    by_name = {s.name: s for s in specs}

    needs = {resource_key(s) for s in specs} | {k for s in specs for k in engine_keys(s)}

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
        start_engine(context.resources, spec)  # the review resolves the spec in the engine
        resource: PostgresResource = getattr(context.resources, resource_key(spec))
        factory = resource.factory(spec, f"backfill_assets:{spec.name}:approve")
        with transient_retry(factory, spec), factory() as conn:
            done = approve_previewed(conn, factory, spec, config.review_id, config.approved_by,
                                     plan_id=config.plan_id or None)
        checked = done.checked
        stored = checked.stored
        context.log.info(render_review(checked, spec.parallel))
        context.add_output_metadata({
            "approval_id": done.approval_id, "plan_id": stored.plan_id, "review_id": checked.review_id,
            "previewed_at": utc_text(done.previewed_at), "approved_by": config.approved_by.strip(),
            "partitions": ", ".join(stored.labels),
            "plan": dg.MetadataValue.md(plan_markdown(stored.document, stored.plan_id, spec.parallel)),
        })
        context.log.info(f"approved plan {stored.plan_id} (change preview {checked.review_id[:16]} of "
                         f"{utc_text(done.previewed_at)}) as approval {done.approval_id} by {config.approved_by.strip()}")
        return done.approval_id

    @dg.job(name=APPROVE_JOB, description=(
        "The manual approval gate. Open it from the approve link of a change preview (the "
        "target_change_preview check of stage_a, or the approvals asset), enter your name and "
        "launch. It refuses a preview that is no longer current; approval_sensor then launches "
        "the target for exactly the approved partitions."))
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
