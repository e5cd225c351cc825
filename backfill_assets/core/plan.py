"""The plan side of a backfill: inspect, snapshot, build twice, fingerprint, compare, record.

Nothing here writes to the target. The plan is stored in the control schema; its id is a
SHA-256 over the canonical JSON of everything an approver approves, so the same source,
spec and partitions always give the same plan id.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import psycopg
from psycopg import sql

from backfill_assets.core import control, sqlbuild
from backfill_assets.core.catalog import ColumnInfo, Inspection, inspect_tables, table_columns, table_kind
from backfill_assets.core.db import (
    ConnectionFactory, advisory_session_lock, read_committed, repeatable_read, transient_errors,
)
from backfill_assets.core.errors import SnapshotError, SourceDataError, StageError
from backfill_assets.core.fingerprint import (
    Fingerprint, all_columns_order, business_key_order, content_hash, content_hash_where,
    fingerprint_partition,
)
from backfill_assets.core.moves import Scope, close_scope
from backfill_assets.core.spec import (
    PartitionKind, PartitionRequest, PartitionValue, Spec, TableRef, parse_labels, parse_table_name,
    partition_label,
)
from backfill_assets.core.transform import validate_transform_in_catalog, validate_transform_text

PLAN_FORMAT = "backfill-assets/plan/v1"
SNAPSHOT_FORMAT = "backfill-assets/snapshot/v1"

Clock = Callable[[], dt.datetime]
Progress = Callable[[str], None]

_SET_LOCAL = sql.SQL("SELECT set_config(%(name)s, %(value)s, true)")
_TXID = sql.SQL("SELECT txid_current()")


def utc_now() -> dt.datetime:
    """The default clock; only metadata timestamps read it, never a build."""
    return dt.datetime.now(dt.timezone.utc)


def _quiet(_: str) -> None:
    pass


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes plan and snapshot ids are hashed from."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def set_timeouts(conn: psycopg.Connection, spec: Spec) -> None:
    """Finite lock and statement timeouts for the current transaction."""
    conn.execute(_SET_LOCAL, {"name": "statement_timeout", "value": f"{spec.statement_timeout_ms}ms"})
    conn.execute(_SET_LOCAL, {"name": "lock_timeout", "value": f"{spec.lock_timeout_ms}ms"})


def spec_lock(conn: psycopg.Connection, spec: Spec):
    """A session lock per spec: plan and apply of one spec never overlap, so a stage cannot
    be rebuilt while it is being applied. A second run is refused at once."""
    return advisory_session_lock(
        conn, f"backfill_assets:plan:{spec.control_schema}:{spec.name}",
        f"a plan or apply of spec {spec.name}",
    )


# --- the resolved context of one plan ------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """A spec checked against the catalog, with its partitions and transform resolved."""

    spec: Spec
    inspection: Inspection
    partitions: list[PartitionValue]  # requested, plus those moved records add
    transform: str | None  # the re-printed, validated transform_sql
    scope: Scope | None = None  # records_can_move: the added partitions and moves

    @property
    def kind(self) -> PartitionKind:
        assert self.inspection.partition_kind is not None
        return self.inspection.partition_kind

    @property
    def labels(self) -> list[str]:
        return [partition_label(p) for p in self.partitions]

    @property
    def target_columns(self) -> list[ColumnInfo]:
        return self.inspection.spec_target_columns(self.spec)

    @property
    def source_column_names(self) -> list[str]:
        return [c.name for c in self.inspection.source_columns]

    def input_relation(self, base: TableRef, *, filtered: bool) -> sql.Composed:
        return sqlbuild.input_relation(
            base, self.source_column_names, self.spec.partition_key, self.spec.input_columns,
            self.transform, filtered=filtered,
        )

    def ordering_keys(self) -> list[sqlbuild.OrderKey]:
        """The declared newest-wins order; collatable columns sort by bytes."""
        collatable = {c.name: c.collatable for c in self.inspection.source_columns}
        return [
            sqlbuild.OrderKey(o.column, o.direction, o.nulls, collate_c=collatable.get(o.column, False))
            for o in self.spec.ordering
        ]

    def stage(self, variant: str) -> TableRef:
        return TableRef(self.spec.control_schema, f"{self.spec.name}__stage_{variant}")

    def readings(self, conn: psycopg.Connection, rel: TableRef, partition: PartitionValue) -> Fingerprint:
        """The fingerprint of one partition of a stage or of the target, in the caller's
        transaction. Both rule duplicates out (a stage's unique index; the grain check every
        plan and apply starts with), so they are not counted. A stage's index, and the
        target's when it has one, give the business-key order without a sort."""
        spec = self.spec
        indexed = rel != spec.target_ref or self.inspection.target_key_indexed
        return fingerprint_partition(
            conn, rel, self.target_columns, spec.partition_key, spec.business_key, spec.total,
            partition, key_unique=True, indexed=indexed,
        )


