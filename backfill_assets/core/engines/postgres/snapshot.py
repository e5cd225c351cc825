"""The snapshot: the fixed source a plan is built from, and its checks.

``take_snapshot`` fingerprints the declared partitions in one REPEATABLE READ transaction and
either copies exactly those rows into a sealed table (``copy``) or pins their fingerprint
(``immutable``). ``exported`` (the default) copies nothing: engines.postgres.exported holds
one REPEATABLE READ transaction open for the whole plan and exports its snapshot for the
builds to import. A copy is reused, approved and built from only while its seal holds
(core.engines.postgres.copies.copy_problem); an immutable source is rechecked by :func:`immutable_source_changes`,
the one recheck plan, approval and apply share. ``source_changes`` tells a sensor which
snapshotted partitions moved on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from backfill_assets.core.context import Clock
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.copies import PENDING_COPY, copy_inputs, input_copies, name_copy
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.staged import keys_relation, staged
from backfill_assets.core.errors import SnapshotError
from backfill_assets.core.fingerprint.identity import (
    SNAPSHOT_FORMAT,
    ScopeDocument,
    SnapshotDocument,
    snapshot_identity,
)
from backfill_assets.core.fingerprint.partition import partitions_digest, rows_digest
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Digest
from backfill_assets.core.moves import Scope, close_scope
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_kind
from backfill_assets.core.pg.db import repeatable_read, transient_errors
from backfill_assets.core.planning import Outside, Tie, Ties, check_source_counts
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.inputs import record_inputs, snapshot_inputs
from backfill_assets.core.vocabulary import TableRef, parse_table_name, partition_label


@dataclass(frozen=True)
class Snapshot:
    """A fixed source: a copied table (``copy``), the live source pinned by fingerprint
    (``immutable``), or the live source read in one exported MVCC snapshot (``exported``: its
    id, fingerprint and partitions are known only once the builds have read it, see
    engines.postgres.exported)."""

    snapshot_id: str
    mode: Literal["exported", "copy", "immutable"]
    relation: TableRef
    filtered: bool  # True when the relation is the live source, read for the partitions only
    fingerprint: str
    partitions: dict[str, Digest]
    requested: list[str]  # the partitions asked for; the others were added by moved records
    # The server's name of the exported snapshot, while the plan holding it runs.
    exported: str | None = None
    # partition -> (input rows, rows with a NULL key), read with the source checks; None: not read yet.
    reports: dict[str, tuple[int, int]] | None = None
    # The spec's other inputs as this snapshot read them (core.store.plan_document.InputPin).
    inputs: tuple[dict[str, Any], ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        inputs = {} if self.inputs is None else {"inputs": self.inputs}
        return {"id": self.snapshot_id, "mode": self.mode, "fingerprint": self.fingerprint, **inputs}


def source_fingerprints(conn: psycopg.Connection, ctx: PostgresContext, rel: TableRef) -> dict[str, Digest]:
    """Row count and content hash of every declared partition of a source-shaped relation
    (the source, or a copy of it), from one order-independent aggregate over them all (a
    source has no key to order by, and the format-3 digest needs none)."""
    found = partitions_digest(conn, rel, ctx.inspection.source_columns, ctx.by, ctx.partitions,
                              utf8=ctx.utf8)
    return {label: Digest(row_count=rows, content_hash=digest) for label, (rows, digest) in zip(ctx.labels, found)}


def outside_fingerprint(conn: psycopg.Connection, ctx: PostgresContext, rel: TableRef) -> Digest:
    """Row count and hash of the versions of the scope's keys that lie outside its partitions
    (records that can move), read from a source-shaped relation."""
    spec = ctx.spec
    where = sqlbuild.outside_scope(rel, keys_relation(ctx), ctx.by, spec.business_key)
    params = ctx.bound()
    rows, digest = rows_digest(conn, rel, ctx.inspection.source_columns, where, params, utf8=ctx.utf8)
    return Digest(row_count=rows, content_hash=digest)


def scope_document(ctx: PostgresContext, requested: list[str]) -> ScopeDocument:
    scope = ctx.scope
    return ScopeDocument(
        requested=requested,
        added=scope.added if scope else {},
        moves=[list(m) for m in scope.moves] if scope else [],
    )


def identity_of(
    ctx: PostgresContext, parts: dict[str, Digest], outside: Digest | None, scope: ScopeDocument,
    inputs: tuple[dict[str, Any], ...] | None = None,
) -> tuple[str, str]:
    """(snapshot id, fingerprint). The fingerprint covers the data (the spec's other
    ``inputs`` too) and names the copy; the id also covers the scope (requested partitions,
    and the moves found in the target)."""
    doc: SnapshotDocument = {
        "format": SNAPSHOT_FORMAT, "source": str(ctx.spec.source_ref),
        "partition_key": ctx.spec.partition_by,
        "columns": [[c.name, c.type_name] for c in ctx.inspection.source_columns],
        "partitions": [{"partition": k, **parts[k]} for k in ctx.labels],
    }
    if outside is not None:
        doc["versions_outside"] = outside
    if inputs is not None:
        doc["inputs"] = list(inputs)
    return snapshot_identity(doc, scope, ctx.spec.source.snapshot)


def check_source(conn: psycopg.Connection, ctx: PostgresContext, input_rel: sql.Composed,
                 params: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Refuse source data whose newest-wins order is not total, or that a transform moves
    out of the declared partitions (core.planning.check_source_counts, in this engine's words,
    over :class:`_Counts`).

    Returns:
        Per partition with input rows: (rows, rows with a NULL business key), the plan's
        input report.

    Raises:
        SourceDataError: NULLs in an ordering column without declared NULL placement, ties
            on every ordering column between rows that differ, rows outside the partitions.
    """
    return check_source_counts(ctx.spec, _Counts(conn, ctx, input_rel, params), "database")


