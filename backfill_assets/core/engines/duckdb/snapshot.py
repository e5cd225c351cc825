"""The DuckDB engine's snapshot: the newest version of the lake source pinned, its declared
partitions (and, with records_can_move, those moved keys add) counted and checked at it, and
named by the digest of their files at the pin.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from backfill_assets.core.context import Clock, Context
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.engines.duckdb.database import cursor
from backfill_assets.core.engines.duckdb.stages import attach_input, fields_of, partition_column, windowed
from backfill_assets.core.errors import SnapshotError
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.rows import Digest
from backfill_assets.core.lake.engine import lake_engine_for, refuse_keys_in_several_partitions
from backfill_assets.core.lake.parts import span_of, spans_table
from backfill_assets.core.lake.target import parts_of
from backfill_assets.core.moves import close_scope_with, placed
from backfill_assets.core.pinned.duck_types import source_types
from backfill_assets.core.pinned.pins import LakeSnapshot, Pin, record_snapshot
from backfill_assets.core.pinned.source import SOURCE_ROWS, WINDOWS, LakeSource
from backfill_assets.core.planning import Outside, Tie, Ties, check_source_counts
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.vocabulary import PartitionValue, partition_label

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection

TARGET_KEYS = "target_keys"  # the lake target's keys, registered for the moved keys' homes


def input_of(ctx: Context, source_names: Sequence[str]) -> Any:
    """The input of the builds, each row with its window's label for time windows."""
    return windowed(ctx, statements.input_relation(source_names, ctx.spec.input_columns, ctx.transform),
                    ctx.spec.input_columns)


def check_source(duck: DuckDBPyConnection, ctx: Context) -> dict[str, tuple[int, int]]:
    """Refuse source data newest-wins cannot rebuild exactly, by the rules every engine applies
    (core.planning.check_source_counts, over :class:`_Counts`); return each partition's (rows read,
    rows with a NULL key).

    Raises:
        SourceDataError: NULLs in an ordering column without declared NULL placement, ties on
            every ordering column between rows that differ, a partition whose every row has a
            NULL key, rows a transform moves outside the declared partitions.
    """
    relation = input_of(ctx, [name for name, _ in source_types(duck)])
    return check_source_counts(ctx.spec, _Counts(duck, ctx, relation), "loaded")


@dataclass(frozen=True)
class _Counts:
    """The source checks' counts of the input ``relation``, each read in DuckDB when asked."""

    duck: DuckDBPyConnection
    ctx: Context
    relation: Any

    def outside(self) -> Outside:
        found = self.duck.execute(statements.outside_partitions(self.relation, partition_column(self.ctx)),
                                  {"partitions": list(self.ctx.partitions)}).fetchall()
        return Outside(sum(n for _, n in found), [(value, n) for value, n in found])

    def ordering_nulls(self) -> Sequence[int]:
        spec = self.ctx.spec
        query = statements.ordering_nulls(self.relation, spec.business_key, [o.column for o in spec.ordering])
        return self.duck.execute(query).fetchall()[0]

    def reports(self) -> dict[str, tuple[int, int]]:
        query = statements.input_report(self.relation, partition_column(self.ctx), self.ctx.spec.business_key)
        return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in self.duck.execute(query).fetchall()}

    def ties(self) -> Ties:
        spec = self.ctx.spec
        fields = fields_of(self.ctx.target_columns)  # the output rows decide whether tied rows differ
        # A key that can move has one newest version across partitions, so ties are per key.
        scope_key = None if spec.records_can_move else partition_column(self.ctx)
        tied = self.duck.execute(statements.tied_groups(
            self.relation, scope_key, spec.business_key, [o.column for o in spec.ordering], fields)).fetchall()
        width = 0 if scope_key is None else 1  # each row: (partition,)? key values..., different rows
        return Ties(len(tied), [Tie(tuple(row[:width]), tuple(row[width:-1]), row[-1]) for row in tied])


def _target_keys(duck: DuckDBPyConnection, control: psycopg.Connection, ctx: Context) -> str:
    """The lake target's distinct (partition key, business key) pairs at its current version,
    registered on ``con`` (records_can_move: where a key lives now).

    Raises:
        SourceDataError: a business key lies in more than one partition of the target.
    """
    spec = ctx.spec
    names = [spec.partition_key, *spec.business_key]
    table = lake_engine_for(spec).table(control)
    try:
        handle = table.open()
        data = lake_schema(ctx.target_columns).empty_table().select(names) if handle is None \
            else table.read_columns(handle, names)
    finally:
        table.close()
    duck.register(TARGET_KEYS, data.group_by(names).aggregate([]).select(names))
    refuse_keys_in_several_partitions(
        spec, duck.execute(statements.keys_in_several_partitions(TARGET_KEYS, spec.business_key)).fetchall())
    return TARGET_KEYS


