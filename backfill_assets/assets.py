"""The assets of one spec: source -> snapshot -> stage_a, stage_b -> target.

Stages A and B are materialized by one step that builds both at once on two connections and
plans, as the CLI does. Every asset body is a thin call into the core. They run as single-run backfills over a
partition range. Dagster records one materialization per partition of the range from the
step's output (its metadata describes the whole run: snapshot id, plan id); each body then
yields a materialization per partition with that partition's own readings, and one check
evaluation per partition, so the UI shows per-partition metadata, plots and checks (the
latest materialization of a partition is the detailed one). A refused plan records its
checks and fails the step, with no stage materialization; a selection of only the stage
checks evaluates them on the stages as they are (core.plan.read_stages), building nothing.
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

from backfill_assets.core.apply import apply_plan, approved_plan_for
from backfill_assets.core.errors import (
    ApprovalError, ApprovalOutdatedError, BackfillError, ConcurrentRunError, DeterminismError,
    SnapshotError, StageError, TransientDatabaseError, VerificationError,
)
from backfill_assets.core.fingerprint import Fingerprint
from backfill_assets.core.plan import snapshot_step, stages_step
from backfill_assets.core.stages import read_stages
from backfill_assets.core.spec import Spec
from backfill_assets.partitions import partitions_def
from backfill_assets.render import plan_markdown
from backfill_assets.resources import PostgresResource, resource_key

PLAN_TAG = "backfill_assets/plan_id"
APPROVAL_TAG = "backfill_assets/approval_id"
MAX_TRANSIENT_RETRIES = 3


@dataclass(frozen=True)
class Keys:
    source: dg.AssetKey
    snapshot: dg.AssetKey
    stage_a: dg.AssetKey
    stage_b: dg.AssetKey
    target: dg.AssetKey

    @classmethod
    def of(cls, spec: Spec) -> "Keys":
        return cls(*(dg.AssetKey([spec.name, n]) for n in ("source", "snapshot", "stage_a", "stage_b", "target")))


@contextlib.contextmanager
def transient_retry() -> Iterator[None]:
    """Retry the step, a bounded number of times, on a lock or statement timeout, a
    serialization failure or a concurrent run; never on any other error (decided by class)."""
    try:
        yield
    except (TransientDatabaseError, ConcurrentRunError) as err:
        raise dg.RetryRequested(max_retries=MAX_TRANSIENT_RETRIES, seconds_to_wait=2) from err


PROGRESS_INTERVAL_S = 2.0


@contextlib.contextmanager
def _progress(context: dg.AssetExecutionContext, interval: float = PROGRESS_INTERVAL_S) -> Iterator[Callable[[str], None]]:
    """The core's progress lines as run logs, the per-partition ones ("stage a: 3/20 ...",
    "apply: 2024-01-03: ...") at most one per ``interval`` seconds per stream (stage a,
    stage b, apply), the last line of each kept. Every log line is an event in Dagster's
    storage (a new database connection each with dagster-postgres), and the per-partition
    results are events already (materializations and checks). Lines are written under one
    lock, so the two build threads' lines keep their order."""
    lock = threading.Lock()
    last: dict[str, float] = {}
    held: dict[str, str] = {}  # stream -> its newest line not yet written

    def log(message: str) -> None:
        stream = message.split(":", 1)[0] if message.startswith(("stage ", "apply: ")) else None
        with lock:
            if stream is not None:
                now = time.monotonic()
                if now - last.get(stream, float("-inf")) < interval:
                    held[stream] = message
                    return
                last[stream] = now
                held.pop(stream, None)
                out = [message]
            else:  # a step's own line: the held lines first, so the order holds
                out = [*held.values(), message]
                held.clear()
            for line in out:
                context.log.info(line)

    try:
        yield log
    finally:
        with lock:
            for line in held.values():
                context.log.info(line)


def _factory(context: dg.AssetExecutionContext, spec: Spec):
    resource: PostgresResource = getattr(context.resources, resource_key(spec))
    return resource.factory(f"backfill_assets:{spec.name}:dagster")


