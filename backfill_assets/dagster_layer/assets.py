"""The assets of one spec: source -> snapshot -> stage_a, stage_b -> target.

Stages A and B are materialized by one step that builds both at once on two connections and
plans, as the CLI does. Every asset body is a thin call into the core; ``events`` maps what
the core returns onto materializations and check evaluations. They run as single-run
backfills over a partition range; with the spec's ``parallel``, as multi-run backfills whose
steps are in the spec's concurrency pools (build: snapshot and stages, several at once;
replace: the target, one run at a time, each refusing to start after an earlier run of its
approval failed a partition not verified since). Dagster records one materialization per
partition of the range from the step's output (its metadata describes the whole run: snapshot id, plan id);
each body then yields a materialization per partition with that partition's own readings,
and one check evaluation per partition, so the UI shows per-partition metadata, plots and
checks (the latest materialization of a partition is the detailed one). The stages step
reads the snapshot to build from in the control schema. A refused plan records its checks
and fails the step, with no stage materialization; a selection of only the stage checks
evaluates them on the stages as they are (read_stages), building nothing.
The target's gate is the core's approval check, inside the target itself: it holds for a
backfill re-executed from failure, a hand-launched run and a sensor run alike, and each
partition's failing check says why the approval does not cover it.
"""


import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg
import psycopg

from backfill_assets.core.apply import apply_plan, approved_plan_for
from backfill_assets.core.audit import audit_spec
from backfill_assets.core.build import snapshot_with_builds
from backfill_assets.core.errors import ApprovalError, BackfillError, SpecError, StageError, VerificationError
from backfill_assets.core.plan import plan_step, snapshot_covering, snapshot_step, stages_step
from backfill_assets.core.preview import make_preview
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.stages import read_stages
from backfill_assets.dagster_layer import events
from backfill_assets.dagster_layer.names import PLAN_TAG, Keys, build_pool, replace_pool
from backfill_assets.dagster_layer.partitions import partitions_def
from backfill_assets.dagster_layer.resources import (
    PostgresResource,
    engine_keys,
    resource_key,
    start_engine,
    transient_retry,
)

__all__ = ["require_pool_limit", "spec_assets"]

PROGRESS_INTERVAL_S = 2.0


@contextlib.contextmanager
def _progress(context: dg.AssetExecutionContext, interval: float = PROGRESS_INTERVAL_S) -> Iterator[Progress]:
    """The core's progress events as run logs: a step's per-partition events (stage a,
    stage b, apply) at most one per ``interval`` seconds per step, the last of each kept.
    Every log line is an event in Dagster's storage (a new database connection each with
    dagster-postgres), and the per-partition results are events already (materializations
    and checks). Lines are written under one lock, so the two build threads' lines keep
    their order; a one-off event writes the held lines first."""
    lock = threading.Lock()
    last: dict[str, float] = {}
    held: dict[str, ProgressEvent] = {}  # step -> its newest event not yet written

    def log(event: ProgressEvent) -> None:
        with lock:
            if event.counted:
                now = time.monotonic()
                if now - last.get(event.step, float("-inf")) < interval and not event.last:
                    held[event.step] = event
                    return
                last[event.step] = now
                held.pop(event.step, None)
                out = [event]
            else:
                out = [*held.values(), event]
                held.clear()
            for each in out:
                context.log.info(str(each))

    try:
        yield log
    finally:
        with lock:
            for event in held.values():
                context.log.info(str(event))


def _factory(context: dg.AssetExecutionContext, spec: Spec):
    start_engine(context.resources, spec)
    resource: PostgresResource = getattr(context.resources, resource_key(spec))
    return resource.factory(spec, f"backfill_assets:{spec.name}:dagster")


def require_pool_limit(context: dg.AssetExecutionContext, spec: Spec, pool: str, most: int, why: str) -> None:
    """A spec with ``parallel``: the instance must limit ``pool`` to at most ``most`` runs at
    once (its own limit, or ``concurrency: pools: default_limit``), else the runs of a
    multi-run backfill would all start at once. An instance that cannot limit pools (an
    in-memory one, in tests) runs one step at a time and passes.

    Raises:
        SpecError: no limit, or a larger one; it names the command that sets it.
    """
    if spec.parallel is None:
        return
    storage = context.instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    limits = {p.name: p.limit for p in storage.get_pool_limits()}
    limit = limits.get(pool, context.instance.global_op_concurrency_default_limit)
    if limit is None or limit > most:
        found = "has no limit" if limit is None else f"is limited to {limit}"
        raise SpecError(
            f"the Dagster pool {pool} {found} on this instance, but spec {spec.name} allows at most "
            f"{most} at once ({why}); set it with `dagster instance concurrency set {pool} {most}` "
            "and launch again. Nothing was written."
        )