def resolve(
    conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec,
    request: PartitionRequest | list[str],
) -> Context:
    """Inspect read-only and validate everything about the spec before any write.

    ``request`` is the command line's partitions, or the labels stored in a plan.

    Raises:
        SpecError: the catalog disagrees with the spec, the partitions are malformed, or
            the transform is refused.
    """
    if spec.transform_sql is not None:
        transform = validate_transform_text(spec.transform_sql)  # the parser first: no I/O
    else:
        transform = None
    inspection = inspect_tables(conn, factory, spec)
    kind = inspection.require_plannable()
    if isinstance(request, PartitionRequest):
        partitions = request.resolve(kind)
    else:
        partitions = parse_labels(request, kind)
    if transform is not None:
        validate_transform_in_catalog(
            conn, spec.source_ref, [c.name for c in inspection.source_columns],
            spec.partition_key, spec.input_columns, transform, original=spec.transform_sql,
        )
    return Context(spec, inspection, partitions, transform)


# --- snapshot ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """A fixed source: a copied table (``copy``) or the live source pinned by fingerprint."""

    snapshot_id: str
    mode: Literal["copy", "immutable"]
    relation: TableRef
    filtered: bool  # True when the relation is the live source, read for the partitions only
    fingerprint: str
    partitions: dict[str, dict[str, Any]]  # label -> {"row_count", "content_hash"}
    requested: list[str]  # the partitions asked for; the others were added by moved records

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.snapshot_id, "mode": self.mode, "fingerprint": self.fingerprint}


def source_fingerprints(conn: psycopg.Connection, ctx: Context, rel: TableRef) -> dict[str, dict[str, Any]]:
    """Row count and content hash of every declared partition of a source-shaped relation,
    ordered by every column's text form (a source has no key to order by)."""
    cols = ctx.inspection.source_columns
    query, params = sqlbuild.partition_counts(rel, ctx.spec.partition_key, ctx.partitions)
    counts = {partition_label(p): int(n) for p, n in conn.execute(query, params).fetchall()}
    order = all_columns_order(cols)
    return {
        label: {
            "row_count": counts.get(label, 0),
            "content_hash": content_hash(conn, rel, cols, ctx.spec.partition_key, order, p),
        }
        for p, label in zip(ctx.partitions, ctx.labels)
    }


def outside_fingerprint(conn: psycopg.Connection, ctx: Context, rel: TableRef) -> dict[str, Any]:
    """Row count and hash of the versions of the scope's keys that lie outside its partitions
    (records that can move), read from a source-shaped relation."""
    spec = ctx.spec
    where = sqlbuild.outside_scope(rel, spec.target_ref, spec.partition_key, spec.business_key)
    params = {"partitions": ctx.partitions}
    cols = ctx.inspection.source_columns
    count = conn.execute(*sqlbuild.count_where(rel, where, params)).fetchone()
    return {
        "row_count": int(count[0]) if count else 0,
        "content_hash": content_hash_where(conn, rel, cols, where, all_columns_order(cols), params),
    }


def _scope_document(ctx: Context, requested: list[str]) -> dict[str, Any]:
    scope = ctx.scope
    return {
        "requested": requested,
        "added": scope.added if scope else {},
        "moves": [list(m) for m in scope.moves] if scope else [],
    }


def _snapshot_identity(
    ctx: Context, parts: dict[str, dict[str, Any]], outside: dict[str, Any] | None,
    scope: dict[str, Any],
) -> tuple[str, str]:
    """(snapshot id, fingerprint). The fingerprint covers the data and names the copy; the
    id also covers the scope (requested partitions, and the moves found in the target)."""
    doc = {
        "format": SNAPSHOT_FORMAT, "source": str(ctx.spec.source_ref),
        "partition_key": ctx.spec.partition_key,
        "columns": [[c.name, c.type_name] for c in ctx.inspection.source_columns],
        "partitions": [{"partition": k, **parts[k]} for k in ctx.labels],
    }
    if outside is not None:
        doc["versions_outside"] = outside
    fingerprint = sha256_hex(canonical_json(doc))
    scoped = sha256_hex(canonical_json({"fingerprint": fingerprint, "scope": scope}))
    return f"{ctx.spec.source.snapshot}-{scoped[:16]}", fingerprint