def _readings_metadata(fp: dict[str, Any] | Fingerprint) -> dict[str, Any]:
    r = fp.as_dict() if isinstance(fp, Fingerprint) else fp
    return {
        "dagster/row_count": r["row_count"],
        "null_key_count": r["null_key_count"],
        "duplicate_key_count": r["duplicate_key_count"],
        # A float to plot across partitions; the exact decimal as text.
        "total": float(r["total"]) if r["total"] is not None else None,
        "total_exact": r["total"],
        "content_hash": r["content_hash"],
    }


def _schema(columns: list[tuple[str, str]]) -> dg.TableSchema:
    return dg.TableSchema(columns=[dg.TableColumn(name, type_name) for name, type_name in columns])


def _snapshot_id(context: dg.AssetExecutionContext, key: dg.AssetKey) -> str:
    """The snapshot the run's partitions were last snapshotted in (all in the same one)."""
    found: dict[str, str] = {}
    for partition in context.partition_keys:
        records = context.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
        ).records
        if not records or records[0].asset_materialization is None:
            raise SnapshotError(f"partition {partition} has no snapshot yet; materialize {key.to_user_string()} first")
        found[partition] = str(records[0].asset_materialization.metadata["snapshot_id"].value)
    ids = sorted(set(found.values()))
    if len(ids) != 1:
        raise SnapshotError(
            f"partitions {', '.join(found)} were snapshotted separately ({', '.join(ids)}); "
            "snapshot them together, in one run, before building their stages"
        )
    return ids[0]


def _key_check(key: dg.AssetKey, partition: str, fp: Fingerprint, **context: str) -> dg.AssetCheckEvaluation:
    """The key check of one stage partition; ``context`` names the plan, so the dashboard
    leads to the approval."""
    ok = fp.null_key_count == 0 and fp.duplicate_key_count == 0
    return dg.AssetCheckEvaluation(
        asset_key=key, check_name="business_key_unique_and_not_null", passed=ok, partition=partition,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"null_key_count": fp.null_key_count, "duplicate_key_count": fp.duplicate_key_count, **context},
    )


def _side_by_side(a: dict[str, Any], b: dict[str, Any]) -> str:
    rows = ["| reading | stage A | stage B |", "|---|---|---|"]
    for k in a:
        mark = "" if a[k] == b[k] else " **differs**"
        rows.append(f"| {k} | `{a[k]}` | `{b[k]}`{mark} |")
    return "\n".join(rows)