@dataclass(frozen=True)
class _Shape:
    """What every asset of one spec shares: its keys and its one partitions definition."""

    spec: Spec
    keys: Keys
    parts: dg.PartitionsDefinition

    def multi_asset(self, step: str, pool: str, **kwargs: Any) -> Callable[..., Any]:
        """A multi-asset over the spec's partitions, named ``<spec>__<step>``: a backfill is
        one run, or with the spec's ``parallel``, runs of at most ``max_partitions_per_run``
        partitions whose step is in ``pool`` (the instance's limit of that pool says how many
        run at once).

        Subsettable so that per-partition check evaluations may stand in for the check
        outputs; the stages body refuses a selection of one stage."""
        parallel = self.spec.parallel
        policy = (dg.BackfillPolicy.single_run() if parallel is None
                  else dg.BackfillPolicy.multi_run(max_partitions_per_run=parallel.max_partitions_per_run))
        return dg.multi_asset(
            name=f"{self.spec.name}__{step}", partitions_def=self.parts, backfill_policy=policy,
            pool=None if parallel is None else pool,
            can_subset=True, required_resource_keys={resource_key(self.spec), *engine_keys(self.spec)}, **kwargs,
        )

    def check(self, name: str, key: dg.AssetKey, description: str, blocking: bool = False) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(name, asset=key, description=description, blocking=blocking, partitions_def=self.parts)


def spec_assets(spec: Spec) -> list[Any]:
    """The asset definitions of one spec."""
    shape = _Shape(spec, Keys.of(spec), partitions_def(spec))
    source = dg.AssetSpec(
        shape.keys.source, group_name=spec.name, kinds={_kind(spec)},
        description=f"The source {spec.source_name}; read only, never written.",
        metadata={"table": spec.source_name},
    )
    approvals = dg.AssetSpec(
        shape.keys.approvals, group_name=spec.name, kinds={"dagster"},
        description=("What waits for a person or a run: the ready plans nobody approved yet, with their change "
                     "preview and an approve link, and the approvals not yet applied, each with its age. "
                     "Observed by the approvals_board sensor; not data."),
    )
    inputs = [dg.AssetSpec(key, group_name=spec.name, kinds={_kind(spec)},
                           description=f"The input {name} ({spec.inputs[name].display_name}) the transform reads beside "
                                       "the source, pinned with it in each snapshot; read only, never written.",
                           metadata={"table": spec.inputs[name].display_name})
              for name, key in shape.keys.inputs.items()]
    if snapshot_with_builds(spec):  # the snapshot is taken by the step that builds from it
        return [source, *inputs, _stages_asset(shape), _target_asset(shape), approvals]
    return [source, *inputs, _snapshot_asset(shape), _stages_asset(shape), _target_asset(shape), approvals]


def _require_build_pool(context: dg.AssetExecutionContext, spec: Spec) -> None:
    if spec.parallel is not None:
        require_pool_limit(context, spec, build_pool(spec), spec.parallel.max_concurrent_builds,
                           "parallel.max_concurrent_builds")


def _kind(spec: Spec) -> str:
    """Where the source, snapshot and stages live (their icon in the UI)."""
    return spec.engine.type


def _snapshot_spec(shape: _Shape) -> dg.AssetSpec:
    spec = shape.spec
    held = snapshot_with_builds(spec)
    return dg.AssetSpec(
        shape.keys.snapshot, deps=[shape.keys.source, *shape.keys.inputs.values()], group_name=spec.name,
        kinds={_kind(spec)},
        description=("The source partitions as one snapshot the stages step holds while it builds both stages "
                     "(materialized with them), identified by their fingerprints." if held else
                     "A fixed copy (or pinned fingerprint) of the source partitions."))


def _snapshot_asset(shape: _Shape) -> dg.AssetsDefinition:
    spec, keys, parts = shape.spec, shape.keys, shape.parts

    @shape.multi_asset("snapshot", build_pool(spec), specs=[_snapshot_spec(shape)])
    def snapshot(context: dg.AssetExecutionContext):
        _require_build_pool(context, spec)
        factory = _factory(context, spec)
        with transient_retry(factory, spec), _progress(context) as progress:
            snap = snapshot_step(spec, list(context.partition_keys), factory, progress=progress)
        yield from events.snapshot_events(keys, parts, snap)

    return snapshot