def check_source(conn: psycopg.Connection, ctx: Context, input_rel: sql.Composed, params: dict[str, Any]) -> None:
    """Refuse source data whose newest-wins order is not total, or that a transform moves
    out of the declared partitions.

    Raises:
        SourceDataError: NULLs in an ordering column without declared NULL placement, ties
            on every ordering column between rows that differ, rows outside the partitions.
    """
    spec = ctx.spec
    ordering = [o.column for o in spec.ordering]
    query, qp = sqlbuild.ordering_null_counts(input_rel, spec.business_key, ordering, params)
    counts = conn.execute(query, qp).fetchone() or ()
    undeclared = [
        f"{o.column}: {n} row(s)" for o, n in zip(spec.ordering, counts) if n and o.nulls is None
    ]
    if undeclared:
        raise SourceDataError(
            "ordering columns have NULL values and no declared NULL placement",
            "Declare where NULLs sort with `nulls: first` or `nulls: last` on that ordering "
            "column, or fix the source",
            undeclared,
        )
    others = [c for c in spec.columns if c not in {spec.partition_key, *spec.business_key, *ordering}]
    query, qp = sqlbuild.input_report(input_rel, spec.partition_key, spec.business_key, params)
    keyless = [f"partition {partition_label(p)}: {n} row(s)" for p, n, nulls in conn.execute(query, qp).fetchall()
               if n and nulls == n]
    if keyless:
        # Every row dropped would empty the target partition: far more likely a wrong key.
        raise SourceDataError(
            "every source row of some partitions has a NULL business key "
            f"({', '.join(spec.business_key)}), so the rebuild would empty them",
            "Check business_key against the source (run `backfill-assets profile`)",
            keyless[:3],
        )
    # A key that can move has one newest version across partitions, so ties are per key;
    # otherwise per (partition, key), and the partition counts among the output columns.
    scope_key = None if spec.records_can_move else spec.partition_key
    if scope_key is None:
        others = [spec.partition_key, *others]
    # Grouped as values, compared as written: 1.5 and 1.50 in an output column are a tie.
    others += [c for c in [*spec.business_key, *ordering] if c in spec.columns]
    query, qp = sqlbuild.ordering_ties(input_rel, scope_key, spec.business_key, ordering, others, params)
    ties = conn.execute(query, qp).fetchall()
    if ties:
        width = 1 + len(spec.business_key)
        examples = []
        for row in ties:
            key = ", ".join(f"{c}={v}" for c, v in zip(spec.business_key, row[1:width]))
            where = f"partition {row[0]}, " if row[0] is not None else ""
            examples.append(f"{where}key ({key}): {row[width]} different rows")
        raise SourceDataError(
            f"{ties[0][width + 1]} key(s) have rows that tie on every ordering column "
            f"({', '.join(ordering)}) but differ, so newest-wins would pick one by chance",
            "Add a final tiebreak column to `ordering` (run `backfill-assets profile` to find "
            "one); do not guess",
            examples,
        )
    if ctx.transform is not None:
        query, qp = sqlbuild.rows_outside_partitions(input_rel, spec.partition_key, params)
        row = conn.execute(query, qp).fetchone()
        if row and row[0]:
            raise SourceDataError(
                f"transform_sql puts {row[0]} row(s) outside the declared partitions or in a "
                f"NULL partition",
                "A transform must keep every row in its source partition",
            )


def take_snapshot(
    conn: psycopg.Connection, ctx: Context, clock: Clock, progress: Progress
) -> tuple[Snapshot, Context]:
    """Fix the source: find the scope, fingerprint it, copy or pin it, and check its data.

    All of it happens in one REPEATABLE READ transaction: ``copy`` copies exactly the rows
    that were fingerprinted and checks the copy; ``immutable`` pins their fingerprint. The
    snapshot id is derived from the content, so an unchanged source gives the same id (and
    the same copy, reused only while its seal holds; see :func:`copy_intact`). A refused
    source rolls back everything, the control schema included.

    Returns the snapshot and the context, whose partitions now include those that moved
    records add (with ``records_can_move``).
    """
    spec = ctx.spec
    src = spec.source_ref
    requested = ctx.labels
    with transient_errors("taking the snapshot"), repeatable_read(conn):
        set_timeouts(conn, spec)
        if spec.records_can_move:
            scope = close_scope(conn, spec, ctx.kind, ctx.partitions, ctx.ordering_keys())
            ctx = dataclasses.replace(ctx, partitions=scope.partitions, scope=scope)
            if scope.added:
                progress(f"moved records add partition(s) {', '.join(scope.added)}")
        progress(f"snapshot: fingerprinting {len(ctx.partitions)} source partition(s) of {src}")
        parts = source_fingerprints(conn, ctx, src)
        outside = outside_fingerprint(conn, ctx, src) if spec.records_can_move else None
        scope = _scope_document(ctx, requested)
        snapshot_id, fingerprint = _snapshot_identity(ctx, parts, outside, scope)
        control.ensure_control_schema(conn, spec.control_schema)
        if spec.source.snapshot == "immutable":
            relation, filtered = src, True
        else:
            relation, filtered = TableRef(spec.control_schema, f"snap_{fingerprint[:16]}"), False
            if copy_intact(conn, ctx, relation, fingerprint):
                progress(f"snapshot: {snapshot_id}: the copy {relation} is intact; reusing it")
            else:
                rows = sum(p["row_count"] for p in parts.values()) + (outside or {}).get("row_count", 0)
                progress(f"snapshot: copying {rows} row(s) into {relation}")
                _copy_snapshot(conn, ctx, relation, fingerprint, clock)
        check_source(conn, ctx, ctx.input_relation(relation, filtered=filtered), {"partitions": ctx.partitions})
        control.record_snapshot(
            conn, spec.control_schema, snapshot_id=snapshot_id, source_table=str(src),
            mode=spec.source.snapshot, snapshot_table=None if filtered else str(relation),
            partition_key=spec.partition_key,
            partitions=[{"partition": k, **parts[k]} for k in ctx.labels],
            fingerprint=fingerprint, scope=scope, created_at=clock(),
        )
    snapshot = Snapshot(snapshot_id, spec.source.snapshot, relation, filtered, fingerprint, parts, requested)
    return snapshot, ctx