def spec_assets(spec: Spec) -> list[Any]:
    """The asset definitions of one spec."""
    keys = Keys.of(spec)
    parts = partitions_def(spec)
    res = {resource_key(spec)}
    policy = dg.BackfillPolicy.single_run()
    group = spec.name

    def check(name: str, key: dg.AssetKey, description: str, blocking: bool = False) -> dg.AssetCheckSpec:
        return dg.AssetCheckSpec(name, asset=key, description=description, blocking=blocking, partitions_def=parts)

    def _stages_match(partition: str, passed: bool, a: dict[str, Any], b: dict[str, Any],
                      **metadata: Any) -> dg.AssetCheckEvaluation:
        """The blocking check of one partition: stages A and B agree on every reading."""
        return dg.AssetCheckEvaluation(
            asset_key=keys.stage_b, check_name="stages_match", passed=passed, partition=partition,
            severity=dg.AssetCheckSeverity.ERROR, blocking=True,
            metadata={**metadata, "readings": dg.MetadataValue.md(_side_by_side(a, b))},
        )

    source = dg.AssetSpec(
        keys.source, group_name=group, kinds={"postgres"},
        description=f"The source table {spec.source_ref}; read only, never written.",
        metadata={"table": str(spec.source_ref)},
    )

    @dg.multi_asset(
        name=f"{spec.name}__snapshot", partitions_def=parts, backfill_policy=policy, can_subset=True,
        required_resource_keys=res,
        specs=[dg.AssetSpec(keys.snapshot, deps=[keys.source], group_name=group, kinds={"postgres"},
                            description="A fixed copy (or pinned fingerprint) of the source partitions.")],
    )
    def snapshot(context: dg.AssetExecutionContext):
        with transient_retry():
            snap = snapshot_step(spec, list(context.partition_keys), _factory(context, spec), progress=context.log.info)
        yield dg.MaterializeResult(asset_key=keys.snapshot, metadata={
            "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
            "partitions": ", ".join(snap.partitions)})
        for label, readings in snap.partitions.items():
            if parts.has_partition_key(label):
                yield dg.AssetMaterialization(keys.snapshot, partition=label, metadata={
                    "snapshot_id": snap.snapshot_id, "snapshot_fingerprint": snap.fingerprint,
                    "mode": snap.mode, "source_rows": readings["row_count"],
                    "source_hash": readings["content_hash"],
                    "requested": label in snap.requested,
                })

    @dg.multi_asset(
        # Subsettable only so that the per-partition check evaluations below may stand in for
        # the check outputs; the body refuses a selection of one stage.
        name=f"{spec.name}__stages", partitions_def=parts, backfill_policy=policy, can_subset=True,
        required_resource_keys=res,
        specs=[
            dg.AssetSpec(keys.stage_a, deps=[keys.snapshot], group_name=group, kinds={"postgres"},
                         description="Newest row per business key, built with DISTINCT ON."),
            dg.AssetSpec(keys.stage_b, deps=[keys.snapshot], group_name=group, kinds={"postgres"},
                         description="Newest row per business key, built independently with a window "
                                     "function; compared with stage A into a plan."),
        ],
        check_specs=[
            check("business_key_unique_and_not_null", keys.stage_a,
                  "No NULL and no duplicate business key in the stage partition."),
            check("stages_match", keys.stage_b, "Stages A and B agree on every reading.", blocking=True),
            check("business_key_unique_and_not_null", keys.stage_b,
                  "No NULL and no duplicate business key in the stage partition."),
        ],
    )
    def stages(context: dg.AssetExecutionContext):
        """Both builds at once, on two connections, then the plan: one step, as in the CLI.
        (Two steps would run one after the other and read both stages again to plan.)
        With only the stage checks selected, the checks run again on the stages as they are."""
        chosen = context.selected_asset_keys & {keys.stage_a, keys.stage_b}
        if not chosen:
            yield from stage_checks_again(context)
            return
        if chosen != {keys.stage_a, keys.stage_b}:
            raise StageError(
                f"{keys.stage_a.to_user_string()} and {keys.stage_b.to_user_string()} are built "
                "together (two independent builds compared into one plan); select both, or only "
                "their checks to check the stages again without building them"
            )
        snapshot_id = _snapshot_id(context, keys.snapshot)
        with transient_retry(), _progress(context) as progress:
            ctx, plan, built_a, built_b = stages_step(spec, snapshot_id, _factory(context, spec), progress=progress)
        table = dg.MetadataValue.md(plan_markdown(plan.document, plan.plan_id))
        schema = _schema([(c.name, c.type_name) for c in ctx.target_columns])
        common = {"snapshot_id": snapshot_id, "plan_id": plan.plan_id, "plan_status": plan.status}
        entries = [e for e in plan.document["partitions"] if parts.has_partition_key(e["partition"])]
        checks = [
            evaluation for entry in entries for evaluation in (
                _key_check(keys.stage_a, entry["partition"], built_a[entry["partition"]], plan_id=plan.plan_id),
                _key_check(keys.stage_b, entry["partition"], built_b[entry["partition"]], plan_id=plan.plan_id),
                _stages_match(entry["partition"], entry["match"], entry["stage_a"], entry["stage_b"],
                              plan_id=plan.plan_id, plan=table),
            )
        ]
        if plan.status == "refused":
            # The differing partitions' stages were deleted: record no materialization of any
            # partition, only the checks saying why, and fail the step.
            yield from checks
            raise DeterminismError(plan.plan_id, plan.problems)
        yield dg.MaterializeResult(asset_key=keys.stage_a, metadata=common)
        yield dg.MaterializeResult(asset_key=keys.stage_b, metadata={**common, "plan": table})
        for entry in entries:
            for key, side in ((keys.stage_a, "stage_a"), (keys.stage_b, "stage_b")):
                yield dg.AssetMaterialization(key, partition=entry["partition"], metadata={
                    **_readings_metadata(entry[side]), **common, "plan": table, "dagster/column_schema": schema,
                })
        yield from checks

    def stage_checks_again(context: dg.AssetExecutionContext):
        """Only the stage checks selected (a check-only re-execution): evaluate them on both
        stages as they are now, against each other, their builds and the plans; build nothing."""
        if not (context.has_partition_key or context.has_partition_key_range):
            raise StageError("checking the stages again needs the partitions to check; pick them when launching")
        wanted = context.selected_asset_check_keys
        with transient_retry():
            found = read_stages(spec, list(context.partition_keys), _factory(context, spec))
        for state in found:
            about = {"plan_id": state.plan_id or "none", "checked": "the stages as they are, without building"}
            for key, fp in ((keys.stage_a, state.a), (keys.stage_b, state.b)):
                if dg.AssetCheckKey(key, "business_key_unique_and_not_null") in wanted:
                    yield _key_check(key, state.partition, fp, **about)
            if dg.AssetCheckKey(keys.stage_b, "stages_match") in wanted:
                yield _stages_match(state.partition, state.match, state.a.as_dict(), state.b.as_dict(),
                                    **about, **({"problems": "; ".join(state.problems)} if state.problems else {}))

    @dg.multi_asset(
        name=f"{spec.name}__target", partitions_def=parts, backfill_policy=policy, can_subset=True,
        required_resource_keys=res,
        specs=[dg.AssetSpec(keys.target, deps=[keys.stage_a, keys.stage_b], group_name=group, kinds={"postgres"},
                            description=f"{spec.target_ref}: approved partitions replaced from stage A, "
                                        "one verified transaction each.")],
        check_specs=[check("target_matches_approved_plan", keys.target,
                           "After the replace, the target partition carries the approved fingerprint.")],
    )
    def target(context: dg.AssetExecutionContext):
        labels = list(context.partition_keys)
        factory = _factory(context, spec)
        results: list[dict[str, Any]] = []
        plan_id = context.run.tags.get(PLAN_TAG)

        def events(error: BackfillError | None = None):
            for r in results:
                if not parts.has_partition_key(r["partition"]):
                    continue
                meta = {**_readings_metadata(r), "status": r["status"], "plan_id": plan_id}
                yield dg.AssetMaterialization(keys.target, partition=r["partition"], metadata=meta)
                yield dg.AssetCheckEvaluation(
                    asset_key=keys.target, check_name="target_matches_approved_plan", passed=True,
                    partition=r["partition"], metadata={"plan_id": plan_id, "status": r["status"]},
                )
            if error is not None:
                done = {r["partition"] for r in results}
                failed = [getattr(error, "partition", None)] if isinstance(error, VerificationError) else [
                    label for label in labels if label not in done]
                # An approval that no longer covers a partition says why, per partition.
                reasons = error.reasons if isinstance(error, ApprovalOutdatedError) else {}
                for label in failed:
                    reason = reasons.get(label)
                    yield dg.AssetCheckEvaluation(
                        asset_key=keys.target, check_name="target_matches_approved_plan", passed=False,
                        partition=label, severity=dg.AssetCheckSeverity.ERROR,
                        metadata={"plan_id": plan_id or "none", "error": str(error),
                                  **({"reason": reason} if reason else {})},
                    )

        try:
            with transient_retry():
                if plan_id is None:
                    with factory() as conn:
                        plan_id = approved_plan_for(conn, spec, labels)
                with _progress(context) as progress:
                    apply_plan(
                        spec, plan_id, factory, run_id=f"dagster-{context.run.run_id}-{context.retry_number}",
                        only=labels, on_result=results.append, progress=progress,
                    )
        except (ApprovalError, VerificationError) as err:
            yield from events(err)
            raise
        yield dg.MaterializeResult(asset_key=keys.target, metadata={"plan_id": plan_id})
        yield from events()

    return [source, snapshot, stages, target]