@dataclass(frozen=True)
class _Counts:
    """The source checks' counts of ``input_rel``, each read in SQL on ``conn`` when asked."""

    conn: psycopg.Connection
    ctx: PostgresContext
    input_rel: sql.Composed
    params: dict[str, Any]

    def ordering_nulls(self) -> tuple[int, ...]:
        spec = self.ctx.spec
        query, qp = sqlbuild.ordering_null_counts(self.input_rel, spec.business_key,
                                                  [o.column for o in spec.ordering], self.params)
        return tuple(self.conn.execute(query, qp).fetchone() or ())

    def reports(self) -> dict[str, tuple[int, int]]:
        spec = self.ctx.spec
        query, qp = sqlbuild.input_report(self.input_rel, self.ctx.by, spec.business_key, self.params)
        return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in self.conn.execute(query, qp).fetchall()}

    def ties(self) -> Ties:
        spec = self.ctx.spec
        ordering = [o.column for o in spec.ordering]
        others = [c for c in spec.columns if c not in {spec.partition_key, *spec.business_key, *ordering}]
        # A key that can move has one newest version across partitions, so ties are per key;
        # otherwise per (partition, key), and the partition counts among the output columns.
        scope_key = None if spec.records_can_move else self.ctx.by
        if scope_key is None:
            others = [spec.partition_key, *others]
        # Grouped as values, compared as written: 1.5 and 1.50 in an output column are a tie.
        others += [c for c in [*spec.business_key, *ordering] if c in spec.columns]
        query, qp = sqlbuild.any_tied_group(self.input_rel, scope_key, spec.business_key, ordering, self.params)
        if self.conn.execute(query, qp).fetchone() is None:
            return Ties(0, ())
        query, qp = sqlbuild.ordering_ties(self.input_rel, scope_key, spec.business_key, ordering, others, self.params)
        ties = self.conn.execute(query, qp).fetchall()
        if not ties:
            return Ties(0, ())
        # Each row: (partition, or NULL with ties per key; key values..., different rows, keys with ties).
        width = 1 + len(spec.business_key)
        return Ties(ties[0][width + 1], [Tie(() if row[0] is None else (row[0],), tuple(row[1:width]), row[width])
                                         for row in ties])

    def outside(self) -> Outside:
        """Only a transform can move rows out of the partitions the input is read from."""
        if self.ctx.transform is None:
            return Outside(0)
        query, qp = sqlbuild.rows_outside_partitions(self.input_rel, self.ctx.by, self.params)
        row = self.conn.execute(query, qp).fetchone()
        return Outside((row[0] or 0) if row else 0)