def load_snapshot(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec, snapshot_id: str) -> tuple[Snapshot, Context]:
    """A recorded snapshot and the context it was taken in (its partitions and scope).

    Raises:
        SnapshotError: no such snapshot.
        SpecError: the spec no longer matches the catalog.
    """
    found = control.find_snapshot(conn, spec.control_schema, snapshot_id) if control.control_ready(conn, spec.control_schema) else None
    if found is None:
        raise SnapshotError(f"snapshot {snapshot_id} does not exist; take a snapshot first")
    labels = [p["partition"] for p in found["partitions"]]
    ctx = resolve(conn, factory, spec, labels)
    scope = found["scope"] or {}
    if spec.records_can_move:
        ctx = dataclasses.replace(ctx, scope=Scope(
            ctx.partitions, dict(scope.get("added", {})), [tuple(m) for m in scope.get("moves", [])]
        ))
    parts = {p["partition"]: {"row_count": p["row_count"], "content_hash": p["content_hash"]} for p in found["partitions"]}
    table = found["snapshot_table"]
    snapshot = Snapshot(
        snapshot_id, found["mode"], spec.source_ref if table is None else parse_table_name(table),
        table is None, found["fingerprint"], parts, list(scope.get("requested", labels)),
    )
    return snapshot, ctx


def _copy_snapshot(conn: psycopg.Connection, ctx: Context, relation: TableRef, fingerprint: str, clock: Clock) -> None:
    """Copy the scope's rows (the transaction's snapshot of the source) and seal the copy."""
    spec, src = ctx.spec, ctx.spec.source_ref
    names = ctx.source_column_names
    conn.execute(sqlbuild.drop_table(relation))
    conn.execute(sqlbuild.create_empty_copy(relation, src, names, unlogged=False))
    if spec.records_can_move:
        query, params = sqlbuild.copy_scope(
            relation, src, spec.target_ref, names, spec.partition_key, spec.business_key, ctx.partitions
        )
    else:
        query, params = sqlbuild.copy_partitions(relation, src, names, spec.partition_key, ctx.partitions)
    rows = conn.execute(query, params).rowcount
    conn.execute(sqlbuild.create_index(relation, [sqlbuild.OrderKey(spec.partition_key)]))
    # One statement filled the new table, so every row carries that statement's xmin.
    writer = conn.execute(sqlbuild.copy_writer(relation)).fetchone()
    control.record_copy(
        conn, spec.control_schema, snapshot_table=str(relation), fingerprint=fingerprint,
        writer_xid=writer[0] if writer else None, row_count=rows,
        columns=[[c.name, c.type_name] for c in table_columns(conn, relation)], copied_at=clock(),
    )


# A 32-bit transaction id comes round again after 2^32 more; trust a seal for half of that.
SEAL_HORIZON = 2**31