def _stages_asset(shape: _Shape) -> dg.AssetsDefinition:
    spec, keys, parts = shape.spec, shape.keys, shape.parts

    held = snapshot_with_builds(spec)  # the snapshot is taken, and materialized, by this step
    @shape.multi_asset(
        "stages", build_pool(spec),
        specs=[
            *([_snapshot_spec(shape)] if held else []),
            dg.AssetSpec(keys.stage_a, deps=[keys.snapshot], group_name=spec.name, kinds={_kind(spec)},
                         description="Newest row per business key, built with DISTINCT ON."),
            dg.AssetSpec(keys.stage_b, deps=[keys.snapshot], group_name=spec.name, kinds={_kind(spec)},
                         description="Newest row per business key, built independently with a window "
                                     "function; compared with stage A into a plan."),
        ],
        check_specs=[
            shape.check(events.KEY_CHECK, keys.stage_a, "No NULL and no duplicate business key in the stage partition."),
            shape.check(events.MATCH_CHECK, keys.stage_b, "Stages A and B agree on every reading.", blocking=True),
            shape.check(events.KEY_CHECK, keys.stage_b, "No NULL and no duplicate business key in the stage partition."),
            shape.check(events.PREVIEW_CHECK, keys.stage_a,
                        "What approving the ready plan would change in the target partition: keys added, removed, "
                        "changed and unchanged, the first differing keys and columns, and the link that approves "
                        "exactly this preview. A warning when no current preview exists (stale, or the plan "
                        "cannot be approved)."),
        ],
    )
    def stages(context: dg.AssetExecutionContext):
        """Both builds at once, on two connections, then the plan: one step, as in the CLI.
        (Two steps would run one after the other and read both stages again to plan.)
        With only the stage checks selected, the checks run again on the stages as they are."""
        chosen = context.selected_asset_keys & {keys.stage_a, keys.stage_b}
        if held and keys.snapshot in context.selected_asset_keys and chosen != {keys.stage_a, keys.stage_b}:
            raise StageError(
                f"{keys.snapshot.to_user_string()} is taken by the step that builds both stages from it "
                "(snapshot: exported, held only while that step runs); select both stages with it"
            )
        if not chosen:
            yield from _stage_checks_again(context, shape)
            return
        if chosen != {keys.stage_a, keys.stage_b}:
            raise StageError(
                f"{keys.stage_a.to_user_string()} and {keys.stage_b.to_user_string()} are built "
                "together (two independent builds compared into one plan); select both, or only "
                "their checks to check the stages again without building them"
            )
        _require_build_pool(context, spec)
        factory = _factory(context, spec)
        with transient_retry(factory, spec), _progress(context) as progress:
            if held:
                snap, ctx, plan, built_a, built_b = plan_step(spec, list(context.partition_keys), factory,
                                                              progress=progress)
                snapshot_id = snap.snapshot_id
            else:
                with factory() as conn:
                    snapshot_id = snapshot_covering(conn, spec, list(context.partition_keys),
                                                     take_hint=f"materialize {keys.snapshot.to_user_string()} first")
                ctx, plan, built_a, built_b = stages_step(spec, snapshot_id, factory, progress=progress)
        if held and keys.snapshot in context.selected_asset_keys:
            yield from events.snapshot_events(keys, parts, snap)
        checks = events.stage_checks(keys, parts, plan, built_a, built_b, spec.parallel)
        if plan.status == "refused":
            # The differing partitions' stages were deleted: record no materialization of any
            # partition, only the checks saying why, and fail the step.
            yield from checks
            raise plan.refusal()
        columns = [(c.name, c.type_name) for c in ctx.target_columns]
        yield from events.stage_materializations(keys, parts, snapshot_id, columns, plan, spec.parallel)
        yield from checks
        if dg.AssetCheckKey(keys.stage_a, events.PREVIEW_CHECK) in context.selected_asset_check_keys:
            yield from _previews(context, shape, factory, plan.plan_id, plan.labels)

    return stages