@contextlib.contextmanager
def source_held(conn: psycopg.Connection, ref: TableRef, *inputs: TableRef, read_only: bool = False) -> Iterator[None]:
    """A REPEATABLE READ transaction on ``conn`` (autocommit) whose snapshot is taken after the
    source (and each of the spec's other ``inputs``) is locked as a SELECT locks it: a TRUNCATE
    or a rewrite of one, which a snapshot taken before it commits would see as an empty or
    rewritten table (neither is MVCC-safe), either committed before the snapshot or waits for
    the transaction's end. A foreign table or a materialized view (which LOCK TABLE does not
    take) is read unlocked."""
    kinds = [(r, table_kind(conn, r)) for r in (ref, *inputs)]  # before the transaction: its first statement locks
    with repeatable_read(conn, read_only=read_only):
        for held, kind in kinds:
            if kind in sqlbuild.LOCKABLE_KINDS:
                conn.execute(sqlbuild.lock_for_snapshot(held))
        yield


def take_snapshot(
    conn: psycopg.Connection, ctx: PostgresContext, clock: Clock, progress: Progress
) -> tuple[Snapshot, PostgresContext]:
    """Fix the source: find the scope, fingerprint it, copy or pin it, and check its data.

    All of it happens in one REPEATABLE READ transaction: ``copy`` copies the rows, then
    fingerprints and checks the copy; ``immutable`` pins the source's fingerprint. The
    snapshot id is derived from the content, so an unchanged source gives the same id (and
    the same copy, reused only while its seal holds; see core.engines.postgres.copies). A refused
    source rolls back everything, the control schema included.

    Returns the snapshot and the context, whose partitions now include those that moved
    records add (with ``records_can_move``).
    """
    spec = ctx.spec
    src = spec.source_ref
    requested = ctx.labels
    with transient_errors("taking the snapshot"), source_held(conn, src, *[i.table for i in ctx.inputs]):
        if spec.records_can_move:
            ctx = staged(ctx).with_target_keys(conn, ctx)  # the target's keys, for this transaction's SQL
            scope = close_scope(conn, spec, ctx.kind, ctx.partitions, ctx.ordering_keys(), keys_relation(ctx), ctx.by)
            ctx.engine.check_partitions(scope.partitions)  # the partitions moved keys add must be writable too
            ctx = dataclasses.replace(ctx, partitions=scope.partitions, scope=scope)
            if scope.added:
                progress(ProgressEvent("snapshot", f"moved records add partition(s) {', '.join(scope.added)}"))
        # Created (under a lock held to the commit) only by a first run: builds of a spec with
        # `parallel` that snapshot at once would otherwise wait on each other here.
        if not store.control_ready(conn, spec.control_schema):
            store.ensure_control_schema(conn, spec.control_schema)
        relation, filtered, fingerprinted, copied = src, True, src, 0
        if spec.source.snapshot != "immutable":
            # Copy first, then fingerprint the copy: one read of the source for every
            # partition, and an indexed copy to read each partition from.
            (fingerprinted, copied), filtered = _copy_snapshot(conn, ctx, progress), False
        progress(ProgressEvent("snapshot", f"fingerprinting {len(ctx.partitions)} source partition(s) of {src}"))
        parts = source_fingerprints(conn, ctx, fingerprinted)
        outside = outside_fingerprint(conn, ctx, fingerprinted) if spec.records_can_move else None
        scope_doc = scope_document(ctx, requested)
        ctx, inputs = copy_inputs(conn, ctx, clock, progress)  # the other inputs too, each a copy of its own
        snapshot_id, fingerprint = identity_of(ctx, parts, outside, scope_doc, inputs)
        if spec.source.snapshot != "immutable":
            relation = name_copy(conn, ctx, fingerprinted, copied, fingerprint, snapshot_id, clock, progress)
        reports = check_source(conn, ctx, ctx.input_relation(relation, filtered=filtered), ctx.bound())
        store.record_snapshot(
            conn, spec.control_schema, snapshot_id=snapshot_id, source_table=str(src),
            mode=spec.source.snapshot, snapshot_table=None if filtered else str(relation),
            partition_key=spec.partition_by,
            partitions=[{"partition": k, **parts[k]} for k in ctx.labels],
            fingerprint=fingerprint, scope=scope_doc, created_at=clock(),
        )
        record_inputs(conn, spec.control_schema, snapshot_id, inputs)
    snapshot = Snapshot(snapshot_id, spec.source.snapshot, relation, filtered, fingerprint, parts, requested,
                        reports=reports, inputs=inputs)
    return snapshot, ctx