def copy_problem(conn: psycopg.Connection, ctx: Context, relation: TableRef, fingerprint: str) -> str | None:
    """Why a snapshot copy may no longer hold exactly the rows it was made with, or None.

    Checked by its seal: the same columns, the same row count, and every row still written
    by the one transaction that made the copy (an UPDATE, INSERT or DELETE and INSERT leaves
    another xmin; a DELETE changes the count). One pass over the copy without a sort, instead
    of hashing it again. xmin survives VACUUM FREEZE (the raw id is kept); a seal older than
    2^31 transactions is not trusted, as its id could have been reused."""
    kind = table_kind(conn, relation)
    if kind is None:
        return "is gone"
    if kind != "r":
        return "is no longer a plain table"
    seal = control.copy_seal(conn, ctx.spec.control_schema, str(relation))
    if seal is None or seal["transactions_since"] is None:
        return "has no seal (an earlier version made it)"
    if seal["fingerprint"] != fingerprint:
        return "was made for another snapshot"
    if seal["transactions_since"] >= SEAL_HORIZON:
        return "is too old for its seal to be trusted"
    dropped = conn.execute(*sqlbuild.dropped_columns(relation)).fetchone()
    if [[c.name, c.type_name] for c in table_columns(conn, relation)] != seal["columns"] or (dropped and dropped[0]):
        return "changed its columns since it was taken"
    rows, foreign = conn.execute(*sqlbuild.copy_seal_check(relation, seal["writer_xid"])).fetchone() or (None, None)
    if rows != seal["row_count"] or foreign != 0:
        return "changed since it was taken"
    return None


def copy_intact(conn: psycopg.Connection, ctx: Context, relation: TableRef, fingerprint: str) -> bool:
    """Whether a snapshot copy's seal holds (see :func:`copy_problem`)."""
    return copy_problem(conn, ctx, relation, fingerprint) is None


# --- the two builds ----------------------------------------------------------------------


def ensure_stage(conn: psycopg.Connection, ctx: Context, variant: str) -> TableRef:
    """Create the stage table (unlogged, the target's column types, a unique index on the grain
    in business-key order); recreate it if the target's columns changed since it was made.

    The unique index makes a build that breaks the grain fail loudly, lets the fingerprint
    skip counting duplicates, and serves the ordered read of the fingerprint."""
    stage = ctx.stage(variant)
    expected = [(c.name, c.type_name) for c in ctx.target_columns]
    with conn.transaction():
        current = [(c.name, c.type_name) for c in table_columns(conn, stage)]
        unique = conn.execute(*sqlbuild.has_unique_index(stage)).fetchone()
        if current != expected or not (unique and unique[0]):
            conn.execute(sqlbuild.drop_table(stage))
            conn.execute(sqlbuild.create_empty_copy(stage, ctx.spec.target_ref, ctx.spec.columns, unlogged=True))
            keys = [sqlbuild.OrderKey(ctx.spec.partition_key)] + business_key_order(ctx.target_columns, ctx.spec.business_key)
            conn.execute(sqlbuild.create_index(stage, keys, unique=True))
    return stage


def build_partition(
    conn: psycopg.Connection, ctx: Context, snapshot: Snapshot, variant: Literal["a", "b"],
    partition: PartitionValue,
) -> tuple[Fingerprint, str | None, int]:
    """Rebuild one partition of one stage and fingerprint it, in one transaction.

    Returns the readings, the transaction that wrote the partition's rows (their xmin, None
    when it is empty) and the same transaction's 64-bit id: the partition's seal and its age,
    see :func:`stage_partitions_changed`."""
    spec = ctx.spec
    stage = ctx.stage(variant)
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    with transient_errors(f"building stage {variant} of partition {partition_label(partition)}"), conn.transaction():
        set_timeouts(conn, spec)
        conn.execute(*sqlbuild.delete_partition(stage, spec.partition_key, partition))
        conn.execute(*sqlbuild.build_stage(
            variant, stage, input_rel, spec.columns, spec.partition_key, spec.business_key,
            ctx.ordering_keys(), {"partitions": ctx.partitions}, partition,
            moving=spec.records_can_move,
        ))
        writer = conn.execute(*sqlbuild.partition_writer(stage, spec.partition_key, partition)).fetchone()
        txid = conn.execute(_TXID).fetchone()
        assert txid is not None
        return ctx.readings(conn, stage, partition), writer[0] if writer else None, int(txid[0])


def build_stage(
    conn: psycopg.Connection, ctx: Context, snapshot: Snapshot, variant: Literal["a", "b"],
    clock: Clock, progress: Progress,
) -> dict[str, Fingerprint]:
    """Build every partition of one stage from the snapshot, and record each build."""
    out: dict[str, Fingerprint] = {}
    ensure_stage(conn, ctx, variant)
    for n, (p, label) in enumerate(zip(ctx.partitions, ctx.labels), 1):
        out[label], writer, txid = build_partition(conn, ctx, snapshot, variant, p)
        control.record_build(
            conn, ctx.spec.control_schema, spec_name=ctx.spec.name, variant=variant, partition=label,
            snapshot_id=snapshot.snapshot_id, readings=out[label].as_dict(), writer_xid=writer,
            writer_txid=txid, built_at=clock(),
        )
        progress(f"stage {variant}: {n}/{len(ctx.partitions)} {label}: {out[label].row_count} row(s)")
    return out