def _moved_scope(control: psycopg.Connection, ctx: Context, source: LakeSource, db: DuckDBPyConnection, pin: Pin,
                 progress: Progress) -> Context:
    """records_can_move: the context with every partition a moved key leaves or enters added,
    to a fixed point, read at ``pin`` (every partition of it) and the target as it is now."""
    spec = ctx.spec
    windowing = ctx.windowing
    with contextlib.closing(cursor(db)) as duck:
        source.attach_all(duck, pin)
        keys = _target_keys(duck, control, ctx)
        if windowing is None:
            query = statements.key_homes(keys, spec.partition_key, spec.business_key, spec.ordering)
        else:  # every row labelled by the windows asked about, registered each round
            names = [name for name, _ in source_types(duck)]
            query = statements.window_key_homes(
                windowed(ctx, sql.Identifier(SOURCE_ROWS), names),
                windowed(ctx, sql.Identifier(keys), [spec.partition_key, *spec.business_key]),
                spec.partition_key, spec.business_key, spec.ordering)

        def homes(partitions: list[PartitionValue]) -> list[tuple]:
            if windowing is not None:
                duck.register(WINDOWS, spans_table([span_of(windowing, str(p)) for p in partitions]))
            rows = [tuple(r) for r in duck.execute(query, {"partitions": partitions}).fetchall()]
            return rows if windowing is None else placed(rows, windowing, {str(p) for p in partitions})

        scope = close_scope_with(spec, ctx.kind, ctx.partitions, homes)
        if windowing is not None:  # in time order
            scope.partitions = list(windowing.labels([str(p) for p in scope.partitions]))
    ctx.engine.check_partitions(scope.partitions)
    if scope.added:
        progress(ProgressEvent("snapshot", f"moved records add partition(s) {', '.join(scope.added)}"))
    return dataclasses.replace(ctx, partitions=scope.partitions, scope=scope)


# How often a folder source is pinned again for the partitions moved keys add (each round
# the scope can only grow unless the folder changes meanwhile).
_PIN_ROUNDS = 5


def take_snapshot(control: psycopg.Connection, ctx: Context, source: LakeSource, db: DuckDBPyConnection, clock: Clock,
                  progress: Progress) -> tuple[LakeSnapshot, Context]:
    """Pin the source's newest version, count and check the declared partitions at it (with
    records_can_move, the partitions moved keys add too), and record the snapshot in the
    control store. Returns the snapshot and the context, widened by moved keys."""
    spec = ctx.spec
    requested = list(ctx.labels)
    pin = source.latest(spec.partition_key, parts_of(ctx))
    progress(ProgressEvent("snapshot", f"pinned {spec.source_name} at version {pin.version[:16]}"))
    if spec.records_can_move:
        asked = ctx
        ctx = _moved_scope(control, asked, source, db, pin, progress)
        # A folder's pin holds only the partitions it was taken for: pin the partitions moved
        # keys added, and close the scope again from those asked for, at that pin, until the
        # pin holds the scope (the files of the partitions outside it are read as they are).
        pinned_for = set(asked.labels)
        for _ in range(_PIN_ROUNDS):
            if source.keeps_versions or set(ctx.labels) == pinned_for:
                break
            pinned_for = set(ctx.labels)
            pin = source.latest(spec.partition_key, parts_of(ctx))
            ctx = _moved_scope(control, asked, source, db, pin, progress)
        else:
            raise SnapshotError(f"source {spec.source_name} kept changing while moved keys' partitions were "
                                "pinned; plan again when its writers are done")
    with contextlib.closing(cursor(db)) as duck:
        attach_input(duck, ctx, source, pin, ctx.labels)
        found = [name for name, _ in source_types(duck)]
        names = set(found)
        columns = [c for c in ctx.inspection.source_columns if c.name in names]
        rows = windowed(ctx, sql.Identifier(SOURCE_ROWS), found)
        counts = {partition_label(p): int(n) for p, n in duck.execute(
            statements.partition_counts(rows, partition_column(ctx)), {"partitions": list(ctx.partitions)}).fetchall()}
        reports = check_source(duck, ctx)
    # The pinned version cannot change, so its files name each partition's rows: their digest
    # is the partition's hash here (the rows themselves are fingerprinted in the stages).
    files = source.signature_at(pin, spec.partition_key, parts_of(ctx))
    parts = {label: Digest(row_count=counts.get(label, 0), content_hash=files[label]) for label in ctx.labels}
    return record_snapshot(control, ctx, pin, columns, parts, requested, reports, clock), ctx


def input_reports(db: DuckDBPyConnection, ctx: Context, snapshot: LakeSnapshot, source: LakeSource) -> dict[str, tuple[int, int]]:
    with contextlib.closing(cursor(db)) as duck:
        attach_input(duck, ctx, source, snapshot.pin, ctx.labels)
        relation = input_of(ctx, [name for name, _ in source_types(duck)])
        found = duck.execute(statements.input_report(relation, partition_column(ctx), ctx.spec.business_key)).fetchall()
    return {partition_label(p): (int(n), int(nulls)) for p, n, nulls in found}
