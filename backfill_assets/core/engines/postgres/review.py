"""The PostgreSQL engine's checks before approval and apply: the plan's spec and catalog
unchanged, its snapshot's seal holding (or an immutable source unchanged), stage A still
carrying the planned readings; what replacing the target changes; and the keys that explain a
failed verification."""

from __future__ import annotations

import psycopg

from backfill_assets.core.differences import Change, FirstKey, PartitionDiff, example_text
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.copies import copy_problem, input_copy_problems
from backfill_assets.core.engines.postgres.diff import diff_against, diff_counts, first_added, rows_per_partition
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.snapshot import immutable_source_changes
from backfill_assets.core.engines.postgres.staged import staged
from backfill_assets.core.engines.postgres.stages import stage_partitions_changed
from backfill_assets.core.errors import ApprovalError, VerificationError
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg.db import repeatable_read
from backfill_assets.core.planning import DIFFERING_KEYS, require_ready, spec_document_drift, target_readings
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.inputs import snapshot_inputs
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import parse_table_name


def check_spec_unchanged(conn: psycopg.Connection, spec: Spec, stored: Plan) -> PostgresContext:
    """Resolve the current spec against the catalog and require the plan's spec-derived
    fields to be unchanged (target, keys, ordering, column types, transform).

    Raises:
        ApprovalError: the plan was refused, or the spec or target changed since.
        SpecError: the spec no longer matches the catalog.
    """
    require_ready(stored)
    ctx = resolve(conn, spec, stored.labels)
    spec_document_drift(ctx, stored)
    return ctx


def check_data_unchanged(
    conn: psycopg.Connection, ctx: PostgresContext, stored: Plan, partitions: list[str] | None = None,
) -> dict[str, Reading]:
    """Require stage A, and an immutable source, to still carry the planned fingerprints, and
    read the target as it is now.

    A copied snapshot is not hashed again: its seal is checked (one pass, no sort; see
    copies.copy_problem). It reaches the target only through the stage, which is checked here
    by its seal too, or hashed where the seal does not hold (stages.stage_partitions_changed),
    checked the same way again under the lock before each replace, and what it gives the
    target fingerprinted in full before the commit.

    Args:
        partitions: the target partitions to read (default: every partition of the plan).

    Returns:
        Each of those partitions' target readings, read in the same transaction as the
        checks: what an approval records it was given against (see :func:`record_approval`).

    Raises:
        ApprovalError: naming the partitions that changed.
    """
    spec, snap = ctx.spec, stored.document.snapshot
    wanted = stored.labels if partitions is None else partitions
    immutable = snap.mode == "immutable"
    with repeatable_read(conn):
        found = store.find_snapshot(conn, spec.control_schema, snap.id)
        if found is None or found["fingerprint"] != snap.fingerprint:
            raise ApprovalError(f"snapshot {snap.id} of plan {stored.plan_id[:16]} is gone; plan again")
        copy = found["snapshot_table"]
        problem = None if copy is None else copy_problem(conn, ctx, parse_table_name(copy), snap.fingerprint)
        if problem is not None:
            raise ApprovalError(f"the copy {copy} of snapshot {snap.id} {problem}; plan again")
        problems = input_copy_problems(conn, ctx, snapshot_inputs(conn, spec.control_schema, snap.id))
        if problems:
            raise ApprovalError(f"{'; '.join(problems)}: plan again")
        source_changed = list(immutable_source_changes(conn, ctx, stored.pinned_source())) if immutable else []
        stage = ctx.stage("a")
        approved = {label: stored.approved(label) for label in ctx.labels}
        stage_changed = stage_partitions_changed(conn, ctx, "a", approved)
        target = target_readings(conn, ctx, wanted)
    if source_changed:
        raise ApprovalError(
            f"the source no longer has the planned fingerprint in partition(s) "
            f"{', '.join(source_changed)}; plan again"
        )
    if stage_changed:
        raise ApprovalError(
            f"stage {stage} no longer has the planned fingerprint in partition(s) "
            f"{', '.join(stage_changed)}; plan again"
        )
    return target


def changes_of(conn: psycopg.Connection, ctx: PostgresContext, stored: Plan, first: int = 0) -> dict[str, Change]:
    """Per partition, what replacing the target with stage A changes: the counts of keys added,
    removed, changed and unchanged (core.diff), read in one read-only snapshot; with ``first``,
    up to that many differing keys (``"first"``: key, kind and the columns that differ, no
    values)."""
    with repeatable_read(conn, read_only=staged(ctx).compares_read_only):
        if staged(ctx).relation is None:  # a lake partition is loaded into a temporary table, one at a time
            return {d.partition: _change(d, first) for d in
                    (diff_against(conn, ctx, label, "target", first) for label in stored.labels)}
        # The target is a table here. A partition it holds no row of is stage A's rows, all
        # added: counted, not joined. The others: one join over all of them for the counts, or,
        # with first keys asked for, one per partition, which gives both.
        target, stage = staged(ctx).relation, ctx.stage("a")
        in_target = rows_per_partition(conn, ctx, target, stored.labels)
        out = {}
        for label, n in rows_per_partition(conn, ctx, stage, [lb for lb in stored.labels if not in_target[lb]]).items():
            out[label] = _change(PartitionDiff(label, added=n), 0)
            if first:
                keys = first_added(conn, ctx, stage, label, first) if n else []
                out[label]["first"] = [FirstKey(key=key, kind="added", columns=[]) for key in keys]
        rest = [label for label in stored.labels if in_target[label]]
        if first:
            for label in rest:
                out[label] = _change(diff_against(conn, ctx, label, "target", first), first)
        else:
            for d in diff_counts(conn, ctx, stage, target, rest):
                out[d.partition] = _change(d, 0)
        return {label: out[label] for label in stored.labels}


def _change(d: PartitionDiff, first: int) -> Change:
    """One partition's entry of :func:`changes_of`."""
    out = Change(added=d.added, removed=d.removed, changed=d.changed, unchanged=d.unchanged)
    if first:
        out["first"] = [FirstKey(key=e.key, kind=e.kind, columns=e.columns if e.kind == "changed" else [])
                        for e in d.examples]
    return out


def naming_keys(conn: psycopg.Connection, ctx: PostgresContext, err: VerificationError,
                 version: str | None) -> VerificationError:
    """The same failure, naming the first keys and columns where the committed partition (a
    lake table's at the ``version`` committed) differs from the approved stage (core.diff).
    The failure is what matters: if the keys cannot be read, it is raised as it was."""
    try:
        with conn.transaction():  # a lake partition is loaded into a temporary table for it
            found = diff_against(conn, ctx, err.partition, "target", DIFFERING_KEYS, version=version)
    except Exception:  # noqa: BLE001 - only an explanation failed; the verification error stands
        return err
    if not found.examples:
        return err
    detail = "first differing key(s), approved stage against the target: " + "; ".join(
        example_text(e) for e in found.examples)
    return VerificationError(err.partition, err.step, err.expected, err.actual, detail)
