"""The context of a run: the spec resolved against the catalog, its clock and progress, the
finite timeouts and the per-spec lock every step takes.

``resolve`` inspects read-only and validates everything about a spec (identifiers, the
partitions, the transform) before anything is written; the :class:`Context` it returns is
what the snapshot, the stages, the plan, approval and apply work from.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
from psycopg import sql

from backfill_assets.core import sqlbuild
from backfill_assets.core.catalog import ColumnInfo, Inspection, inspect_tables
from backfill_assets.core.db import advisory_session_lock
from backfill_assets.core.fingerprint import Fingerprint, fingerprint_partition
from backfill_assets.core.moves import Scope
from backfill_assets.core.spec import (
    PartitionKind, PartitionRequest, PartitionValue, Spec, TableRef, parse_labels, partition_label,
)
from backfill_assets.core.transform import validate_transform_in_catalog, validate_transform_text

Clock = Callable[[], dt.datetime]
_SET_LOCAL = sql.SQL("SELECT set_config(%(name)s, %(value)s, true)")


def utc_now() -> dt.datetime:
    """The default clock; only metadata timestamps read it, never a build."""
    return dt.datetime.now(dt.timezone.utc)


def set_local(conn: psycopg.Connection, name: str, value: str) -> None:
    """Set a setting for the current transaction only."""
    conn.execute(_SET_LOCAL, {"name": name, "value": value})


def spec_lock(conn: psycopg.Connection, spec: Spec, *, shared: bool = False):
    """A session lock per spec: plan and apply of one spec never overlap, so a stage cannot
    be rebuilt while it is being applied. A second run is refused at once.

    ``shared``: the build steps of a spec with ``parallel`` (see :func:`build_lock`) hold it
    shared, so several build at once, each holding its own partitions; apply and a whole plan
    hold it alone."""
    return advisory_session_lock(
        conn, f"backfill_assets:plan:{spec.control_schema}:{spec.name}",
        f"a plan or apply of spec {spec.name}", shared=shared,
    )


def build_lock(conn: psycopg.Connection, spec: Spec):
    """The spec lock a snapshot or stages step holds: alone, or shared with the other builds
    of a spec with ``parallel`` (which then hold their partitions, :func:`partition_locks`)."""
    return spec_lock(conn, spec, shared=spec.parallel is not None)


@contextlib.contextmanager
def partition_locks(conn: psycopg.Connection, spec: Spec, labels: list[str]) -> Iterator[None]:
    """For a spec with ``parallel``: a session lock per partition a build step snapshots or
    builds, so two builds sharing the spec lock never write the same partition (the second is
    refused at once). Nothing for another spec: it builds alone under its spec lock."""
    with contextlib.ExitStack() as held:
        if spec.parallel is not None:
            for label in labels:
                held.enter_context(advisory_session_lock(
                    conn, f"backfill_assets:build:{spec.control_schema}:{spec.name}:{label}",
                    f"a build of partition {label} of spec {spec.name}",
                ))
        yield


@dataclass(frozen=True)
class Context:
    """A spec checked against the catalog, with its partitions and transform resolved."""

    spec: Spec
    inspection: Inspection
    partitions: list[PartitionValue]  # requested, plus those moved records add
    transform: str | None  # the re-printed, validated transform_sql
    scope: Scope | None = None  # records_can_move: the added partitions and moves
    # records_can_move with a lake target: the lake's keys, loaded into a temporary table for
    # the snapshot's transaction (core.lake_target.load_target_keys).
    target_keys: TableRef | None = None

    @property
    def keys_relation(self) -> TableRef:
        """Where the target's (partition key, business key) pairs are read in SQL: the
        PostgreSQL target itself, or a lake target's keys loaded for the snapshot."""
        return self.target_keys if self.target_keys is not None else self.spec.target_ref

    @property
    def kind(self) -> PartitionKind:
        assert self.inspection.partition_kind is not None
        return self.inspection.partition_kind

    @functools.cached_property
    def labels(self) -> list[str]:
        """The partitions' labels, computed once (callers look labels up per partition)."""
        return [partition_label(p) for p in self.partitions]

    def value_of(self, label: str) -> PartitionValue:
        """The partition value with this label."""
        return self._values[label]

    @functools.cached_property
    def _values(self) -> dict[str, PartitionValue]:
        return dict(zip(self.labels, self.partitions))

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
        # The stages have the index; a PostgreSQL target may (a lake target is read in Arrow).
        indexed = spec.target.is_lake or rel != spec.target_ref or self.inspection.target_key_indexed
        return fingerprint_partition(
            conn, rel, self.target_columns, spec.partition_key, spec.business_key, spec.total,
            partition, key_unique=True, indexed=indexed,
        )


def resolve(
    conn: psycopg.Connection, spec: Spec, request: PartitionRequest | list[str],
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
    inspection = inspect(conn, spec, transform)
    lake = spec.target.is_lake
    kind = inspection.require_plannable()
    if isinstance(request, PartitionRequest):
        partitions = request.resolve(kind)
    else:
        partitions = parse_labels(request, kind)
    if lake:
        from backfill_assets.core.lake_target import check_partition_values
        check_partition_values(spec, partitions)
    else:
        _validate_transform(conn, spec, inspection, transform)
    return Context(spec, inspection, partitions, transform)


def inspect(conn: psycopg.Connection, spec: Spec, transform: str | None = None) -> Inspection:
    """Inspect read-only: the catalog (catalog.inspect_tables) and, for a lake target, the
    stage's types as the source or the validated transform gives them, and the lake table
    (core.lake_target.inspect_lake). ``transform``: the validated transform_sql (None: validate
    the spec's here, for a lake target that has one).

    Raises:
        TransformError: a lake spec's transform is refused.
    """
    inspection = inspect_tables(conn, spec)
    if spec.target.is_lake and not inspection.problems:
        if transform is None and spec.transform_sql is not None:
            transform = validate_transform_text(spec.transform_sql)
        # A lake target's types are the stage's, which the (validated) transform gives.
        _validate_transform(conn, spec, inspection, transform)
        from backfill_assets.core.lake_target import inspect_lake  # pyarrow only for lake specs
        inspect_lake(conn, spec, inspection, transform)
    return inspection


def _validate_transform(conn: psycopg.Connection, spec: Spec, inspection: Inspection, transform: str | None) -> None:
    if transform is not None:
        validate_transform_in_catalog(
            conn, spec.source_ref, [c.name for c in inspection.source_columns],
            spec.partition_key, spec.input_columns, transform, original=spec.transform_sql,
            trusted_functions=spec.trusted_functions,
        )
