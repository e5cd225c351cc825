"""A PostgreSQL table as the target: the first engine, in the spec's own database.

The stage lives in the same database, so apply's recheck of the stage runs in the same
transaction as the replace, and a comparison with the target reads it in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Signals, Target, TargetWrite, TransformGuard, no_checkpoint
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.inputs import input_problems
from backfill_assets.core.engines.postgres.watch_state import read_relation
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import business_key_order, inspect_tables
from backfill_assets.core.pg.db import ConnectionFactory, read_committed, repeatable_read, transient_errors
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets.common import AdvisoryLocked
from backfill_assets.core.vocabulary import PartitionValue, TableRef

TABLE_COUNTERS = "table counters"  # the name of a PostgreSQL target's signal (core.audit)


class PostgresEngine:
    """A ``format: postgres`` target (core.context.TargetEngine)."""

    compares_read_only = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.relation: TableRef | None = spec.target_ref

    def inspect(self, conn: psycopg.Connection, transform: str | None, guard: TransformGuard) -> Inspection:
        inspection = inspect_tables(conn, self.spec)
        inspection.problems.extend(input_problems(conn, self.spec, inspection))
        return inspection

    def check(self, conn: psycopg.Connection, inspection: Inspection, partitions: list[PartitionValue],
              transform: str | None, guard: TransformGuard) -> None:
        guard.check(conn, self.spec, inspection, transform)

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """Any partition value can be written: nothing to check."""

    def stage_table(self, ctx: PostgresContext, stage: TableRef) -> sql.Composed:
        return sqlbuild.create_empty_copy(stage, self.spec.target_ref, self.spec.columns, unlogged=True)

    def with_target_keys(self, conn: psycopg.Connection, ctx: PostgresContext) -> PostgresContext:
        return ctx  # read in place

    def plan_fields(self, ctx: PostgresContext) -> dict[str, Any]:
        return {"target_table_columns": [[c.name, c.type_name] for c in ctx.inspection.target_columns]}

    def creates_target(self, ctx: PostgresContext) -> bool | None:
        return None

    def plan_problems(self, conn: psycopg.Connection, ctx: PostgresContext) -> list[str]:
        return []  # the stage has the target's types

    def compared(self, conn: psycopg.Connection, ctx: PostgresContext, label: str,
                 version: str | None = None) -> tuple[TableRef, bool]:
        return self.spec.target_ref, False

    def held_elsewhere(self) -> tuple[list[TableRef], list[str]]:
        return [self.spec.target_ref], []

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: PostgresContext, checkpoint: Checkpoint = no_checkpoint) -> Target:
        return PostgresTarget(conn, control, factory, ctx, checkpoint)


class PostgresTarget(AdvisoryLocked):
    """A PostgreSQL table, written on apply's own connection (the stage lives in the same
    database, so its recheck runs in the same transaction as the replace).

    Locks: a session advisory lock per (target, partition), taken in one order by every run
    and held until the committed state is read back; inside the write, ``LOCK TABLE ... IN
    SHARE ROW EXCLUSIVE MODE``, which conflicts with every other writer (row locks cannot
    cover rows not yet inserted) and blocks no reader. Finite lock and statement timeouts.

    The read after the commit: where the table lets nothing but the write's own statements
    change its rows, in the transaction or at its commit (:func:`sqlbuild.sealable`, checked
    under the lock), the verification before the commit is sealed with the transaction that
    wrote the rows, and the committed partitions are read back by that seal (every row still
    written by that transaction, and as many as were verified) instead of hashed again; where
    the seal does not hold, or the table is not sealable, they are hashed in full
    (docs/reliability.md, "The read after the commit").
    """

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                 ctx: PostgresContext, checkpoint: Checkpoint = no_checkpoint) -> None:
        self.conn, self.control, self.factory, self.ctx, self.checkpoint = conn, control, factory, ctx, checkpoint
        self._reader: psycopg.Connection | None = None
        # The last write's verified readings and the transaction that wrote them: (labels, readings, writer).
        self._seal: tuple[list[str], dict[str, Reading], str | None] | None = None
        self.last_committed_read: str | None = None  # "seal" or "full": how the last committed read was made

    def _values(self, labels: list[str]) -> list[object]:
        return [self.ctx.value_of(label) for label in labels]

    def read(self, conn: psycopg.Connection, labels: list[str]) -> dict[str, Reading]:
        found = self.ctx.readings_of(conn, self.ctx.spec.target_ref, self._values(labels))
        return {label: fp.as_dict() for label, fp in zip(labels, found)}

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        return self.read(self.conn, labels)

    def signals(self, labels: list[str]) -> Signals:
        """The table's write counters, file nodes and columns (docs/reliability.md, "Watching a
        target after the backfill"): one signal for every partition, since PostgreSQL counts
        writes per table (per leaf of a partitioned one), not per partition."""
        reading = read_relation(self.conn, self.ctx.spec.target_ref, "target")
        if reading is None:
            return Signals(TABLE_COUNTERS, dict.fromkeys(labels), "the target table does not exist")
        if reading.blind:
            return Signals(TABLE_COUNTERS, dict.fromkeys(labels), reading.blind)
        value = hashlib.sha256(json.dumps(reading.as_json(), sort_keys=True).encode()).hexdigest()
        return Signals(TABLE_COUNTERS, dict.fromkeys(labels, value))

    def signals_at(self, version: str, labels: list[str]) -> dict[str, str | None] | None:
        return None  # a table keeps no versions

    def versions_touching(self, version: str, labels: list[str], most: int = 100) -> dict[str, list[str]] | None:
        return None  # a table keeps no versions

    def readings_at(self, signals: Signals, labels: list[str]) -> dict[str, Reading]:
        return self.readings(labels)  # read after the counters, which only grow

    @contextlib.contextmanager
    def writing(self, labels: list[str]) -> Iterator[TargetWrite]:
        spec = self.ctx.spec
        # READ COMMITTED whatever the server's default: every read after the lock sees every
        # write the lock waited for.
        self._seal = None
        with transient_errors(f"replacing partition(s) {', '.join(labels)} of {spec.target_name}"), \
                read_committed(self.conn):
            self.conn.execute(sqlbuild.lock_for_replace(spec.target_ref))
            yield _PostgresWrite(self)

    def committed_readings(self, labels: list[str]) -> dict[str, Reading]:
        # A second connection, opened once per apply, and a new transaction on it for each
        # read: it sees only what was committed, never the write's own view.
        if self.factory is None:
            raise TypeError("committed readings need a connection factory")
        try:
            return self._read_committed(labels)
        except psycopg.OperationalError:
            # Dropped while it sat idle (idle_session_timeout, a proxy, a restart): a partition
            # just committed is read again on a new connection, once.
            if self._reader is None or not self._reader.broken:
                raise
            self._reader = None
            return self._read_committed(labels)

    def _read_committed(self, labels: list[str]) -> dict[str, Reading]:
        assert self.factory is not None
        if self._reader is None or self._reader.closed or self._reader.broken:
            self._reader = self.factory()
        with repeatable_read(self._reader, read_only=True):
            if self._seal is not None and self._seal[0] == labels and self._seal_holds(self._reader):
                self.last_committed_read = "seal"
                return {label: self._seal[1][label] for label in labels}
            self.last_committed_read = "full"
            return self.read(self._reader, labels)

    def _seal_holds(self, reader: psycopg.Connection) -> bool:
        """Whether every committed row of the sealed partitions is one the sealed write left,
        and there are as many as it verified."""
        assert self._seal is not None
        labels, verified, writer = self._seal
        spec = self.ctx.spec
        query, params = sqlbuild.batch_seal_check(spec.target_ref, self.ctx.by, self._values(labels), writer)
        found = {row[0]: (int(row[1]), int(row[2])) for row in reader.execute(query, params).fetchall()}
        return all(found.get(self.ctx.value_of(label), (0, 0)) == (verified[label]["row_count"], 0)
                   for label in labels)

    def committed_version(self, labels: list[str]) -> str | None:
        return None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class _PostgresWrite:
    def __init__(self, target: PostgresTarget) -> None:
        self.target = target
        self.replaced = False
        self.writers: set[str] = set()  # the xmin the inserted rows carry (one, or none inserted)

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        found = self.target.readings(labels)
        if self.replaced:  # the verification before the commit: seal it, where the table allows
            self.target._seal = self._seal(labels, found)
        return found

    def _seal(self, labels: list[str], found: dict[str, Reading]) -> tuple[list[str], dict[str, Reading], str | None] | None:
        t = self.target
        spec, conn = t.ctx.spec, t.conn
        row = conn.execute(*sqlbuild.sealable(spec.target_ref)).fetchone()
        if not (row and row[0]) or len(self.writers) > 1:
            return None
        # No row written (empty partitions): the seal is that they are still empty.
        return list(labels), found, next(iter(self.writers), None)

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        # PostgreSQL keeps no commit metadata: the ledger row in the control schema, written
        # on the same server, records the plan and the readings.
        t = self.target
        spec, conn = t.ctx.spec, t.conn
        values = t._values(labels)
        for value in values:
            conn.execute(*sqlbuild.delete_partition(spec.target_ref, t.ctx.by, value))
        t.checkpoint("deleted", labels)
        self.replaced = True
        order = business_key_order(t.ctx.target_columns, spec.business_key)
        for value in values:
            written = conn.execute(*sqlbuild.insert_from_stage(
                spec.target_ref, t.ctx.stage("a"), spec.columns, t.ctx.by, order, value, writer=True)).fetchone()
            if written is not None:
                self.writers.add(str(written[0]))
        t.checkpoint("inserted", labels)
