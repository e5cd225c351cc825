"""The context this engine's steps work from: core.context.Context, and what only this engine
asks of it (the spec's stage tables in the control schema, the input relation and newest-wins
order in SQL, a partition's readings by the server's own fingerprint, and the target's keys
loaded for a snapshot's transaction). :func:`resolve <backfill_assets.core.engines.postgres.resolve.resolve>`
makes one; every Context this engine is handed is one."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from backfill_assets.core.context import Context
from backfill_assets.core.fingerprint.partition import fingerprint_partitions
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.vocabulary import PartitionValue, TableRef


@dataclass(frozen=True)
class PostgresContext(Context):
    """A spec resolved against its database's catalog (core.engines.postgres.resolve)."""

    # records_can_move with a target outside the database: its keys, loaded into a temporary
    # table for the snapshot's transaction (core.engines.postgres.staged).
    target_keys: TableRef | None = None
    # The spec's other inputs, as the builds read them (core.engines.postgres.inputs).
    inputs: tuple[sqlbuild.InputRead, ...] = ()

    def with_keys(self, keys: TableRef) -> PostgresContext:
        """This context, reading the target's keys from ``keys``."""
        return dataclasses.replace(self, target_keys=keys)

    @functools.cached_property
    def by(self) -> sqlbuild.PartitionBy:
        """Which partition a row is in, as this engine's SQL says it."""
        if self.windowing is None:
            return sqlbuild.ValuesBy(self.spec.partition_key)
        return sqlbuild.WindowsBy(self.spec.partition_key, self.windowing)

    def input_relation(self, base: TableRef, *, filtered: bool) -> sql.Composed:
        """The rows the builds read from ``base``; ``filtered``: ``base`` is the live source,
        read for the context's partitions (bound by :meth:`bound`)."""
        return sqlbuild.input_relation(
            base, self.source_column_names, self.by, self.spec.input_columns,
            self.transform, filtered=filtered, inputs=self.inputs,
        )

    def bound(self, partitions: Sequence[PartitionValue] | None = None) -> dict[str, object]:
        """The parameters that name ``partitions`` (the context's, by default: worked out once,
        for every batch of a build) to a statement."""
        return dict(self._bound) if partitions is None else self.by.bind(partitions)

    @functools.cached_property
    def _bound(self) -> dict[str, object]:
        return self.by.bind(self.partitions)

    def ordering_keys(self) -> list[sqlbuild.OrderKey]:
        """The declared newest-wins order; collatable columns sort by bytes."""
        collatable = {c.name: c.collatable for c in self.inspection.source_columns}
        return [
            sqlbuild.OrderKey(o.column, o.direction, o.nulls, collate_c=collatable.get(o.column, False))
            for o in self.spec.ordering
        ]

    def stage(self, variant: str) -> TableRef:
        return TableRef(self.spec.control_schema, f"{self.spec.name}__stage_{variant}")

    @property
    def utf8(self) -> bool:
        """The data database's encoding is UTF8 (a text's octet_length is its UTF-8 length)."""
        return self.inspection.server.encoding == "UTF8"

    def readings(self, conn: psycopg.Connection, rel: TableRef, partition: PartitionValue) -> Fingerprint:
        """The fingerprint of one partition of a stage or of the target (:meth:`readings_of`)."""
        return self.readings_of(conn, rel, [partition])[0]

    def readings_of(self, conn: psycopg.Connection, rel: TableRef, partitions: Sequence[PartitionValue]) -> list[Fingerprint]:
        """The fingerprints of partitions of a stage or of the target, in that order, from one
        aggregate, in the caller's transaction. Both rule duplicates out (a stage's unique
        index; the target's unique key, which inspection requires), so they are not counted;
        but a window holds several values of the partition key, so a target whose unique key
        includes that column can hold a business key twice in one window: there they are."""
        spec = self.spec
        return fingerprint_partitions(
            conn, rel, self.target_columns, self.by, spec.business_key, spec.total,
            partitions, key_unique=rel != spec.target_ref or self._key_unique_per_partition, utf8=self.utf8,
        )

    @functools.cached_property
    def _key_unique_per_partition(self) -> bool:
        """Whether the target's unique keys keep a business key to one row per partition."""
        if self.windowing is None:
            return True
        return any(set(cols) <= set(self.spec.business_key) for _, cols in self.inspection.target_unique_keys)
