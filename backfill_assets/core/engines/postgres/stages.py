"""The two builds: stage A (DISTINCT ON) and stage B (a row_number() window), built at once
on two connections from one snapshot, each partition fingerprinted and sealed as it is built.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Literal

import psycopg
from psycopg import sql

from backfill_assets.core.context import Clock, set_local
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.copies import SEAL_HORIZON, copy_problem, input_copy_problems
from backfill_assets.core.engines.postgres.exported import exported_identity, record_exported
from backfill_assets.core.engines.postgres.snapshot import Snapshot, immutable_source_changes
from backfill_assets.core.engines.postgres.staged import staged
from backfill_assets.core.errors import SnapshotError, StageError, VerificationError
from backfill_assets.core.fingerprint.partition import written, written_partitions
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order, describe_query, has_ordered_index, table_columns
from backfill_assets.core.pg.db import ConnectionFactory, imported_snapshot, read_committed, transient_errors
from backfill_assets.core.planning import compare_readings
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import TableRef


def ensure_stage(conn: psycopg.Connection, ctx: PostgresContext, variant: str) -> TableRef:
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


@dataclass(frozen=True)
class Built:
    """One stage partition as built: its readings and its seal (the transaction that wrote
    its rows: their xmin, None when it is empty or nothing was written, and the same
    transaction's 64-bit id), and whether its rows were ``kept`` in the stage (not: hashed
    as they were built, and not written)."""

    label: str
    readings: Fingerprint
    writer_xid: str | None
    writer_txid: int
    kept: bool = True

    def record(self, conn: psycopg.Connection, ctx: PostgresContext, variant: str, snapshot_id: str, clock: Clock) -> None:
        store.record_build(
            conn, ctx.spec.control_schema, spec_name=ctx.spec.name, variant=variant, partition=self.label,
            snapshot_id=snapshot_id, readings=self.readings.as_dict(),
            writer_xid=self.writer_xid, writer_txid=self.writer_txid, kept=self.kept, built_at=clock(),
        )


def b_hashed_only(conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot) -> bool:
    """Whether stage B can be hashed as it is built without being written: the build's
    columns have exactly the stage's types (modifiers included), so the rows it selects are
    the rows an INSERT would store. Where a column would be converted on the way in (an
    assignment cast, laxer or stricter than any a SELECT can spell), stage B is written."""
    spec = ctx.spec
    input_rel = sqlbuild.input_relation(snapshot.relation, ctx.source_column_names, ctx.by,
                                        spec.input_columns, ctx.transform, filtered=False, escape_percent=False,
                                        inputs=ctx.inputs)
    described = [(c.name, c.type_name) for c in describe_query(conn, sqlbuild.describe_input(input_rel, spec.columns))]
    return described == [(c.name, c.type_name) for c in ctx.target_columns]


# A stage build writes consecutive partitions together, one statement and one transaction,
# while they hold at most this many input rows (and at most BUILD_BATCH_PARTITIONS of them):
# small partitions then cost a statement, not a statement each; a large one is built alone.
# A source read in place without an index on the partition key is read by one statement per
# stage instead: each statement would scan the whole table (figure 3 in BENCHMARKS.md).
BUILD_BATCH_ROWS = 200_000
BUILD_BATCH_PARTITIONS = 256


def build_batches(ctx: PostgresContext, snapshot: Snapshot, *, indexed: bool = True) -> list[list[int]]:
    """The partitions of the context (their indexes) grouped for building: consecutive ones
    while they hold at most :data:`BUILD_BATCH_ROWS` input rows, as the source checks counted
    them (or the snapshot's rows); all of them at once when the relation read has no index
    on the partition key (not ``indexed``). Records that can move are built one partition at
    a time (their newest version is chosen across partitions)."""
    if ctx.spec.records_can_move:
        return [[i] for i in range(len(ctx.labels))]
    if not indexed:
        return [list(range(len(ctx.labels)))]
    counted = snapshot.reports or {}
    pinned = snapshot.partitions
    rows = [counted[label][0] if label in counted else int(pinned[label]["row_count"]) if label in pinned else 0
            for label in ctx.labels]
    batches: list[list[int]] = []
    held = 0
    for i, n in enumerate(rows):
        if batches and held + n <= BUILD_BATCH_ROWS and len(batches[-1]) < BUILD_BATCH_PARTITIONS:
            batches[-1].append(i)
            held += n
        else:
            batches.append([i])
            held = n
    return batches


def build_batch(
    conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot, variant: Literal["a", "b"],
    batch: list[int], clock: Clock, *, keep: bool = True, empty_first: bool = True,
) -> list[Built]:
    """Rebuild some partitions of one stage (indexes into the context's) and fingerprint each
    as it is written, in one transaction; with a snapshot identified already, record each
    build with its seal in the same transaction (an exported snapshot's builds are recorded
    once it is identified, see :func:`build_both`). Not ``keep``: the partitions' rows are
    hashed as they are built and not written (the stage's partitions are emptied). Not
    ``empty_first``: the partitions are known empty (a hashed build emptied them) and are
    not deleted from again.

    The seal is the transaction that wrote the partitions' rows: see
    :func:`stage_partitions_changed`. An exported snapshot is imported as the transaction's
    first statement, so the build reads exactly the rows the plan's snapshot holds.

    The commit does not wait for its WAL to reach disk (``synchronous_commit`` off for this
    transaction only): the stage is an unlogged table, which a server crash empties anyway,
    and a build record lost with it only means that partition is fingerprinted in full, and
    refused, by the approval or apply that reads it next."""
    spec = ctx.spec
    stage = ctx.stage(variant)
    into = stage if keep else None
    values = [ctx.partitions[i] for i in batch]
    labels = [ctx.labels[i] for i in batch]
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    params = ctx.bound()
    reading = conn.transaction() if snapshot.exported is None else imported_snapshot(conn, snapshot.exported)
    what = f"building stage {variant} of partition{'s' if len(batch) > 1 else ''} {', '.join(labels)}"
    with transient_errors(what), reading:
        conn.execute(_SYNC_COMMIT_OFF)
        # The readings of the rows as they are written, in the same statement (the stage's
        # unique index rules duplicates out; a build not kept has none by construction).
        if empty_first:
            conn.execute(*sqlbuild.delete_partitions(stage, ctx.by, values))
        if spec.records_can_move:
            (value,) = values
            query = sqlbuild.build_stage(variant, into, input_rel, spec.columns, ctx.by, spec.business_key,
                                         ctx.ordering_keys(), params, value, moving=True)
            readings = [written(conn, query, ctx.target_columns, spec.business_key, spec.total, utf8=ctx.utf8,
                                inserts=keep)]
        else:
            query = sqlbuild.build_stage_batch(variant, into, input_rel, spec.columns, ctx.by,
                                               spec.business_key, ctx.ordering_keys(), params, values)
            readings = written_partitions(conn, query, ctx.target_columns, ctx.by, spec.business_key,
                                          spec.total, values, utf8=ctx.utf8, inserts=keep)
        txid = conn.execute(sqlbuild.current_txid()).fetchone()
        assert txid is not None
        # The build is a transaction of its own (the connection commits each statement
        # otherwise), so its rows carry its 32-bit xid: the low half of the 64-bit id.
        writer = str(int(txid[0]) & 0xFFFFFFFF)
        built = [Built(label, r, writer if r.row_count and keep else None, int(txid[0]), keep)
                 for label, r in zip(labels, readings)]
        if snapshot.exported is None:
            for each in built:
                each.record(conn, ctx, variant, snapshot.snapshot_id, clock)
        return built


def build_stage(
    conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot, variant: Literal["a", "b"],
    clock: Clock, progress: Progress, *, keep: bool = True,
) -> dict[str, Built]:
    """Build every partition of one stage from the snapshot (:func:`build_batches`); not
    ``keep``: hashed as they are built, not written."""
    out: dict[str, Built] = {}
    step, total = f"stage {variant}", len(ctx.partitions)
    ensure_stage(conn, ctx, variant)
    progress(ProgressEvent(step, f"building {total} partition(s)", done=0, total=total, status="started"))
    # A copy has an index on the partition key; a source read in place may not.
    indexed = not snapshot.filtered or has_ordered_index(conn, snapshot.relation, ctx.spec.partition_key, [])
    for batch in build_batches(ctx, snapshot, indexed=indexed):
        for built in build_batch(conn, ctx, snapshot, variant, batch, clock, keep=keep):
            out[built.label] = built
            rows = built.readings.row_count
            progress(ProgressEvent(step, f"{rows} row(s)", partition=built.label, done=len(out), total=total,
                                   rows=rows, status="built"))
    return out


def keep_differing(
    conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot, a: dict[str, Built], b: dict[str, Built], clock: Clock,
) -> dict[str, Built]:
    """Stage B's builds, with each partition that was hashed only and differs from stage A
    built again and written (from the same snapshot, still held), so that the differing keys
    can be shown. The plan compares the first builds' readings: a second build that happens
    to equal stage A does not hide the first difference."""
    differing = [i for i, label in enumerate(ctx.labels) if not b[label].kept and b[label].readings != a[label].readings]
    if not differing:
        return b
    batches = [[i] for i in differing] if ctx.spec.records_can_move else [differing]
    # The hashed build emptied these partitions and committed; a DELETE here, in a transaction
    # that imports the plan's older snapshot, would find those rows deleted since it and fail
    # to serialize. Nothing else writes a stage while the plan holds the spec's lock.
    again = {built.label: built for batch in batches
             for built in build_batch(conn, ctx, snapshot, "b", batch, clock, empty_first=False)}
    return {**b, **again}


def stage_partitions_changed(
    conn: psycopg.Connection, ctx: PostgresContext, variant: str, expected: dict[str, Reading],
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
            query, params = sqlbuild.partition_seal_check(stage, ctx.by, value, writer)
            row = conn.execute(query, params).fetchone()
            if row is not None and (int(row[0]), int(row[1])) == (expected[label]["row_count"], 0):
                continue
        if ctx.readings(conn, stage, value).as_dict() != expected[label]:
            changed.append(label)
    return changed


def build_both(
    ctx: PostgresContext, snapshot: Snapshot, factory: ConnectionFactory, clock: Clock, progress: Progress,
) -> tuple[Snapshot, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Build stages A and B at once, each on its own connection, and fingerprint them.

    Stage B is hashed as it is built and written only where it differs from stage A
    (:func:`b_hashed_only`, :func:`keep_differing`): the plan compares fingerprints, and only a
    difference needs B's rows, to show the differing keys.

    A copied snapshot is locked against writers for the whole of both builds, and its seal
    checked under that lock, so both builds read exactly the rows the snapshot fingerprinted
    (the snapshot may have been taken long before, in another step). An exported snapshot is
    imported by every build transaction; once the first build is done, the source is
    fingerprinted in the same snapshot (while the other build still runs), which identifies
    the snapshot, and the snapshot and the builds are recorded together.

    Returns:
        The snapshot (an exported one now identified), and the readings of stages A and B.

    Raises:
        SnapshotError: the copy changed since the snapshot was taken.
    """
    if snapshot.exported is not None:
        return _build_exported(ctx, snapshot, factory, clock, progress)

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
            for read in ctx.inputs:  # the other inputs' copies, held and checked alike
                guard.execute(sqlbuild.lock_against_writers(read.table))
            problems = input_copy_problems(guard, ctx, snapshot.inputs)
            if problems:
                raise SnapshotError(f"{'; '.join(problems)}: take the snapshot again (plan again)")
        a, b, _ = _both(ctx, snapshot, factory, clock, progress, b_hashed_only(guard, ctx, snapshot))
        with factory() as own:
            keep_differing(own, ctx, snapshot, a, b, clock)
    return snapshot, _readings(a), _readings(b)


def _readings(built: dict[str, Built]) -> dict[str, Fingerprint]:
    return {label: each.readings for label, each in built.items()}


def _both(
    ctx: PostgresContext, snapshot: Snapshot, factory: ConnectionFactory, clock: Clock, progress: Progress, hash_b: bool,
    then: Callable[[], Snapshot] | None = None,
) -> tuple[dict[str, Built], dict[str, Built], Snapshot | None]:
    """Both stages built at once on connections of their own (B not kept if ``hash_b``); with
    ``then``, it runs on a third once the first build is done, while the other still runs (the
    two cores stay busy), and its result is returned last."""

    def build(variant: Literal["a", "b"]) -> dict[str, Built]:
        with factory() as own:
            return build_stage(own, ctx, snapshot, variant, clock, progress, keep=variant == "a" or not hash_b)

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="stage") as pool:
        builds = {variant: pool.submit(build, variant) for variant in ("a", "b")}
        after = None
        if then is not None:
            done, _ = wait(builds.values(), return_when=FIRST_COMPLETED)
            for future in done:
                future.result()  # a build that failed stops the plan before the source is read again
            after = pool.submit(then)
        return builds["a"].result(), builds["b"].result(), None if after is None else after.result()


def _build_exported(
    ctx: PostgresContext, snapshot: Snapshot, factory: ConnectionFactory, clock: Clock, progress: Progress,
) -> tuple[Snapshot, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """:func:`build_both` from an exported snapshot (the caller holds its transaction open).
    The source is fingerprinted on a connection of its own once the first build is done."""
    assert snapshot.exported is not None
    exported_name = snapshot.exported

    def identify() -> Snapshot:
        progress(ProgressEvent("snapshot", f"fingerprinting {len(ctx.partitions)} source partition(s)"))
        with factory() as own, transient_errors("fingerprinting the source"), \
                imported_snapshot(own, exported_name, read_only=True):
            return exported_identity(own, ctx, snapshot)

    with factory() as conn:
        hash_b = b_hashed_only(conn, ctx, snapshot)
        a, b, identified = _both(ctx, snapshot, factory, clock, progress, hash_b, then=identify)
        assert identified is not None
        kept = keep_differing(conn, ctx, snapshot, a, b, clock)
        with transient_errors("recording the snapshot and the builds"), conn.transaction():
            record_exported(conn, ctx, identified, clock)
            for variant, stage_builds in (("a", a), ("b", kept)):
                for built in stage_builds.values():
                    built.record(conn, ctx, variant, identified.snapshot_id, clock)
    progress(ProgressEvent("snapshot", f"{identified.snapshot_id}: read in one exported snapshot", status="taken"))
    return identified, _readings(a), _readings(b)


def recheck_stage(conn: psycopg.Connection, ctx: PostgresContext, stored: Plan, labels: list[str]) -> None:
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