def _stage_checks_again(context: dg.AssetExecutionContext, shape: _Shape) -> Iterator[Any]:
    """Only the stage checks selected (a check-only re-execution): evaluate them on both
    stages as they are now, against each other, their builds and the plans; build nothing."""
    spec, keys = shape.spec, shape.keys
    if not (context.has_partition_key or context.has_partition_key_range):
        raise StageError("checking the stages again needs the partitions to check; pick them when launching")
    factory = _factory(context, spec)
    with transient_retry(factory, spec):
        found = read_stages(spec, list(context.partition_keys), factory)
    yield from events.stage_checks_as_they_are(keys, found, context.selected_asset_check_keys)
    if dg.AssetCheckKey(keys.stage_a, events.PREVIEW_CHECK) in context.selected_asset_check_keys:
        by_plan: dict[str | None, list[str]] = {}
        for state in found:
            by_plan.setdefault(state.plan_id, []).append(state.partition)
        for plan_id, labels in by_plan.items():
            if plan_id is None:
                yield from events.no_preview(keys, labels, "no plan covers this partition: build the stages")
                continue
            yield from _previews(context, shape, factory, plan_id, labels)

def _previews(context: dg.AssetExecutionContext, shape: _Shape, factory: Any, plan_id: str,
              labels: list[str]) -> Iterator[dg.AssetCheckEvaluation]:
    """The change preview of a ready plan, on every partition of the plan (a new preview
    replaces the plan's previous one, and its link approves them all, so none may go on
    showing the old one); a warning on ``labels`` naming why where none could be made (the
    plan was refused or changed since, a wait ran out): the stages stand either way, and
    executing the check again retries it."""
    spec, keys, parts = shape.spec, shape.keys, shape.parts
    try:
        with factory() as conn:
            preview = make_preview(conn, factory, spec, plan_id)
    except Exception as err:  # noqa: BLE001 - the stages stand; only the preview is missing
        # Our errors and the driver's carry no credential; of a library's, only its class.
        reason = (" ".join(str(err).split()) if isinstance(err, (BackfillError, psycopg.Error))
                  else f"unexpected {err.__class__.__name__}; see the run's logs")
        context.log.warning(f"no change preview of plan {plan_id[:16]}: {reason}")
        yield from events.no_preview(keys, [label for label in labels if parts.has_partition_key(label)],
                                     reason, plan_id=plan_id)
        return
    yield from events.preview_checks(keys, parts, preview)


def _target_asset(shape: _Shape) -> dg.AssetsDefinition:
    spec, keys, parts = shape.spec, shape.keys, shape.parts

    @shape.multi_asset(
        "target", replace_pool(spec),
        specs=[dg.AssetSpec(keys.target, deps=[keys.stage_a, keys.stage_b], group_name=spec.name,
                            kinds={spec.target.format},  # its icon in the UI
                            description=f"{spec.target_name}: approved partitions replaced from stage A, "
                                        "one verified transaction each.")],
        check_specs=[shape.check(events.TARGET_CHECK, keys.target,
                                 "After the replace, the target partition carries the approved fingerprint."),
                     shape.check(events.AUDIT_CHECK, keys.target,
                                 "The target partition still holds what its newest verification read back (the "
                                 "audit: a metadata signal first, the fingerprint where it cannot tell). Evaluated "
                                 "by the audit schedule and on demand; read-only. A drifted partition fails it "
                                 "with what changed and a link that plans it again.")],
    )
    def target(context: dg.AssetExecutionContext):
        labels = list(context.partition_keys)
        factory = _factory(context, spec)
        if keys.target not in context.selected_asset_keys:  # only the audit check: nothing is written
            with transient_retry(factory, spec), _progress(context) as progress:
                result = audit_spec(spec, factory, among=set(labels), progress=progress)
            yield from events.audit_events(keys, parts, result)
            return
        results: list[dict[str, Any]] = []
        plan_id = context.run.tags.get(PLAN_TAG)
        require_pool_limit(context, spec, replace_pool(spec), 1,
                           "apply replaces one partition at a time and holds the spec's lock")
        try:
            with transient_retry(factory, spec):
                if plan_id is None:
                    with factory() as conn, factory.control(conn) as store:
                        plan_id = approved_plan_for(store, spec, labels)
                with _progress(context) as progress:
                    apply_plan(
                        spec, plan_id, factory, run_id=f"dagster-{context.run.run_id}-{context.retry_number}",
                        only=labels, on_result=results.append, progress=progress,
                    )
        except (ApprovalError, VerificationError) as err:
            yield from events.target_events(keys, parts, labels, results, plan_id, err)
            raise
        yield dg.MaterializeResult(asset_key=keys.target, metadata={"plan_id": plan_id})
        yield from events.target_events(keys, parts, labels, results, plan_id)
        if dg.AssetCheckKey(keys.target, events.AUDIT_CHECK) in context.selected_asset_check_keys:
            yield from events.just_verified(keys, parts, results, plan_id)

    return target
