"""Sensors: launch the target for each approval not yet applied; restage partitions whose
source moved on; keep the board of what waits for an approval, and mark previews stale."""


import datetime as dt
import hashlib
import json
import time

import dagster as dg

from backfill_assets.core.build import open_build_engine
from backfill_assets.core.context import Clock, utc_now
from backfill_assets.core.coverage import duration_text, expiry, is_expired, utc_text
from backfill_assets.core.errors import SpecError
from backfill_assets.core.preview import waiting
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store import ledger
from backfill_assets.core.store.audits import latest_audits
from backfill_assets.core.waits import explained_waits
from backfill_assets.dagster_layer import events
from backfill_assets.dagster_layer.names import (
    APPROVAL_TAG,
    BOARD_SENSOR,
    PLAN_TAG,
    RANGE_END,
    RANGE_START,
    UNLAUNCHABLE_JOB,
    UNLAUNCHABLE_OP,
    Keys,
    approval_run_key,
    stages_job_name,
    target_job_name,
    unlaunchable_run_key,
)
from backfill_assets.dagster_layer.partitions import contiguous_segments, partitions_def, run_segments
from backfill_assets.dagster_layer.resources import PostgresResource, resource_key

__all__ = ["approval_sensor", "approvals_board", "segment_request", "source_requests", "source_snapshot_sensor"]


def _factory(context: dg.SensorEvaluationContext, spec: Spec):
    resource: PostgresResource = getattr(context.resources, resource_key(spec))
    return resource.factory(spec, f"backfill_assets:{spec.name}:sensor")


def segment_request(job_name: str, segment: list[str], run_key: str, tags: dict[str, str]) -> dg.RunRequest:
    """One run over contiguous partitions: a partition key, or a range for a single-run backfill."""
    if len(segment) == 1:
        return dg.RunRequest(run_key=run_key, job_name=job_name, partition_key=segment[0], tags=tags)
    return dg.RunRequest(run_key=run_key, job_name=job_name,
                         tags={**tags, RANGE_START: segment[0], RANGE_END: segment[-1]})


def not_launched_request(spec: Spec, approval: dict, reason: str) -> dg.RunRequest:
    """A run of ``approval_not_launched`` that fails with ``reason``: the approval stays
    visible in Runs (one per approval, by its run key), not consumed silently."""
    config = {"spec": spec.name, "approval_id": approval["approval_id"], "plan_id": approval["plan_id"],
              "partitions": approval["partitions"], "reason": reason}
    return dg.RunRequest(
        run_key=unlaunchable_run_key(spec, approval["approval_id"]), job_name=UNLAUNCHABLE_JOB,
        run_config={"ops": {UNLAUNCHABLE_OP: {"config": config}}},
        tags={PLAN_TAG: approval["plan_id"], APPROVAL_TAG: str(approval["approval_id"])},
    )


def approval_requests(
    context: dg.SensorEvaluationContext, spec: Spec, approval: dict, now: dt.datetime,
) -> list[dg.RunRequest]:
    """The target runs of one approval (one per contiguous segment of its partitions, split
    into runs of at most ``max_partitions_per_run`` with the spec's ``parallel``); none
    when it is applied or superseded; a failing report run when it cannot be launched,
    which includes an approval that expired (at ``now``) before the sensor saw it."""
    approval_id, plan_id = approval["approval_id"], approval["plan_id"]
    if approval["applied"] or approval["superseded"]:
        context.log.info(f"approval {approval_id} of plan {plan_id[:16]}: "
                         + ("already applied" if approval["applied"] else "superseded by a newer approval of its plan")
                         + "; not launched")
        return []
    if is_expired(spec, approval["approved_at"], now):
        # Someone approved it expecting it to run (the sensor was stopped, say): a failed run
        # says so where runs are looked at, rather than a line in a tick's log alone.
        reason = (f"it expired at {utc_text(expiry(spec, approval['approved_at']))}, before the sensor launched it "
                  f"(approved at {utc_text(approval['approved_at'])}; approval_expires_after: "
                  f"{duration_text(spec.approval_expires_after)}); review the plan and approve the plan again")
        context.log.warning(f"approval {approval_id} of plan {plan_id[:16]} expired; not launched: {reason}")
        return [not_launched_request(spec, approval, reason)]
    try:
        segments = run_segments(spec, contiguous_segments(partitions_def(spec), approval["partitions"]))
    except SpecError as err:
        context.log.error(f"approval {approval_id} of plan {plan_id[:16]} cannot run: {err}")
        return [not_launched_request(spec, approval, str(err))]
    tags = {PLAN_TAG: plan_id, APPROVAL_TAG: str(approval_id)}
    return [segment_request(target_job_name(spec), segment, approval_run_key(spec, approval_id, n), tags)
            for n, segment in enumerate(segments)]


