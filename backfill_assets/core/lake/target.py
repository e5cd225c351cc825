"""The lake as apply's target (core.context.Target), for a Delta or Iceberg table whose
engine is core.lake.engine's :class:`LakeEngine`.

The protocol of core.apply, for a lake table:

- ``locked``: the same advisory locks as a PostgreSQL target keep other backfills of the
  partitions out; writers outside this tool are caught by the lake's own conflict check.
- ``writing``: what the build engine's target holds of its stage while it writes
  (``data_transaction``: on the PostgreSQL engine a READ COMMITTED transaction on apply's
  connection, the stage rechecked and held in SHARE mode until the lake commit is done,
  core.engines.postgres.lake), and the lake table loaded at its
  current version. ``readings`` reads the partition at that version; ``replace`` reads the
  approved stage into Arrow; the readings after it are those of the rows about to be
  written, so a conversion that changed a value is caught before the commit. On a clean exit
  the partition is overwritten in one commit based on that version: a writer since then
  makes it fail (TransientDatabaseError, safe to retry). A missing table is created first,
  empty and partitioned by the partition key (the plan said it would be).
  With ``records_can_move`` a business key has one home across the table, which the plan
  checked when it loaded the lake's keys. Right before the commit, the keys of the rows
  being written are looked for outside the partitions being replaced, at exactly the version
  the commit is based on: one found there (a writer put it there since the plan) refuses the
  write (KeysElsewhereError, nothing committed, plan again). The commit is then exclusive
  (core.lake.tables): the very next version after that one, or none, so no commit to another
  partition can slip in between the check and ours (TransientDatabaseError, safe to retry).
  Should an engine rebase it all the same (LakeTable.follows says so), the keys are checked
  again at our committed version, and a key found elsewhere fails the partition loudly
  (VerificationError: committed, recorded as failed, the run stops).
- ``committed_readings``: the partition at exactly the version we committed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg
import pyarrow as pa

from backfill_assets.core.context import Checkpoint, Context, Signals, no_checkpoint
from backfill_assets.core.errors import BackfillError, KeysElsewhereError, TransientDatabaseError, VerificationError
from backfill_assets.core.fingerprint.arrow import arrow_readings
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.lake.parts import Part, span_of
from backfill_assets.core.lake.tables import META_PREFIX, KeysFound, LakeTable, keys_found, lake_errors
from backfill_assets.core.pg.db import transient_errors
from backfill_assets.core.targets.common import AdvisoryLocked


def part_of(ctx: Context, label: str) -> Part:
    """The partition ``label`` as a lake table is asked for it: its value, or its window's
    bounds as the column holds them."""
    windowing = ctx.windowing
    return ctx.value_of(label) if windowing is None else span_of(windowing, label)


def parts_of(ctx: Context, labels: Sequence[str] | None = None) -> list[Part]:
    """:func:`part_of` of each of ``labels`` (default: the context's partitions)."""
    return [part_of(ctx, label) for label in (ctx.labels if labels is None else labels)]


class LakeTarget(AdvisoryLocked):
    """A Delta or Iceberg table whose partitions apply replaces (see the module docstring).

    The build engine's target reads stage A's approved rows (:meth:`read_stage`: from
    PostgreSQL, a DuckDB table, Spark's files) and says what the write holds in the stage's
    database (:meth:`data_transaction`). Where the engine rechecks stage A under the partition
    lock by reading its rows into Arrow (:meth:`recheck`), the replace then writes exactly those
    rows, and the verification before the commit finds their readings already computed: one
    read and one fingerprint of the stage serve both, and what is checked is what is written."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, table: LakeTable,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        self.conn, self.control, self.ctx, self.table, self.checkpoint = conn, control, ctx, table, checkpoint
        self.schema = lake_schema(ctx.target_columns)  # the stage's columns, in the spec's order
        self._committed: dict[str, str | None] = {}
        self._rechecked: dict[str, pa.Table] = {}  # label -> stage A's rows read by the recheck
        self._known: dict[int, tuple[pa.Table, Reading]] = {}  # id(rows) -> (rows, their readings)
        self._keeping = False  # from a recheck to the end of its write: readings kept by rows

    def part(self, label: str) -> Part:
        return part_of(self.ctx, label)

    def parts(self, labels: list[str]) -> list[Part]:
        return parts_of(self.ctx, labels)

    def fingerprint(self, data: pa.Table) -> Reading:
        """The readings of one partition's rows in Arrow (the canonical fingerprint)."""
        spec = self.ctx.spec
        return arrow_readings(data, self.ctx.target_columns, spec.business_key, spec.total).as_dict()

    def readings_of(self, data: pa.Table) -> Reading:
        """:meth:`fingerprint`, computed once for rows a recheck read (until its write ends)."""
        known = self._known.get(id(data))
        if known is not None and known[0] is data:
            return known[1]
        readings = self.fingerprint(data)
        if self._keeping:
            self._known[id(data)] = (data, readings)
        return readings

    def _read(self, handle: Any, labels: list[str]) -> dict[str, Reading]:
        """Each partition as the handle's version holds it, read on its own (partition pruning
        reads only its files)."""
        if handle is None:  # no table yet: every partition is empty
            return {label: self.readings_of(self.schema.empty_table()) for label in labels}
        pk = self.ctx.spec.partition_key
        return {label: self.readings_of(self.table.read(handle, pk, [self.part(label)])) for label in labels}

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        with lake_errors(self.table, "reading"):
            return self._read(self.table.open(), labels)

    def signals(self, labels: list[str]) -> Signals:
        """Each partition's files as the table's current version lists them (LakeTable.partition_signatures)."""
        values = self.parts(labels)
        with lake_errors(self.table, "listing the files of"):
            handle = self.table.open()
            found = self.table.partition_signatures(handle, self.ctx.spec.partition_key, values)
        if found is None:
            return Signals(self.table.SIGNAL, dict.fromkeys(labels), "its files are not simply its rows (deletion "
                           "vectors, delete files, column mapping) or not by partition", at=handle)
        return Signals(self.table.SIGNAL, found, at=handle)

    def signals_at(self, version: str, labels: list[str]) -> dict[str, str | None] | None:
        values = self.parts(labels)
        try:
            with lake_errors(self.table, f"listing the files of version {version} of"):
                return self.table.partition_signatures(self.table.open(), self.ctx.spec.partition_key, values, version)
        except BackfillError:
            return None  # that version is gone (vacuumed, expired): no baseline, the rows are read

    def versions_touching(self, version: str, labels: list[str], most: int = 100) -> dict[str, list[str]] | None:
        """Of the versions committed after ``version`` (at most ``most``), those whose files of
        each partition differ from the version before (the commits that touched it: a write, a
        compaction, a delete); None where the table keeps no versions, ``version`` is gone, or
        there are more than ``most``."""
        values = self.parts(labels)
        pk = self.ctx.spec.partition_key
        try:
            with lake_errors(self.table, f"listing the versions after {version} of"):
                handle = self.table.open()
                after = self.table.versions_after(handle, version)
                if after is None or len(after) > most:
                    return None
                before = self.table.partition_signatures(handle, pk, values, version)
                touched: dict[str, list[str]] = {label: [] for label in labels}
                for each in after:
                    now = self.table.partition_signatures(handle, pk, values, each)
                    if before is None or now is None:
                        return None
                    for label in labels:
                        if now[label] != before[label]:
                            touched[label].append(each)
                    before = now
                return touched
        except BackfillError:
            return None

    def readings_at(self, signals: Signals, labels: list[str]) -> dict[str, Reading]:
        with lake_errors(self.table, "reading"):
            return self._read(signals.at, labels)

    def read_stage(self, label: str) -> pa.Table:
        """Stage A's rows of one partition, in the lake schema and business-key order: the build
        engine's target reads its own stage (core.engines.postgres.lake.PostgresLakeTarget,
        core.engines.duckdb.target.DuckLakeTarget)."""
        raise NotImplementedError

    def recheck(self, labels: list[str]) -> dict[str, Reading]:
        """Stage A's readings of ``labels`` now, from its rows read into Arrow, which the
        replace that follows in this write then writes."""
        self._keeping = True
        out = {}
        for label in labels:
            rows = self._rechecked[label] = self.read_stage(label)
            out[label] = self.readings_of(rows)
        return out

    def stage_rows(self, label: str) -> pa.Table:
        """The rows the replace writes: those the recheck read, else stage A's as they are."""
        rows = self._rechecked.pop(label, None)
        return self.read_stage(label) if rows is None else rows

    def data_transaction(self) -> contextlib.AbstractContextManager[None]:
        """What the write holds in the stage's database while it writes: nothing, where stage A
        is rechecked outside PostgreSQL under the partition lock (the PostgreSQL engine's
        target holds a transaction)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def writing(self, labels: list[str]) -> Iterator[LakeWrite]:
        spec = self.ctx.spec
        write: LakeWrite | None = None
        try:
            with transient_errors(f"replacing partition(s) {', '.join(labels)} of {spec.target_name}"), \
                    lake_errors(self.table, f"replacing partition(s) {', '.join(labels)} of"), self.data_transaction():
                write = self.new_write(self.table.open())
                yield write
                # Our commit's version; for partitions found already carrying the approved rows
                # (nothing written), the version they were read at.
                version = write.commit(labels) if write.pending is not None else self.table.version(write.handle)
                self._committed.update(dict.fromkeys(labels, version))
        finally:
            if write is not None:
                write.discard()
            self._rechecked.clear()
            self._known.clear()
            self._keeping = False

    def new_write(self, handle: Any) -> LakeWrite:
        """The write of one group of partitions, based on the handle's version."""
        return LakeWrite(self, handle)

    def committed_readings(self, labels: list[str]) -> dict[str, Reading]:
        version, pk = self._committed[labels[0]], self.ctx.spec.partition_key
        with lake_errors(self.table, f"reading back version {version} of"):
            return {label: self.readings_of(self.table.read_version(version, pk, [self.part(label)]))
                    for label in labels}

    def committed_version(self, labels: list[str]) -> str | None:
        """The version our write of ``labels`` committed, or that a skip found them at."""
        return self._committed.get(labels[0])

    def close(self) -> None:
        self.table.close()


class LakeWrite:
    """One write of a group of partitions: its readings before and after the replace, then one
    commit of the rows the replace read (a subclass writes them another way)."""

    def __init__(self, target: LakeTarget, handle: Any) -> None:
        self.target, self.handle = target, handle
        self.pending: dict[str, pa.Table] | None = None  # each partition's rows to commit
        self.note: dict[str, str] = {}  # plan_id, approval_id, ... (core.apply)
        self.metadata: dict[str, str] = {}

    def readings(self, labels: list[str]) -> dict[str, Reading]:
        if self.pending is None:
            return self.target._read(self.handle, labels)
        return {label: self.target.readings_of(self.pending[label]) for label in labels}

    def replace(self, labels: list[str], note: Mapping[str, str] | None = None) -> None:
        t = self.target
        self.pending = {label: t.stage_rows(label) for label in labels}
        self.note = dict(note or {})
        self.metadata = {META_PREFIX + k: v for k, v in self.note.items()}
        t.checkpoint("inserted", labels)

    def commit(self, labels: list[str]) -> str | None:
        """One commit of every pending partition (creating the table first if it is missing)."""
        t = self.target
        assert self.pending is not None
        handle = self.created()
        spec = t.ctx.spec
        values = t.parts(labels)
        # With records_can_move: the keys written here, in no other partition at the version
        # our commit is based on, and nothing committed between that version and ours.
        guarded = spec.records_can_move and self.writes_keys(labels)
        base = t.table.version(handle) if guarded else None  # a folder's version lists all of it
        if guarded:
            found = self.keys_elsewhere(handle, labels, values)
            if found is not None:
                raise KeysElsewhereError(
                    int(self.note.get("approval_id", "0")), self.note.get("plan_id", ""), spec.target_name, base,
                    labels, found.partitions, found.count, found.examples,
                )
        version = self.overwrite(handle, labels, values, exclusive=guarded)
        if guarded and not t.table.follows(handle, base, self.metadata):
            # The engine based our commit on a later version than the one checked: check the
            # version we committed (the handle reads it now). Committed already: say so loudly.
            found = self.keys_elsewhere(handle, labels, values)
            if found is not None:
                raise VerificationError(
                    labels[0], f"business key check after the commit of partition(s) {', '.join(labels)}",
                    f"their keys in no other partition of {spec.target_name}",
                    f"{found.count} key(s) also in partition(s) {', '.join(found.partitions)} at our version {version}",
                    f"our commit was based on a later version than {base}, where the keys were checked; for "
                    f"example {'; '.join(found.examples)}. Plan again, so that those keys are replaced with "
                    "their partitions",
                )
        return version

    def created(self) -> Any:
        """The handle our commit is based on, the table created first if it is missing."""
        t = self.target
        if self.handle is None:
            created = t.table.create(t.schema, t.ctx.spec.partition_key, t.ctx.windowing)
            self.handle = t.table.open()
            # Our commit is based on this handle: it must be the table as created, or the rows
            # of a writer that came in between would be overwritten without a conflict.
            if t.table.version(self.handle) != created:
                raise TransientDatabaseError(
                    f"another writer wrote to {t.table.name} right after this run created it; nothing "
                    "of ours was committed"
                )
        return self.handle

    def keys(self, labels: list[str]) -> pa.Table:
        """The business keys of the rows being written."""
        assert self.pending is not None
        keys = list(self.target.ctx.spec.business_key)
        return pa.concat_tables([self.pending[label].select(keys) for label in labels])

    def overwrite(self, handle: Any, labels: list[str], values: list[Part], exclusive: bool) -> str | None:
        """The commit of the pending rows of ``labels``, based on the handle's version."""
        t = self.target
        assert self.pending is not None
        data = pa.concat_tables([self.pending[label] for label in labels])
        return t.table.overwrite(handle, t.ctx.spec.partition_key, values, data, self.metadata, exclusive=exclusive)

    def discard(self) -> None:
        """Remove what the write left outside the table and did not commit (nothing, here)."""

    def writes_keys(self, labels: list[str]) -> bool:
        """Whether the write puts any row (so any business key) into ``labels``."""
        return self.keys(labels).num_rows > 0

    def keys_elsewhere(self, handle: Any, labels: list[str], values: list[Part]) -> KeysFound | None:
        """The keys being written that the handle's version holds outside ``values``."""
        t = self.target
        spec = t.ctx.spec
        windowing = t.ctx.windowing
        return keys_found(t.table.keys_elsewhere(handle, spec.partition_key, values, self.keys(labels)),
                          spec.partition_key, spec.business_key,
                          *(() if windowing is None else (windowing.label_at,)))