def stage_partitions_changed(
    conn: psycopg.Connection, ctx: Context, variant: str, expected: dict[str, dict[str, Any]],
) -> list[str]:
    """The partitions of a stage that no longer carry the ``expected`` readings (label ->
    readings), in the caller's transaction.

    A partition whose latest build recorded exactly those readings, and whose rows are still
    all the ones that build's transaction wrote (same count, same xmin: any UPDATE, INSERT or
    DELETE breaks that), is unchanged without being hashed again: one pass without a sort.
    A seal older than :data:`SEAL_HORIZON` transactions (its 32-bit xmin could have come round
    again), or recorded without its 64-bit id by an older version, does not hold. Any other
    partition is fingerprinted and compared in full, so the answer is the same as hashing
    every partition, unless the data files themselves were damaged (apply still hashes each
    partition under its lock before writing it)."""
    spec, stage = ctx.spec, ctx.stage(variant)
    built = control.builds(conn, spec.control_schema, spec.name, variant, ctx.labels)
    changed = []
    for value, label in zip(ctx.partitions, ctx.labels):
        readings, writer, since = built.get(label, (None, None, None))
        if readings == expected[label] and since is not None and since < SEAL_HORIZON:
            query, params = sqlbuild.partition_seal_check(stage, spec.partition_key, value, writer)
            row = conn.execute(query, params).fetchone()
            if row is not None and (int(row[0]), int(row[1])) == (expected[label]["row_count"], 0):
                continue
        if ctx.readings(conn, stage, value).as_dict() != expected[label]:
            changed.append(label)
    return changed


@dataclass(frozen=True)
class StageState:
    """Both stages of one partition as they are now, compared with each other, with what their
    latest builds recorded, and with the plans (see :func:`read_stages`)."""

    partition: str
    a: Fingerprint
    b: Fingerprint
    plan_id: str | None  # the newest plan that recorded exactly these two stages
    problems: tuple[str, ...]

    @property
    def match(self) -> bool:
        return not self.problems


def read_stages(spec: Spec, labels: list[str], factory: ConnectionFactory) -> list[StageState]:
    """Read both stages' partitions ``labels`` as they are now, without building anything, and
    compare them: with each other, with their latest builds, and with the newest plan that
    recorded them (for re-running the stage checks alone).

    Two stages that agree are not enough: a refused plan deletes the partitions whose stages
    differ, which leaves both empty and equal. The builds' records tell that apart, and the
    plans say whether anyone planned these exact stages.

    Raises:
        StageError: the stages of this spec have never been built.
        SpecError: the spec no longer matches the catalog, or a label is malformed.
    """
    with factory() as conn:
        if not control.control_ready(conn, spec.control_schema):
            raise StageError(f"the stages of spec {spec.name} have never been built; materialize both stages first")
        ctx = resolve(conn, factory, spec, labels)
        with transient_errors("reading the stages"), repeatable_read(conn, read_only=True):
            set_timeouts(conn, spec)
            for variant in ("a", "b"):
                if table_kind(conn, ctx.stage(variant)) is None:
                    raise StageError(f"stage {ctx.stage(variant)} has never been built; materialize both stages first")
            built = {v: control.builds(conn, spec.control_schema, spec.name, v, ctx.labels) for v in ("a", "b")}
            now = {v: {label: ctx.readings(conn, ctx.stage(v), value) for value, label in zip(ctx.partitions, ctx.labels)}
                   for v in ("a", "b")}
            plans = control.plans_with(conn, spec.control_schema, spec.name, ctx.labels)
    out = []
    for label in ctx.labels:
        a, b = now["a"][label], now["b"][label]
        problems = []
        for v, fp in (("a", a), ("b", b)):
            record = built[v].get(label)
            if record is None:
                problems.append(f"stage {v.upper()} has no recorded build of this partition")
            elif fp.as_dict() != record[0]:
                problems.append(
                    f"stage {v.upper()} changed since its latest build ({record[0]['row_count']} rows, hash "
                    f"{record[0]['content_hash'][:16]}; now {fp.row_count} rows, hash {fp.content_hash[:16]}); "
                    "a refused plan removes the partitions whose stages differ"
                )
        diffs = a.differences(b)
        if diffs:
            problems.append(f"stages A and B differ on {', '.join(diffs)}")
        plan_id = next((pid for pid, pa, pb in plans.get(label, []) if pa == a.as_dict() and pb == b.as_dict()), None)
        if plan_id is None and not problems:
            problems.append("no plan recorded these stages; plan again")
        out.append(StageState(label, a, b, plan_id, tuple(problems)))
    return out