# The most approvals of one spec a tick reads; the cursor moves past them and the next tick
# (seconds later) goes on from there.
APPROVALS_PER_TICK = 100


def approval_sensor(
    specs: list[Spec], jobs: list, *, clock: Clock = utc_now, per_tick: int = APPROVALS_PER_TICK,
) -> dg.SensorDefinition:
    """For each new approval not yet applied, launch the target for the approved partitions.

    The cursor is the last approval id seen per spec. An approval whose own runs verified all
    its partitions (the CLI applied it, say), or whose plan was approved again since, is
    passed over, so a fresh Dagster instance does not replace the target again. A run key is
    unique to its approval, so approving the same partitions again launches again. An
    approval that cannot be launched becomes a failed run of ``approval_not_launched``; so
    does one that expired before the sensor saw it.

    A tick reads at most ``per_tick`` approvals per spec. With no cursor yet for a spec (a
    fresh instance), only approvals not yet expired at ``clock()`` are read: older ones are
    history (``status`` lists those never applied), not work for this instance.
    """

    @dg.sensor(name="approval_sensor", jobs=jobs, minimum_interval_seconds=5,
               default_status=dg.DefaultSensorStatus.RUNNING,
               required_resource_keys={resource_key(s) for s in specs},
               description="Launches the target for exactly the partitions of each approval not yet applied.")
    def _sensor(context: dg.SensorEvaluationContext):
        cursor = json.loads(context.cursor) if context.cursor else {}
        requests: list[dg.RunRequest] = []
        now = clock()
        for spec in specs:
            fresh = spec.name not in cursor
            since = now - spec.approval_expires_after if fresh else None
            factory = _factory(context, spec)
            # A timeout fails the tick (the next one tries again), naming what it waited for.
            with explained_waits(factory, spec), factory() as conn, factory.control(conn) as control:
                if not store.control_ready(control, spec.control_schema):
                    continue
                new = ledger.approvals_since(control, spec.control_schema, spec.name, cursor.get(spec.name, 0),
                                             limit=per_tick, approved_after=since)
            if since is not None:
                context.log.info(f"{spec.name}: no cursor yet: reading only approvals given after {utc_text(since)} "
                                 "(older ones are expired: approval_expires_after "
                                 f"{duration_text(spec.approval_expires_after)})")
            if len(new) == per_tick:
                context.log.info(f"{spec.name}: read {per_tick} approvals, the most one tick reads; the next tick "
                                 f"goes on after approval {new[-1]['approval_id']}")
            for approval in new:
                cursor[spec.name] = approval["approval_id"]
                requests.extend(approval_requests(context, spec, approval, now))
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


# How long a tick (all specs together) may go on starting fingerprints, in seconds: Dagster
# gives a sensor 60 s by default (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS); what is left is
# fingerprinted at the next tick.
FINGERPRINT_BUDGET_S = 30.0


def _watch_cursor(context: dg.SensorEvaluationContext) -> dict:
    """spec name -> the state its last tick kept; an unreadable cursor (set by hand in the UI,
    say) starts again from nothing, which only costs one full check."""
    try:
        cursor = json.loads(context.cursor) if context.cursor else {}
    except json.JSONDecodeError:
        context.log.warning("the cursor is not JSON; checking every snapshotted partition in full")
        return {}
    return cursor if isinstance(cursor, dict) else {}


def source_requests(spec: Spec, changed: dict[str, str]) -> list[dg.RunRequest]:
    """Stage runs for the partitions whose source changed (label -> new source hash), one per
    contiguous segment (split as ``approval_requests`` splits them); the run key carries the
    new content, so the same change launches once."""
    valid = [label for label in changed if partitions_def(spec).has_partition_key(label)]
    requests = []
    for segment in run_segments(spec, contiguous_segments(partitions_def(spec), valid)) if valid else []:
        state = hashlib.sha256(json.dumps([[k, changed[k]] for k in segment]).encode()).hexdigest()[:16]
        requests.append(segment_request(
            stages_job_name(spec), segment, f"source-{spec.name}-{segment[0]}-{segment[-1]}-{state}", {}
        ))
    return requests