def load_snapshot(conn: psycopg.Connection, spec: Spec, snapshot_id: str) -> tuple[Snapshot, PostgresContext]:
    """A recorded snapshot and the context it was taken in (its partitions and scope).

    Raises:
        SnapshotError: no such snapshot, or one taken with an older fingerprint format.
        SpecError: the spec no longer matches the catalog.
    """
    found = store.find_snapshot(conn, spec.control_schema, snapshot_id) if store.control_ready(conn, spec.control_schema) else None
    if found is None:
        raise SnapshotError(f"snapshot {snapshot_id} does not exist; take a snapshot first")
    if found["fingerprint_format"] != FINGERPRINT_FORMAT:
        raise SnapshotError(
            f"snapshot {snapshot_id} was taken with fingerprint format {found['fingerprint_format'] or 'older than 3'}; "
            f"this version computes format {FINGERPRINT_FORMAT}: take a snapshot again (plan again)"
        )
    if found["mode"] == "exported":
        what = ("take a snapshot again: this one was taken before the spec declared `snapshot: copy`"
                if spec.source.snapshot == "copy" else
                "build the stages in the step that takes the snapshot, or declare `snapshot: copy` to build them "
                "in a later step")
        raise SnapshotError(
            f"snapshot {snapshot_id} was read in the plan's own transaction (snapshot: exported), which ended "
            f"with it; {what}"
        )
    labels = [p["partition"] for p in found["partitions"]]
    ctx = resolve(conn, spec, labels)
    scope = found["scope"] or ScopeDocument(requested=labels, added={}, moves=[])
    if spec.records_can_move:
        ctx = dataclasses.replace(ctx, scope=Scope(
            ctx.partitions, dict(scope.get("added", {})), [tuple(m) for m in scope.get("moves", [])]
        ))
    parts = {p["partition"]: Digest(row_count=p["row_count"], content_hash=p["content_hash"]) for p in found["partitions"]}
    table = found["snapshot_table"]
    inputs = snapshot_inputs(conn, spec.control_schema, snapshot_id)  # each read from its copy
    if sorted(spec.inputs) != sorted(p["name"] for p in inputs or ()):
        raise SnapshotError(f"snapshot {snapshot_id} was taken with other inputs than the spec declares now; take a "
                            "snapshot again (plan again)")
    ctx = dataclasses.replace(ctx, inputs=input_copies(conn, inputs))
    snapshot = Snapshot(
        snapshot_id, found["mode"], spec.source_ref if table is None else parse_table_name(table),
        table is None, found["fingerprint"], parts, list(scope.get("requested", labels)), inputs=inputs,
    )
    return snapshot, ctx