def _input_reports(conn: psycopg.Connection, ctx: Context, snapshot: Snapshot) -> dict[str, tuple[int, int]]:
    input_rel = ctx.input_relation(snapshot.relation, filtered=snapshot.filtered)
    query, params = sqlbuild.input_report(input_rel, ctx.spec.partition_key, ctx.spec.business_key, {"partitions": ctx.partitions})
    return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in conn.execute(query, params).fetchall()}


# --- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A fingerprinted plan. ``document`` is what an approver approves; ``plan_id`` its hash."""

    plan_id: str
    status: Literal["ready", "refused"]
    problems: tuple[str, ...]
    document: dict[str, Any] = field(repr=False)

    def as_json(self) -> dict[str, Any]:
        """The plan as printed by ``plan --json``: one object."""
        return {"plan_id": self.plan_id, "status": self.status, "problems": list(self.problems), **self.document}


def spec_document(ctx: Context) -> dict[str, Any]:
    """The parts of a plan that come from the spec and the target's catalog.

    approve and apply recompute them from the current spec and catalog: any difference
    (another transform version, a target column added or retyped) refuses the plan.
    """
    spec = ctx.spec
    return {
        "format": PLAN_FORMAT,
        "spec": spec.name,
        "target": str(spec.target_ref),
        "source": str(spec.source_ref),
        "partition_key": spec.partition_key,
        "business_key": list(spec.business_key),
        "ordering": [o.model_dump() for o in spec.ordering],
        "columns": [[c.name, c.type_name] for c in ctx.target_columns],
        # Every column of the target, so that one added to it since the plan is drift too.
        "target_table_columns": [[c.name, c.type_name] for c in ctx.inspection.target_columns],
        "total": spec.total,
        "records_can_move": spec.records_can_move,
        "transform_version": spec.transform_version,
        "transform_sql_sha256": None if ctx.transform is None else sha256_hex(ctx.transform.encode("utf-8")),
    }


def assemble(ctx: Context, snapshot: Snapshot, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
             reports: dict[str, tuple[int, int]], requested: list[str]) -> Plan:
    """Compare the stages on every reading and build the plan document and id."""
    problems: list[str] = []
    partitions = []
    for label in ctx.labels:
        fa, fb = a[label], b[label]
        diffs = fa.differences(fb)
        if diffs:
            problems.append(f"partition {label}: stages A and B differ on {', '.join(diffs)}")
        for side, fp in (("A", fa), ("B", fb)):
            if fp.null_key_count or fp.duplicate_key_count:
                problems.append(
                    f"partition {label}: stage {side} has {fp.null_key_count} NULL and "
                    f"{fp.duplicate_key_count} duplicate business key(s)"
                )
        rows_read, null_keys = reports.get(label, (0, 0))
        partitions.append({
            "partition": label,
            "match": not diffs,
            "stage_a": fa.as_dict(),
            "stage_b": fb.as_dict(),
            "source": {
                "rows_read": rows_read,
                "null_key_rows_dropped": null_keys,
                "duplicates_collapsed": rows_read - null_keys - fa.row_count,
                "snapshot_rows": snapshot.partitions[label]["row_count"],
                "snapshot_hash": snapshot.partitions[label]["content_hash"],
            },
        })
    scope = ctx.scope
    document = {
        **spec_document(ctx),
        "snapshot": snapshot.as_dict(),
        "requested_partitions": requested,
        "added_partitions": [
            {"partition": label, "reasons": reasons} for label, reasons in (scope.added.items() if scope else [])
        ],
        # Partitions that moved keys link are replaced together, in one transaction.
        "replace_groups": scope.groups() if scope else [[label] for label in ctx.labels],
        "partitions": partitions,
    }
    plan_id = sha256_hex(canonical_json(document))
    return Plan(plan_id, "refused" if problems else "ready", tuple(problems), document)


def make_plan(
    spec: Spec, request: PartitionRequest, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = _quiet,
) -> Plan:
    """Plan a backfill: snapshot, build both stages at once, compare. Never writes to the target.

    The stages are built on two connections at the same time, under the spec lock held for
    the whole plan.

    Returns the plan, stored in the control schema, with status ``ready`` or ``refused``;
    a refused plan's differing stage partitions are deleted so nothing can apply them.

    Raises:
        SpecError, ConnectionConfigError, SourceDataError, SnapshotError,
        TransientDatabaseError, ConcurrentRunError.
    """
    with factory() as conn, spec_lock(conn, spec):
        progress(f"inspect: {spec.source_ref} -> {spec.target_ref}")
        ctx = resolve(conn, factory, spec, request)
        snapshot, ctx = take_snapshot(conn, ctx, clock, progress)
        a, b = build_both(ctx, snapshot, factory, clock, progress)
        return finish_plan(conn, ctx, snapshot, a, b, clock, progress)


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
            set_timeouts(guard, ctx.spec)
            # The guard waits, idle in its transaction, for both builds.
            guard.execute(_SET_LOCAL, {"name": "idle_in_transaction_session_timeout", "value": "0"})
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


