"""What the PostgreSQL build engine asks of a target beyond what every step asks
(core.context.TargetEngine): its stage lives in PostgreSQL, so the target gives the stage
table its types, the target's keys are read in SQL, a partition of the target is compared
with the stage in SQL, the stage's values the target could not hold are found before approval,
and apply reads the approved rows from the stage. A PostgreSQL table's
engine answers these itself (core.engines.postgres.target.PostgresEngine); a lake table's
(core.lake.engine.LakeEngine) through this engine's half of it (core.engines.postgres.lake)."""

from __future__ import annotations

from typing import Protocol

import psycopg
from psycopg import sql

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Target, TargetEngine, TransformGuard, no_checkpoint
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.target import PostgresEngine
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import engine_for
from backfill_assets.core.vocabulary import PartitionValue, TableRef


class StagedTarget(Protocol):
    """A target as the PostgreSQL build engine asks it."""

    spec: Spec

    # The target as a table of the data database, where it is one (PostgreSQL), else None:
    # read in place by the moved-records scope and the readings' index check.
    relation: TableRef | None
    # Whether a comparison with the target (diff, a review's preview) may run in a read-only
    # transaction (False where a partition is loaded into a temporary table first).
    compares_read_only: bool

    def inspect(self, conn: psycopg.Connection, transform: str | None, guard: TransformGuard) -> Inspection:
        """Inspect source and target read-only, collecting every problem (the engine's
        resolve). ``transform``: the parsed transform_sql (None: the spec's, or none);
        ``guard``: the engine's check of it."""
        ...

    def check(self, conn: psycopg.Connection, inspection: Inspection, partitions: list[PartitionValue],
              transform: str | None, guard: TransformGuard) -> None:
        """What resolving must check after the partitions are known (the transform against
        the catalog; partition values the target can be written with). Raises SpecError."""
        ...

    def stage_table(self, ctx: PostgresContext, stage: TableRef) -> sql.Composed:
        """The statement that creates an empty stage with the target's column types."""
        ...

    def with_target_keys(self, conn: psycopg.Connection, ctx: PostgresContext) -> PostgresContext:
        """``ctx`` with the target's (partition key, business key) pairs readable in SQL in the
        caller's transaction (core.moves), for records_can_move."""
        ...

    def compared(self, conn: psycopg.Connection, ctx: PostgresContext, label: str,
                 version: str | None = None) -> tuple[TableRef, bool]:
        """One partition of the target as a relation for core.diff, and whether its columns
        are the canonical text forms (a lake partition loaded at ``version``)."""
        ...

    def plan_problems(self, conn: psycopg.Connection, ctx: PostgresContext) -> list[str]:
        """Problems with stage A's values that the target could not hold, before approval."""
        ...

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: PostgresContext, checkpoint: Checkpoint = no_checkpoint) -> Target:
        """The target apply (or approval) reads and writes, its approved rows read from the
        stage in PostgreSQL (core.context.TargetEngine.open)."""
        ...


def staged_engine(engine: TargetEngine) -> StagedTarget:
    """The target engine as the PostgreSQL build engine asks it: a PostgreSQL table's answers
    itself; a lake table's through this engine's half of it (the engine's allow-list names no
    other target)."""
    if isinstance(engine, PostgresEngine):
        return engine
    # Imported here, as core.targets imports a lake engine: a PostgreSQL spec never loads
    # pyarrow or the lake libraries.
    from backfill_assets.core.engines.postgres.lake import StagedLake
    return StagedLake(engine)  # type: ignore[arg-type]


def staged_target(spec: Spec) -> StagedTarget:
    """The spec's target engine, as the PostgreSQL build engine asks it (core.targets.engine_for)."""
    return staged_engine(engine_for(spec))


def staged(ctx: PostgresContext) -> StagedTarget:
    """The context's target engine, as the PostgreSQL build engine asks it."""
    return staged_engine(ctx.engine)


def keys_relation(ctx: PostgresContext) -> TableRef:
    """Where the target's (partition key, business key) pairs are read in SQL: the target's
    own table, or its keys loaded for the snapshot (:meth:`StagedTarget.with_target_keys`)."""
    if ctx.target_keys is not None:
        return ctx.target_keys
    relation = staged(ctx).relation
    assert relation is not None, "the engine loads the keys (with_target_keys) first"
    return relation
