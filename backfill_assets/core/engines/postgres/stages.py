"""The two builds: stage A (DISTINCT ON) and stage B (a row_number() window), built at once
on two connections from one snapshot, each partition fingerprinted and sealed as it is built.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import psycopg
from psycopg import sql

from backfill_assets.core.context import Clock, Context, set_local
from backfill_assets.core.engines.postgres.snapshot import (
    SEAL_HORIZON,
    Snapshot,
    copy_problem,
    immutable_source_changes,
)
from backfill_assets.core.engines.postgres.staged import staged
from backfill_assets.core.errors import SnapshotError, StageError, VerificationError
from backfill_assets.core.fingerprint.partition import written
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order, table_columns
from backfill_assets.core.pg.db import ConnectionFactory, read_committed, transient_errors
from backfill_assets.core.planning import compare_readings
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionValue, TableRef, partition_label


def ensure_stage(conn: psycopg.Connection, ctx: Context, variant: str) -> TableRef:
    """Create the stage table (unlogged, the target's column types, a unique index on the grain
    in business-key order); recreate it if the target's columns changed since it was made.

    The unique index makes a build that breaks the grain fail loudly, lets the fingerprint
    skip counting duplicates, and gives a partition in key order (a lake target's copy, diff)."""
    stage = ctx.stage(variant)
    expected = [(c.name, c.type_name) for c in ctx.target_columns]
    with conn.transaction():
        current = [(c.name, c.type_name) for c in table_columns(conn, stage)]
        unique = conn.execute(*sqlbuild.has_unique_index(stage)).fetchone()
        if current != expected or not (unique and unique[0]):
            conn.execute(sqlbuild.drop_table(stage))
            conn.execute(staged(ctx).stage_table(ctx, stage))
            made = [(c.name, c.type_name) for c in table_columns(conn, stage)]
            if made != expected:  # the input's types as a table differ from its description
                raise StageError(
                    f"stage {stage} was created with columns {made}, not {expected}; cast the "
                    "transform's output columns to plain types"
                )
            keys = [sqlbuild.OrderKey(ctx.spec.partition_key)] + business_key_order(ctx.target_columns, ctx.spec.business_key)
            conn.execute(sqlbuild.create_index(stage, keys, unique=True))
    return stage


_SYNC_COMMIT_OFF = sql.SQL("SELECT set_config('synchronous_commit', 'off', true)")


def build_partition(
    conn: psycopg.Connection, ctx: Context, snapshot: Snapshot, variant: Literal["a", "b"],
    partition: PartitionValue, clock: Clock,
) -> Fingerprint:
    """Rebuild one partition of one stage, fingerprint it as it is written and record the build
    with its seal, in one transaction.

    The seal is the transaction that wrote the partition's rows (their xmin, None when it is
    empty) and the same transaction's 64-bit id: see :func:`stage_partitions_changed`.

    The commit does not wait for its WAL to reach disk (``synchronous_commit`` off for this
    transaction only): the stage is an unlogged table, which a server crash empties anyway,
    and a build record lost with it only means that partition is fingerprinted in full, and
    refused, by the approval or apply that reads it next."""
    spec = ctx.spec
    stage = ctx.stage(variant)
    label = partition_label(partition)
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    with transient_errors(f"building stage {variant} of partition {label}"), conn.transaction():
        conn.execute(_SYNC_COMMIT_OFF)
        conn.execute(*sqlbuild.delete_partition(stage, spec.partition_key, partition))
        insert = sqlbuild.build_stage(
            variant, stage, input_rel, spec.columns, spec.partition_key, spec.business_key,
            ctx.ordering_keys(), {"partitions": ctx.partitions}, partition,
            moving=spec.records_can_move,
        )
        # The readings of the rows as they are written, in the same statement (the stage's
        # unique index rules duplicates out).
        readings = written(conn, insert, ctx.target_columns, spec.business_key, spec.total, utf8=ctx.utf8)
        writer = conn.execute(*sqlbuild.partition_writer(stage, spec.partition_key, partition)).fetchone()
        txid = conn.execute(sqlbuild.current_txid()).fetchone()
        assert txid is not None
        store.record_build(
            conn, spec.control_schema, spec_name=spec.name, variant=variant, partition=label,
            snapshot_id=snapshot.snapshot_id, readings=readings.as_dict(),
            writer_xid=writer[0] if writer else None, writer_txid=int(txid[0]), built_at=clock(),
        )
        return readings


def build_stage(
    conn: psycopg.Connection, ctx: Context, snapshot: Snapshot, variant: Literal["a", "b"],
    clock: Clock, progress: Progress,
) -> dict[str, Fingerprint]:
    """Build every partition of one stage from the snapshot, and record each build."""
    out: dict[str, Fingerprint] = {}
    step, total = f"stage {variant}", len(ctx.partitions)
    ensure_stage(conn, ctx, variant)
    progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
    for n, (p, label) in enumerate(zip(ctx.partitions, ctx.labels), 1):
        out[label] = build_partition(conn, ctx, snapshot, variant, p, clock)
        rows = out[label].row_count
        progress(ProgressEvent(step, f"{rows} row(s)", partition=label, done=n, total=total, rows=rows,
                               status="built"))
    return out


def stage_partitions_changed(
    conn: psycopg.Connection, ctx: Context, variant: str, expected: dict[str, dict[str, Any]],
) -> list[str]:
    """The partitions of a stage that no longer carry the ``expected`` readings (label ->
    readings, for some or all of the context's partitions), in the caller's transaction.

    A partition whose latest build recorded exactly those readings, and whose rows are still
    all the ones that build's transaction wrote (same count, same xmin: any UPDATE, INSERT or
    DELETE breaks that), is unchanged without being hashed again: one pass without a sort.
    A seal older than :data:`SEAL_HORIZON` transactions (its 32-bit xmin could have come round
    again), or recorded without its 64-bit id by an older version, does not hold. Any other
    partition is fingerprinted and compared in full, so the answer is the same as hashing
    every partition, unless the data files themselves were damaged (what apply copies from a
    stage into the target is fingerprinted in full before it is committed)."""
    spec, stage = ctx.spec, ctx.stage(variant)
    built = store.builds(conn, spec.control_schema, spec.name, variant, [label for label in ctx.labels if label in expected])
    changed = []
    for value, label in zip(ctx.partitions, ctx.labels):
        if label not in expected:
            continue
        readings, writer, since = built.get(label, (None, None, None))
        if readings == expected[label] and since is not None and since < SEAL_HORIZON:
            query, params = sqlbuild.partition_seal_check(stage, spec.partition_key, value, writer)
            row = conn.execute(query, params).fetchone()
            if row is not None and (int(row[0]), int(row[1])) == (expected[label]["row_count"], 0):
                continue
        if ctx.readings(conn, stage, value).as_dict() != expected[label]:
            changed.append(label)
    return changed


def build_both(
    ctx: Context, snapshot: Snapshot, factory: ConnectionFactory, clock: Clock, progress: Progress,
) -> tuple[dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B at once, each on its own connection, and fingerprint them.

    A copied snapshot is locked against writers for the whole of both builds, and its seal
    checked under that lock, so both builds read exactly the rows the snapshot fingerprinted
    (the snapshot may have been taken long before, in another step).

    Raises:
        SnapshotError: the copy changed since the snapshot was taken.
    """

    def build(variant: Literal["a", "b"]) -> dict[str, Fingerprint]:
        with factory() as own:
            return build_stage(own, ctx, snapshot, variant, clock, progress)

    with factory() as guard, transient_errors("locking the snapshot copy"), read_committed(guard):
        if not snapshot.filtered:
            # The guard waits, idle in its transaction, for both builds.
            set_local(guard, "idle_in_transaction_session_timeout", "0")
            guard.execute(sqlbuild.lock_against_writers(snapshot.relation))
            problem = copy_problem(guard, ctx, snapshot.relation, snapshot.fingerprint)
            if problem is not None:
                raise SnapshotError(
                    f"the copy {snapshot.relation} of snapshot {snapshot.snapshot_id} {problem}; "
                    "take the snapshot again (plan again)"
                )
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="stage") as pool:
            a, b = pool.submit(build, "a"), pool.submit(build, "b")
            return a.result(), b.result()


def recheck_stage(conn: psycopg.Connection, ctx: Context, stored: Plan, labels: list[str]) -> None:
    """Stage A's partitions, and an immutable source's, must still carry what was approved.

    Raises:
        VerificationError: naming the partition and both readings.
    """
    stage = ctx.stage("a")
    approved = {label: stored.approved(label) for label in labels}
    # No writer can touch the stage until the commit; its seal (or, where the seal does not
    # hold, a full fingerprint) says whether it still holds what was approved. The rows it
    # gives the target are fingerprinted again before the commit, whatever this says.
    conn.execute(sqlbuild.lock_against_writers(stage))
    for label in stage_partitions_changed(conn, ctx, "a", approved):
        compare_readings({label: approved[label]}, {label: ctx.readings(conn, stage, ctx.value_of(label)).as_dict()},
                 "recheck of the approved stage")
    if ctx.spec.source.snapshot == "immutable":  # only these partitions
        for label, (planned, now) in immutable_source_changes(conn, ctx, stored.pinned_source(labels)).items():
            raise VerificationError(
                label, "recheck of the immutable source",
                f"hash {planned['content_hash'][:16]}", f"hash {now['content_hash'][:16]}",
            )
