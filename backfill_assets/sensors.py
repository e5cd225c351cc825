"""Sensors: launch the target for each new approval; restage partitions whose source moved on."""


import hashlib
import json

import dagster as dg

from backfill_assets.assets import APPROVAL_TAG, PLAN_TAG
from backfill_assets.core import control
from backfill_assets.core.errors import SpecError
from backfill_assets.core.plan import source_changes
from backfill_assets.core.spec import Spec
from backfill_assets.jobs import stages_job_name, target_job_name
from backfill_assets.partitions import contiguous_segments, partitions_def
from backfill_assets.resources import PostgresResource, resource_key

RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def _factory(context: dg.SensorEvaluationContext, spec: Spec):
    resource: PostgresResource = getattr(context.resources, resource_key(spec))
    return resource.factory(f"backfill_assets:{spec.name}:sensor")


def segment_request(job_name: str, segment: list[str], run_key: str, tags: dict[str, str]) -> dg.RunRequest:
    """One run over contiguous partitions: a partition key, or a range for a single-run backfill."""
    if len(segment) == 1:
        return dg.RunRequest(run_key=run_key, job_name=job_name, partition_key=segment[0], tags=tags)
    return dg.RunRequest(run_key=run_key, job_name=job_name,
                         tags={**tags, RANGE_START: segment[0], RANGE_END: segment[-1]})


def approval_sensor(specs: list[Spec], jobs: list) -> dg.SensorDefinition:
    """For each new approval, launch the target for the approved partitions.

    The cursor is the last approval id seen per spec; a run key is unique to its approval, so
    approving the same partitions again launches again.
    """

    @dg.sensor(name="approval_sensor", jobs=jobs, minimum_interval_seconds=5,
               default_status=dg.DefaultSensorStatus.RUNNING,
               required_resource_keys={resource_key(s) for s in specs},
               description="Launches the target for exactly the partitions of each new approval.")
    def _sensor(context: dg.SensorEvaluationContext):
        cursor = json.loads(context.cursor) if context.cursor else {}
        requests: list[dg.RunRequest] = []
        for spec in specs:
            with _factory(context, spec)() as conn:
                if not control.control_ready(conn, spec.control_schema):
                    continue
                new = control.approvals_after(conn, spec.control_schema, spec.name, cursor.get(spec.name, 0))
            for approval_id, plan_id, labels in new:
                cursor[spec.name] = approval_id
                try:
                    segments = contiguous_segments(partitions_def(spec), labels)
                except SpecError as err:
                    context.log.error(f"approval {approval_id} of plan {plan_id[:16]} cannot run: {err}")
                    continue
                tags = {PLAN_TAG: plan_id, APPROVAL_TAG: str(approval_id)}
                for n, segment in enumerate(segments):
                    requests.append(segment_request(
                        target_job_name(spec), segment, f"approval-{spec.name}-{approval_id}-{n}", tags
                    ))
        return dg.SensorResult(run_requests=requests, cursor=json.dumps(cursor, sort_keys=True))

    return _sensor


def source_snapshot_sensor(specs: list[Spec], jobs: list) -> dg.SensorDefinition:
    """Request the snapshot and both stages again for partitions whose source changed since
    their newest snapshot (a copy that is out of date, or an immutable source that moved)."""

    @dg.sensor(name="source_snapshot_sensor", jobs=jobs, minimum_interval_seconds=300,
               default_status=dg.DefaultSensorStatus.RUNNING,
               required_resource_keys={resource_key(s) for s in specs},
               description="Restages partitions whose source changed since they were snapshotted.")
    def _sensor(context: dg.SensorEvaluationContext):
        requests: list[dg.RunRequest] = []
        for spec in specs:
            with _factory(context, spec)() as conn:
                changed = source_changes(conn, _factory(context, spec), spec)
            valid = [label for label in changed if partitions_def(spec).has_partition_key(label)]
            for segment in contiguous_segments(partitions_def(spec), valid) if valid else []:
                state = hashlib.sha256(json.dumps([[k, changed[k]] for k in segment]).encode()).hexdigest()[:16]
                requests.append(segment_request(
                    stages_job_name(spec), segment, f"source-{spec.name}-{segment[0]}-{segment[-1]}-{state}", {}
                ))
        return dg.SensorResult(run_requests=requests)

    return _sensor