def snapshot_step(
    spec: Spec, request: PartitionRequest | list[str], factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = _quiet,
) -> Snapshot:
    """Step 1 on its own (for an orchestrator): inspect, check and snapshot the partitions."""
    with factory() as conn, spec_lock(conn, spec):
        ctx = resolve(conn, factory, spec, request)
        snapshot, _ = take_snapshot(conn, ctx, clock, progress)
        return snapshot


def stages_step(
    spec: Spec, snapshot_id: str, factory: ConnectionFactory, *,
    clock: Clock = utc_now, progress: Progress = _quiet,
) -> tuple[Context, Plan, dict[str, Fingerprint], dict[str, Fingerprint]]:
    """Steps 2 and 3 for an orchestrator: build both stages from a recorded snapshot, compare
    them and store the plan, as make_plan does after its snapshot.

    Returns the snapshot's context, the plan, and the readings of stages A and B.
    """
    with factory() as conn, spec_lock(conn, spec):
        snapshot, ctx = load_snapshot(conn, factory, spec, snapshot_id)
        a, b = build_both(ctx, snapshot, factory, clock, progress)
        return ctx, finish_plan(conn, ctx, snapshot, a, b, clock, progress), a, b


def source_changes(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec) -> dict[str, str]:
    """Partitions whose source content differs from their newest snapshot: label -> new hash.

    Only partitions that were snapshotted before are looked at (that is what a rerun of the
    stages would rebuild).
    """
    if not control.control_ready(conn, spec.control_schema):
        return {}
    known = control.latest_snapshotted(conn, spec.control_schema, str(spec.source_ref))
    if not known:
        return {}
    ctx = resolve(conn, factory, spec, sorted(known))
    with transient_errors("reading the source"), repeatable_read(conn, read_only=True):
        set_timeouts(conn, spec)
        now = source_fingerprints(conn, ctx, spec.source_ref)
    return {label: now[label]["content_hash"] for label in ctx.labels if now[label]["content_hash"] != known[label]}


def finish_plan(
    conn: psycopg.Connection, ctx: Context, snapshot: Snapshot, a: dict[str, Fingerprint],
    b: dict[str, Fingerprint], clock: Clock, progress: Progress,
) -> Plan:
    """Compare the builds, recheck an immutable source, then store the plan; a refused plan's
    differing stage partitions are deleted so that nothing can apply them."""
    spec = ctx.spec
    reports = _input_reports(conn, ctx, snapshot)
    if snapshot.mode == "immutable":
        recheck_immutable_source(conn, ctx, snapshot)
    plan = assemble(ctx, snapshot, a, b, reports, snapshot.requested)
    with conn.transaction():
        control.record_plan(
            conn, spec.control_schema, plan_id=plan.plan_id, spec_name=spec.name,
            target_table=str(spec.target_ref), status=plan.status,
            snapshot_id=snapshot.snapshot_id, plan=plan.as_json(), created_at=clock(),
        )
        if plan.status == "refused":
            for entry in plan.document["partitions"]:
                if not entry["match"]:
                    value = ctx.partitions[ctx.labels.index(entry["partition"])]
                    for v in ("a", "b"):
                        conn.execute(*sqlbuild.delete_partition(ctx.stage(v), spec.partition_key, value))
    progress(f"plan {plan.plan_id[:16]}: {plan.status}")
    return plan


def recheck_immutable_source(conn: psycopg.Connection, ctx: Context, snapshot: Snapshot) -> None:
    """Raise SnapshotError if a source pinned as immutable changed since it was pinned."""
    with transient_errors("rechecking the immutable source"), repeatable_read(conn, read_only=True):
        set_timeouts(conn, ctx.spec)
        now = source_fingerprints(conn, ctx, ctx.spec.source_ref)
    changed = [k for k in ctx.labels if now[k] != snapshot.partitions[k]]
    if changed:
        raise SnapshotError(
            f"source {ctx.spec.source_ref} was declared immutable but changed during the plan "
            f"in partition(s) {', '.join(changed)}; use `snapshot: copy` or stop the writers, "
            "then plan again"
        )
