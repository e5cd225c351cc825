"""``snapshot: exported``: the source read in one MVCC snapshot that the plan holds while both
builds import it (docs/reliability.md, "The exported snapshot"). Nothing is copied; the
snapshot is identified after the builds, by the same digest a copy is named by."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import psycopg

from backfill_assets.core.context import Clock, set_local
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.inputs import input_pins, repeated_join_keys
from backfill_assets.core.engines.postgres.snapshot import (
    Snapshot,
    check_source,
    identity_of,
    scope_document,
    source_fingerprints,
    source_held,
)
from backfill_assets.core.errors import TiedRowsError
from backfill_assets.core.pg.db import ConnectionFactory, export_snapshot, transient_errors
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.store import control as store
from backfill_assets.core.store.inputs import record_inputs


@contextlib.contextmanager
def exported(conn: psycopg.Connection, factory: ConnectionFactory, ctx: PostgresContext,
             progress: Progress) -> Iterator[Snapshot]:
    """``snapshot: exported``: hold one REPEATABLE READ transaction on a connection of its
    own while the caller builds, with its snapshot exported for the builds to import, and the
    source checked in it. Nothing is copied: the source's rows as that transaction sees them
    are the snapshot, kept by the server (MVCC) until the transaction ends; the source is
    locked as a SELECT locks it before the snapshot is taken (:func:`source_held`). The
    snapshot's id is taken after the first build ends (:func:`exported_identity`), in the same
    snapshot.

    Raises:
        SourceDataError: the source fails its checks (nothing is built).
    """
    spec = ctx.spec
    if not store.control_ready(conn, spec.control_schema):
        with transient_errors("creating the control schema"), conn.transaction():
            store.ensure_control_schema(conn, spec.control_schema)
    with factory() as holder, contextlib.ExitStack() as held:
        with transient_errors("taking the snapshot"):
            held.enter_context(source_held(holder, spec.source_ref, *[i.table for i in ctx.inputs], read_only=True))
            # The holder waits, idle in its transaction, for both builds.
            set_local(holder, "idle_in_transaction_session_timeout", "0")
            name = export_snapshot(holder)
            progress(ProgressEvent("snapshot", f"holding one snapshot of {spec.source_ref} for both builds",
                                   status="exported"))
            try:
                reports = check_source(holder, ctx, ctx.input_relation(spec.source_ref, filtered=True),
                                       ctx.bound())
            except TiedRowsError as err:
                repeated = repeated_join_keys(holder, ctx)
                if not repeated:
                    raise
                raise TiedRowsError(  # a join that repeats a key, not a missing tiebreak
                    f"{err.problem}: the transform's join repeats source rows, as {'; '.join(repeated)}",
                    "Join each input on a key it holds once (a dimension's current row, or aggregate it first); a "
                    "tiebreak column would hide the repeated rows, not remove them", err.examples) from None
        yield Snapshot("", "exported", spec.source_ref, True, "", {}, ctx.labels, exported=name, reports=reports)


def exported_identity(conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot) -> Snapshot:
    """Fingerprint the source's partitions in an exported snapshot (``conn`` in a transaction
    that imported it) and name the snapshot by them, as a copy is named: the same source
    gives the same id. The source sensor compares the source with these fingerprints."""
    parts = source_fingerprints(conn, ctx, ctx.spec.source_ref)
    inputs = input_pins(conn, ctx)
    snapshot_id, fingerprint = identity_of(ctx, parts, None, scope_document(ctx, snapshot.requested), inputs)
    return dataclasses.replace(snapshot, snapshot_id=snapshot_id, fingerprint=fingerprint, partitions=parts,
                               inputs=inputs)


def record_exported(conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot, clock: Clock) -> None:
    """Record an exported snapshot once it is identified (in the caller's transaction)."""
    spec = ctx.spec
    store.record_snapshot(
        conn, spec.control_schema, snapshot_id=snapshot.snapshot_id, source_table=str(spec.source_ref),
        mode="exported", snapshot_table=None, partition_key=spec.partition_by,
        partitions=[{"partition": k, **snapshot.partitions[k]} for k in ctx.labels],
        fingerprint=snapshot.fingerprint, scope=scope_document(ctx, snapshot.requested), created_at=clock(),
    )
    record_inputs(conn, spec.control_schema, snapshot.snapshot_id, snapshot.inputs)