def source_snapshot_sensor(
    specs: list[Spec], jobs: list, *, fingerprint_budget_s: float | None = FINGERPRINT_BUDGET_S,
) -> dg.SensorDefinition:
    """Request the snapshot and both stages again for partitions whose source changed since
    their newest snapshot (a copy that is out of date, or an immutable source that moved).

    A tick reads the source's change counters first and stops there when the table did not
    move; see the build engine's ``source_moves`` (core.engines.postgres.watch for the gates). The
    cursor keeps, per
    spec, what the last tick read (resetting it in the UI makes the next tick check every
    partition in full).
    """

    @dg.sensor(name="source_snapshot_sensor", jobs=jobs, minimum_interval_seconds=300,
               default_status=dg.DefaultSensorStatus.RUNNING,
               required_resource_keys={resource_key(s) for s in specs},
               description="Restages partitions whose source changed since they were snapshotted; "
                           "a tick over an unchanged source reads only its change counters.")
    def _sensor(context: dg.SensorEvaluationContext):
        before, kept = _watch_cursor(context), {}
        requests: list[dg.RunRequest] = []
        deadline = None if fingerprint_budget_s is None else time.monotonic() + fingerprint_budget_s
        for spec in specs:  # the budget is the tick's, shared by its specs
            factory = _factory(context, spec)
            budget = None if deadline is None else max(0.0, deadline - time.monotonic())
            with explained_waits(factory, spec), factory() as conn, open_build_engine(conn, factory, spec) as engine:
                moves = engine.source_moves(before.get(spec.name), budget)
            context.log.info(f"{spec.name}: {moves.summary}")
            for note in moves.notes:
                context.log.warning(f"{spec.name}: {note}")
            if moves.state is not None:  # an engine that keeps no state between ticks gives None
                kept[spec.name] = moves.state
            requests.extend(source_requests(spec, moves.changed))
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(kept, sort_keys=True, separators=(",", ":")))

    return _sensor


# The board is observed again when what it lists changes, and at least this often (its ages).
BOARD_REFRESH_S = 15 * 60


def approvals_board(specs: list[Spec], *, clock: Clock = utc_now) -> dg.SensorDefinition:
    """Per spec, an observation of ``<spec>/approvals``: the ready plans nobody approved yet
    (newest first, with their preview and an approve link), the approvals not yet applied,
    each with its age, and the partitions the newest audit found drifted (with a link that
    plans each again). And the next evaluation of a preview a run made stale: a warning on
    ``target_change_preview`` for each partition of a waiting plan that a verified run replaced
    after its preview was made (once per preview and partition).

    Reads only the control store: no data is read, nothing is launched. The cursor keeps, per
    spec, the board's content hash and time and the stale previews already marked.
    """

    @dg.sensor(name=BOARD_SENSOR, minimum_interval_seconds=10, default_status=dg.DefaultSensorStatus.RUNNING,
               required_resource_keys={resource_key(s) for s in specs},
               description="Lists the plans waiting for an approval and the approvals not yet applied (the "
                           "approvals asset of each spec), and marks change previews stale.")
    def _sensor(context: dg.SensorEvaluationContext):
        try:
            cursor = json.loads(context.cursor) if context.cursor else {}
        except json.JSONDecodeError:
            cursor = {}
        now = clock()
        out: list = []
        kept = {}
        for spec in specs:
            keys, before = Keys.of(spec), cursor.get(spec.name, {})
            factory = _factory(context, spec)
            with explained_waits(factory, spec), factory() as conn, factory.control(conn) as control:
                found = waiting(control, spec, now=now)
                drifted = [a for a in latest_audits(control, spec.control_schema, spec.target_name).values()
                           if a["result"] == "drifted"]
            marked = set(before.get("stale", []))
            still = set()
            parts = partitions_def(spec)
            for plan in found.plans:
                for label in [label for label in plan.stale if parts.has_partition_key(label)]:
                    mark = f"{plan.review_id}:{label}"
                    still.add(mark)
                    if mark not in marked:
                        out.append(events.stale_preview(keys, label, plan.plan_id, plan.review_id, plan.previewed_at))
            board = events.board_markdown(keys, found, now) + events.drifted_markdown(keys, drifted)
            content = hashlib.sha256(json.dumps(
                [[p.plan_id, p.review_id, p.stale] for p in found.plans]
                + [[a.approval_id, a.verified, a.expired] for a in found.approvals]
                + [[d["partition"], utc_text(d["audited_at"])] for d in drifted]).encode()).hexdigest()[:16]
            last = before.get("at", 0.0)
            if content != before.get("content") or now.timestamp() - last >= BOARD_REFRESH_S:
                oldest = min([p.created_at for p in found.plans] + [a.approved_at for a in found.approvals], default=None)
                out.append(dg.AssetObservation(keys.approvals, metadata={
                    "plans_waiting": len(found.plans), "approvals_waiting": len(found.approvals),
                    "partitions_drifted": len(drifted),
                    "oldest_waiting_hours": round((now - oldest).total_seconds() / 3600, 2) if oldest else 0.0,
                    "board": dg.MetadataValue.md(board), "as_of": utc_text(now),
                }))
                last = now.timestamp()
            kept[spec.name] = {"content": content, "at": last, "stale": sorted(still)}
        return dg.SensorResult(asset_events=out, cursor=json.dumps(kept, sort_keys=True))

    return _sensor
