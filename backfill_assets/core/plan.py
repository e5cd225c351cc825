"""The plan: build each partition twice from one snapshot, compare the builds on every
reading, and record what an approver approves.

Nothing here writes to the target. The plan is stored in the control store; its id is a
SHA-256 over the canonical JSON of everything an approver approves (core.fingerprint.identity),
so the same source, spec and partitions always give the same plan id. ``make_plan`` runs the
whole plan side (resolve, snapshot, both builds, compare); ``snapshot_step`` and
``stages_step`` are its two halves for an orchestrator. Each is written once: the spec's build
engine (core.build) reads the source and runs the builds where the data lives.
"""

from __future__ import annotations

from typing import Any

import psycopg

from backfill_assets.core.build import BuildEngine, open_build_engine, snapshot_with_builds
from backfill_assets.core.context import Clock, Context, build_lock, partition_locks, spec_lock, utc_now
from backfill_assets.core.errors import SnapshotError
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.progress import Progress, ProgressEvent, quiet
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest


def make_plan(
    spec: Spec, request: PartitionRequest, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> Plan:
    """Plan a backfill: snapshot, build both stages, compare. Never writes to the target.

    Runs under the spec lock, held for the whole plan.

    Returns the plan, stored in the control store, with status ``ready`` or ``refused``;
    a refused plan's differing stage partitions are removed so nothing can apply them.

    Raises:
        SpecError, ConnectionConfigError, SourceDataError, SnapshotError,
        TransientDatabaseError, ConcurrentRunError.
    """
    with factory() as conn, factory.control(conn) as control, spec_lock(control, spec), \
            open_build_engine(conn, factory, spec, control) as engine:
        progress(ProgressEvent("inspect", f"{spec.source_name} -> {spec.target_name}"))
        return _planned(engine, engine.resolve(request), clock, progress)[2]


def _planned(engine: BuildEngine, ctx: Context, clock: Clock, progress: Progress,
             ) -> tuple[Any, Context, Plan, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Snapshot the context's partitions, build both stages from it and store the plan: the
    snapshot, its context, the plan and the readings of stages A and B."""
    snapshot, ctx = engine.take_snapshot(ctx, clock, progress)
    snapshot, a, b = engine.build_both(ctx, snapshot, clock, progress)
    return snapshot, ctx, engine.finish_plan(ctx, snapshot, a, b, clock, progress), a, b


def snapshot_step(
    spec: Spec, request: PartitionRequest | list[str], factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> Any:
    """Step 1 on its own (for an orchestrator): inspect, check and snapshot the partitions.

    A spec with ``parallel`` snapshots at once with its other builds of other partitions
    (core.context.build_lock), each holding its own partitions.

    Raises:
        SnapshotError: the spec's snapshot lives only as long as its step (``snapshot:
            exported``): take it with the builds, :func:`plan_step`.
    """
    if snapshot_with_builds(spec):
        raise SnapshotError(
            f"spec {spec.name} takes its snapshot with its builds (snapshot: exported): plan, or build the "
            "stages with the snapshot in one step; declare `snapshot: copy` to take it in a step of its own"
        )
    with factory() as conn, factory.control(conn) as control, build_lock(control, spec), \
            open_build_engine(conn, factory, spec, control) as engine:
        ctx = engine.resolve(request)
        with partition_locks(control, spec, ctx.labels):
            snapshot, _ = engine.take_snapshot(ctx, clock, progress)
            return snapshot


def stages_step(
    spec: Spec, snapshot_id: str, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> tuple[Context, Plan, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Steps 2 and 3 for an orchestrator: build both stages from a recorded snapshot, compare
    them and store the plan, as make_plan does after its snapshot.

    A spec with ``parallel`` builds at once with its other builds of other partitions
    (core.context.build_lock): each holds the partitions of its snapshot.

    Returns the snapshot's context, the plan, and the readings of stages A and B.
    """
    with factory() as conn, factory.control(conn) as control, build_lock(control, spec), \
            open_build_engine(conn, factory, spec, control) as engine:
        snapshot, ctx = engine.load_snapshot(snapshot_id)
        with partition_locks(control, spec, ctx.labels):
            snapshot, a, b = engine.build_both(ctx, snapshot, clock, progress)
            return ctx, engine.finish_plan(ctx, snapshot, a, b, clock, progress), a, b


def plan_step(
    spec: Spec, labels: list[str], factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = quiet,
) -> tuple[Any, Context, Plan, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Steps 1 to 3 in one step for an orchestrator, when the snapshot lives only as long as
    the step taking it (core.build.snapshot_with_builds): :func:`make_plan` under the locks
    of a build step (:func:`snapshot_step`, :func:`stages_step`).

    Returns the snapshot, its context, the plan, and the readings of stages A and B.
    """
    with factory() as conn, factory.control(conn) as control, build_lock(control, spec), \
            open_build_engine(conn, factory, spec, control) as engine:
        ctx = engine.resolve(labels)
        with partition_locks(control, spec, ctx.labels):
            return _planned(engine, ctx, clock, progress)


def snapshot_covering(conn: psycopg.Connection, spec: Spec, labels: list[str], *,
                      take_hint: str = "take a snapshot of them first") -> str:
    """The snapshot the partitions were last snapshotted in (for building their stages in a
    separate step), read in the control schema: the
    newest snapshot of each, when that is one snapshot; else the newest snapshot holding them
    all with the source content of each one's newest snapshot (they were snapshotted together
    again since, with the same data).

    Raises:
        SnapshotError: a partition has no snapshot; or their newest snapshots differ in data
            and no one snapshot holds them all as they are (snapshotted separately).
    """
    schema, source, by = spec.control_schema, spec.source_name, spec.partition_by
    newest = store.newest_snapshots(conn, schema, source, by, labels) if store.control_ready(conn, schema) else {}
    missing = [label for label in labels if label not in newest]
    if missing:
        raise SnapshotError(f"partition {missing[0]} has no snapshot yet; {take_hint}")
    ids = sorted({newest[label][0] for label in labels})
    together = ids[0] if len(ids) == 1 else store.snapshot_with(
        conn, schema, source, by, {label: newest[label][1] for label in labels})
    if together is None:
        raise SnapshotError(
            f"partitions {', '.join(labels)} were snapshotted separately ({', '.join(ids)}); "
            "snapshot them together, in one run, before building their stages"
        )
    return together
