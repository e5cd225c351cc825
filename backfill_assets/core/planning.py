"""The plan's rules that every build engine shares: what a plan records of the spec and the
catalog, how two builds are compared into a plan, what refuses a stored plan or a reading, and
the source checks (:func:`check_source_counts`): the source data a plan refuses, one set of
rules and messages over the counts each engine computes in its own queries.

The steps (core.plan, core.approve, core.stages) and the engines (core.engines) both stand on
this module; it imports neither, so no engine reaches back into a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg

from backfill_assets.core.context import Context
from backfill_assets.core.errors import ApprovalError, SourceDataError, TiedRowsError, VerificationError
from backfill_assets.core.fingerprint.identity import PLAN_FORMAT, sha256_hex
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.spec import Spec
from backfill_assets.core.store.plan_document import (
    AddedPartition,
    PartitionEntry,
    Plan,
    PlanDocument,
    SnapshotRef,
    SourceReport,
)

# How many differing keys a refused plan names per partition.
DIFFERING_KEYS = 3


def differing_keys_prefix(label: str) -> str:
    """The start of the problem that names a partition's first differing keys."""
    return f"partition {label}: first differing key(s)"


def spec_document(ctx: Context) -> dict[str, Any]:
    """The parts of a plan that come from the spec and the target's catalog.

    approve and apply recompute them from the current spec and catalog: any difference
    (another transform version, a target column added or retyped) refuses the plan.
    """
    spec = ctx.spec
    return {
        # Every column of the target, so that one added to it since the plan is drift too
        # (and whatever else names the table: an Iceberg table's catalog).
        **ctx.engine.plan_fields(ctx),
        "format": PLAN_FORMAT,
        "fingerprint_format": FINGERPRINT_FORMAT,
        "spec": spec.name,
        "target": spec.target_name,
        "source": spec.source_name,
        "partition_key": spec.partition_key,
        "business_key": list(spec.business_key),
        "ordering": [o.model_dump() for o in spec.ordering],
        "columns": [[c.name, c.type_name] for c in ctx.target_columns],
        "total": spec.total,
        "records_can_move": spec.records_can_move,
        "transform_version": spec.transform_version,
        "transform_sql_sha256": None if ctx.transform is None else sha256_hex(ctx.transform.encode("utf-8")),
        # Left out of the plan's JSON where None: a spec of values keeps the plan ids it always had.
        "partition_window": None if spec.partition_window is None else spec.partition_window.declared(),
    }


def assemble(ctx: Context, snapshot: Any, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
             reports: dict[str, tuple[int, int]], requested: list[str], found: list[str] | None = None) -> Plan:
    """Compare the stages on every reading and build the plan document and id; ``found``:
    problems found before, listed after the comparison's (differing keys, values a lake target
    could not hold). ``snapshot``: the engine's snapshot (its ``partitions`` and ``as_dict``)."""
    problems: list[str] = []
    partitions: list[PartitionEntry] = []
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
        window = ctx.windowing.window(label) if ctx.windowing is not None else None
        partitions.append(PartitionEntry(
            partition=label, match=not diffs, stage_a=fa, stage_b=fb,
            start=None if window is None else window.start.isoformat(),
            end=None if window is None else window.end.isoformat(),
            source=SourceReport(
                rows_read=rows_read, null_key_rows_dropped=null_keys,
                duplicates_collapsed=rows_read - null_keys - fa.row_count,
                snapshot_rows=snapshot.partitions[label]["row_count"],
                snapshot_hash=snapshot.partitions[label]["content_hash"],
            ),
        ))
    scope = ctx.scope
    document = PlanDocument(
        **spec_document(ctx),
        snapshot=SnapshotRef(**snapshot.as_dict()),
        requested_partitions=requested,
        added_partitions=[AddedPartition(partition=label, reasons=reasons)
                          for label, reasons in (scope.added.items() if scope else [])],
        # Partitions that moved keys link are replaced together, in one transaction.
        replace_groups=scope.groups() if scope else [[label] for label in ctx.labels],
        partitions=partitions,
        # A table that does not exist yet is created by apply: the approval covers that.
        creates_target=ctx.engine.creates_target(ctx),
    )
    return Plan.of(document, problems + list(found or []))


def require_ready(stored: Plan) -> None:
    """Refuse a refused plan (ApprovalError naming its problems)."""
    if stored.status != "ready":
        problems = "; ".join(stored.problems) or "its stages did not match"
        raise ApprovalError(
            f"plan {stored.plan_id[:16]} was refused ({problems}); it cannot be approved or applied"
        )


def spec_document_drift(ctx: Context, stored: Plan) -> None:
    """Refuse a plan whose spec-derived fields differ from the spec and catalog now.

    Raises:
        ApprovalError: naming the fields that differ.
    """
    now = spec_document(ctx)
    planned = stored.document.spec_fields()
    changed = [k for k, v in now.items() if planned.get(k) != v]
    if changed:
        raise ApprovalError(
            f"the spec or the target changed since plan {stored.plan_id[:16]} was made "
            f"({', '.join(changed)} differ); plan again"
        )


def short_readings(fp: Reading) -> str:
    """A fingerprint in one short phrase: rows, total and the start of the hash."""
    return f"{fp['row_count']} rows, total {fp['total']}, hash {fp['content_hash'][:16]}"


def compare_readings(expected: dict[str, Reading], actual: dict[str, Reading], step: str) -> None:
    """Every partition of ``actual`` carries the ``expected`` readings (VerificationError naming
    the first that does not, with both readings)."""
    for label, want in expected.items():
        if actual[label] != want:
            raise VerificationError(label, step, short_readings(want), short_readings(actual[label]))