def _copy_snapshot(conn: psycopg.Connection, ctx: PostgresContext, progress: Progress) -> tuple[TableRef, int]:
    """Copy the scope's rows (the transaction's snapshot of the source) into a new table,
    named after the transaction until its content names it (see core.engines.postgres.copies.name_copy)."""
    spec, src = ctx.spec, ctx.spec.source_ref
    names = ctx.source_column_names
    txid = conn.execute(sqlbuild.current_txid()).fetchone()
    assert txid is not None
    pending = TableRef(spec.control_schema, PENDING_COPY.format(txid[0]))
    progress(ProgressEvent("snapshot", f"copying the declared partitions of {src}", status="copying"))
    # Unlogged, like the stages: no WAL for a table that is only ever read back, and after a
    # crash it is empty, so its seal fails and the plan is refused, never built from it.
    conn.execute(sqlbuild.create_empty_copy(pending, src, names, unlogged=True))
    if spec.records_can_move:
        query, params = sqlbuild.copy_scope(
            pending, src, keys_relation(ctx), names, ctx.by, spec.business_key, ctx.partitions
        )
    else:
        query, params = sqlbuild.copy_partitions(pending, src, names, ctx.by, ctx.partitions)
    rows = conn.execute(query, params).rowcount
    conn.execute(sqlbuild.create_index(pending, [sqlbuild.OrderKey(spec.partition_key)]))
    progress(ProgressEvent("snapshot", f"copied {rows} row(s)", rows=rows, status="copied"))
    return pending, rows


def source_changes(conn: psycopg.Connection, spec: Spec, labels: list[str] | None = None) -> dict[str, str]:
    """Partitions whose source content differs from their newest snapshot: label -> new hash.

    Only partitions that were snapshotted before are looked at (that is what a rerun of the
    stages would rebuild), and of those only ``labels`` when given.
    """
    if not store.control_ready(conn, spec.control_schema):
        return {}
    known = store.latest_snapshotted(conn, spec.control_schema, str(spec.source_ref))
    if labels is not None:
        known = {k: known[k] for k in known.keys() & set(labels)}
    if not known:
        return {}
    return changes_against(conn, resolve(conn, spec, sorted(known)), known)


def changes_against(conn: psycopg.Connection, ctx: PostgresContext, known: dict[str, str]) -> dict[str, str]:
    """The context's partitions whose source content differs from ``known`` (label -> content
    hash of its newest snapshot): label -> the source's hash now."""
    with transient_errors("reading the source"), repeatable_read(conn, read_only=True):
        now = source_fingerprints(conn, ctx, ctx.spec.source_ref)
    return {label: now[label]["content_hash"] for label in ctx.labels if now[label]["content_hash"] != known[label]}


def immutable_source_changes(
    conn: psycopg.Connection, ctx: PostgresContext, expected: dict[str, Digest],
) -> dict[str, tuple[Digest, Digest]]:
    """The partitions of a source pinned as immutable that no longer carry their pinned
    fingerprint: label -> (expected, now), read in the caller's transaction.

    The one recheck of an immutable source: the plan (after its builds), approval and apply
    (under the lock, for the partitions it is about to replace) all call it.

    Args:
        expected: label -> the pinned digest, for the partitions to check (a subset of the
            context's).
    """
    values = [v for v, label in zip(ctx.partitions, ctx.labels) if label in expected]
    now = source_fingerprints(conn, dataclasses.replace(ctx, partitions=values), ctx.spec.source_ref)
    return {label: (want, now[label]) for label, want in expected.items() if now[label] != want}


def recheck_immutable_source(conn: psycopg.Connection, ctx: PostgresContext, snapshot: Snapshot) -> None:
    """Raise SnapshotError if a source pinned as immutable changed since it was pinned."""
    with transient_errors("rechecking the immutable source"), repeatable_read(conn, read_only=True):
        changed = immutable_source_changes(conn, ctx, snapshot.partitions)
    if changed:
        raise SnapshotError(
            f"source {ctx.spec.source_ref} was declared immutable but changed during the plan "
            f"in partition(s) {', '.join(changed)}; use `snapshot: copy` or stop the writers, "
            "then plan again"
        )