def target_readings(conn: psycopg.Connection, ctx: Context, labels: list[str]) -> dict[str, Reading]:
    """The target's readings of partitions ``labels`` of the context, in the caller's
    transaction (the same readings a plan records for its stages)."""
    target = ctx.engine.open(conn, conn, None, ctx)  # read only: no lock, no control store
    try:
        return target.readings(labels)
    finally:
        target.close()  # a lake target's catalog connections


# The source checks' words, by how the input is read: "database", a relation in the source's
# own database, counted there in SQL (ordering first, rows outside the partitions last, as
# transform_sql's doing); "loaded", the input as the build engine loads it from the source
# (rows outside the partitions first, with examples).
SourceWording = Literal["database", "loaded"]


@dataclass(frozen=True)
class Outside:
    """Input rows outside the declared partitions, or in a NULL partition."""

    rows: int  # how many (with examples: at least theirs)
    examples: Sequence[tuple[Any, int]] = ()  # up to three (partition, rows), most rows first


@dataclass(frozen=True)
class Tie:
    """A group of rows that tie on every ordering column within a key, yet differ."""

    scope: tuple[Any, ...]  # (its partition,), or (): ties per key across partitions (records that can move)
    key: tuple[Any, ...]  # the business key's values
    rows: int  # how many different rows


@dataclass(frozen=True)
class Ties:
    keys: int  # how many keys have tied rows (the "database" wording names it)
    examples: Sequence[Tie]  # up to three; none: no ties


class SourceCounts(Protocol):
    """What an engine counts of its input for :func:`check_source_counts`, each asked once at
    most, in the checks' order: nothing is counted after the first refusal."""

    def outside(self) -> Outside: ...

    def ordering_nulls(self) -> Sequence[int]:
        """Per ordering column of the spec, the keyed input rows with a NULL in it."""
        ...

    def reports(self) -> dict[str, tuple[int, int]]:
        """Per partition with input rows: (rows, rows with a NULL business key)."""
        ...

    def ties(self) -> Ties: ...


def check_source_counts(spec: Spec, counts: SourceCounts, wording: SourceWording) -> dict[str, tuple[int, int]]:
    """Refuse source data newest-wins cannot rebuild exactly, from ``counts``; return each
    partition's (rows read, rows with a NULL key), the plan's input report.

    Raises:
        SourceDataError: rows outside the declared partitions (or in a NULL one), NULLs in an
            ordering column without a declared NULL placement, a partition whose every row has
            a NULL business key, ties on every ordering column between rows that differ.
    """
    if wording == "loaded":
        _refuse_outside(counts.outside(), wording)
    undeclared = [f"{o.column}: {n} row(s)" for o, n in zip(spec.ordering, counts.ordering_nulls())
                  if n and o.nulls is None]
    if undeclared:
        raise SourceDataError(
            "ordering columns have NULL values and no declared NULL placement",
            "Declare where NULLs sort with `nulls: first` or `nulls: last` on that ordering column, or fix the source",
            undeclared,
        )
    reports = counts.reports()
    keyless = [f"partition {label}: {n} row(s)" for label, (n, nulls) in reports.items() if n and nulls == n]
    if keyless:
        # Every row dropped would empty the target partition: far more likely a wrong key.
        raise SourceDataError(
            "every source row of some partitions has a NULL business key "
            f"({', '.join(spec.business_key)}), so the rebuild would empty them",
            "Check business_key against the source (run `backfill-assets profile`)", keyless[:3],
        )
    _refuse_ties(spec, counts.ties(), wording)
    if wording == "database":
        _refuse_outside(counts.outside(), wording)
    return reports


def _refuse_outside(outside: Outside, wording: SourceWording) -> None:
    if not outside.rows:
        return
    if wording == "database":
        raise SourceDataError(
            f"transform_sql puts {outside.rows} row(s) outside the declared partitions or in a NULL partition",
            "A transform must keep every row in its source partition",
        )
    raise SourceDataError(
        "the input has rows outside the declared partitions (the transform moves them, or they have a "
        "NULL partition key)", "Keep the partition key as the source has it in transform_sql",
        [f"partition {value}: {n} row(s)" for value, n in outside.examples],
    )


def _refuse_ties(spec: Spec, ties: Ties, wording: SourceWording) -> None:
    if not ties.examples:
        return
    ordering = ", ".join(o.column for o in spec.ordering)
    if wording == "database":
        raise TiedRowsError(
            f"{ties.keys} key(s) have rows that tie on every ordering column ({ordering}) but differ, "
            "so newest-wins would pick one by chance",
            "Add a final tiebreak column to `ordering` (run `backfill-assets profile` to find one); do not guess",
            [("" if not t.scope else f"partition {t.scope[0]}, ")
             + f"key ({', '.join(f'{c}={v}' for c, v in zip(spec.business_key, t.key))}): {t.rows} different rows"
             for t in ties.examples],
        )
    raise TiedRowsError(
        f"rows tie on every ordering column ({ordering}) within a key but differ, so newest-wins would "
        "pick one of them by chance", "Add a final tiebreak column to ordering (an ingest sequence, a unique id)",
        [", ".join(f"{k}={v}" for k, v in zip([*[spec.partition_key] * len(t.scope), *spec.business_key],
                                              [*t.scope, *t.key]))
         + f" ({t.rows} different rows)" for t in ties.examples],
    )
