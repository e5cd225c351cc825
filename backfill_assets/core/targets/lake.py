"""A lake table as the target: the stage lives in PostgreSQL, the target is a Delta or
Iceberg table (core.targets.lake_tables; each format's engine in its own module), and one
fingerprint (core.fingerprint.arrow) says whether they hold the same rows.

:class:`LakeEngine` is what the steps ask of a lake target (core.context.TargetEngine):
the stage's types come from the source or transform, the table's keys and partitions are
loaded into temporary tables for the SQL that reads them, and the plan records the schema
the stage maps to and whether apply creates the table.

The protocol of core.apply, for a lake table:

- ``locked``: the same advisory locks as a PostgreSQL target keep other backfills of the
  partitions out; writers outside this tool are caught by the lake's own conflict check.
- ``writing``: a READ COMMITTED transaction on apply's connection (the stage recheck, with the
  stage held in SHARE mode until the lake commit is done), and the lake table loaded at its
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
  (core.targets.lake_tables): the very next version after that one, or none, so no commit to another
  partition can slip in between the check and ours (TransientDatabaseError, safe to retry).
  Should an engine rebase it all the same (LakeTable.follows says so), the keys are checked
  again at our committed version, and a key found elsewhere fails the partition loudly
  (VerificationError: committed, recorded as failed, the run stops).
- ``committed_readings``: the partition at exactly the version we committed.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
from psycopg import sql

from backfill_assets.core.context import Checkpoint, Context, Readings, Target, no_checkpoint
from backfill_assets.core.errors import (
    KeysElsewhereError,
    SourceDataError,
    SpecError,
    TransientDatabaseError,
    VerificationError,
)
from backfill_assets.core.fingerprint.arrow import arrow_readings, canonical_texts
from backfill_assets.core.fingerprint.kinds import lake_schema, lake_type
from backfill_assets.core.fingerprint.stage_arrow import read_stage_partition
from backfill_assets.core.guard.transform import validate_transform_text
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import (
    ColumnInfo,
    Inspection,
    check_total,
    describe_query,
    inspect_source,
    partition_kind_of,
)
from backfill_assets.core.pg.db import ConnectionFactory, read_committed, transient_errors
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets.common import AdvisoryLocked, check_transform
from backfill_assets.core.targets.lake_tables import (
    META_PREFIX,
    KeysFound,
    LakeTable,
    keys_found,
    lake_errors,
    shape_problems,
    type_text,
)
from backfill_assets.core.vocabulary import PartitionValue, TableRef

_ROWS_PER_SLICE = 65_536  # rows written as CSV at a time by _copy_csv


def _copy_csv(conn: psycopg.Connection, rel: TableRef, data: pa.Table) -> None:
    """``COPY rel FROM STDIN`` of an Arrow table's columns as CSV written by Arrow (strings
    quoted, NULL an empty field), a slice at a time: no Python object per value."""
    with conn.cursor() as cur, cur.copy(sqlbuild.copy_keys_in(rel, data.column_names)) as copy:
        for batch in data.to_batches(max_chunksize=_ROWS_PER_SLICE):
            buffer = io.BytesIO()
            pcsv.write_csv(batch, buffer, pcsv.WriteOptions(include_header=False))
            copy.write(buffer.getvalue())


@dataclass(frozen=True)
class LakeState:
    """What inspection found of a lake target: the table's name, whether it exists (apply
    creates it otherwise, and the plan says so), and the schema the stage maps to."""

    table: str
    exists: bool
    columns: list[tuple[str, str]]
    partitioned_by: list[str]
    catalog: str | None = None  # an Iceberg table's catalog (IcebergLakeTable.identity)

    def as_dict(self) -> dict[str, Any]:
        """How ``inspect`` shows it, under ``lake_table``."""
        return {"lake_table": {"table": self.table, "exists": self.exists, "columns": [list(c) for c in self.columns],
                               "partitioned_by": self.partitioned_by, "catalog": self.catalog}}


def refuse_keys_in_several_partitions(spec: Spec, found: list[tuple]) -> None:
    """records_can_move over a lake target: each business key must have one home there.

    Raises:
        SourceDataError: naming up to 5 keys (``found``: rows of key values, then a count).
    """
    if found:
        raise SourceDataError(
            f"{len(found)}+ business key(s) lie in more than one partition of {spec.target_name}, so the "
            "partition a moved key leaves cannot be told",
            "Replace those partitions with records_can_move off first, so that each key has one home",
            [", ".join(f"{k}={v}" for k, v in zip(spec.business_key, row[:-1])) for row in found],
        )


class LakeEngine:
    """A lake target (core.context.TargetEngine). A format supplies :meth:`table`; the
    rest is the same for Delta and Iceberg."""

    relation: TableRef | None = None  # not a table of the data database
    compares_read_only = False  # a partition is compared through a temporary table

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def table(self, conn: psycopg.Connection) -> LakeTable:
        """The lake table of the spec's target (close it when done)."""
        raise NotImplementedError

    def catalog_of(self, table: LakeTable) -> str | None:
        """The catalog a plan names the table by (without a password); None: its location
        names it."""
        return None

    def inspect(self, conn: psycopg.Connection, transform: str | None) -> Inspection:
        """The source, then the stage's types as the source or the validated transform gives
        them, and the lake table (:meth:`_inspect_table`)."""
        spec = self.spec
        inspection = inspect_source(conn, spec)
        if not inspection.problems:
            if transform is None and spec.transform_sql is not None:
                transform = validate_transform_text(spec.transform_sql)
            check_transform(conn, spec, inspection, transform)
            self._inspect_table(conn, inspection, transform)
        return inspection

    def _inspect_table(self, conn: psycopg.Connection, inspection: Inspection, transform: str | None) -> None:
        """Fill in the inspection: the stage's column types, the partition kind, and every
        problem with the lake table (a type that cannot round-trip, an existing table whose
        schema or partitioning disagrees). Reads only; a missing table is no problem (apply
        creates it)."""
        spec = self.spec
        input_rel = sqlbuild.input_relation(
            spec.source_ref, [c.name for c in inspection.source_columns], spec.partition_key, spec.input_columns,
            transform, filtered=False, escape_percent=False,
        )
        described = {c.name: c for c in describe_query(conn, sqlbuild.describe_input(input_rel, spec.columns))}
        self.inspect_table(conn, inspection, described)

    def inspect_table(self, conn: psycopg.Connection, inspection: Inspection, described: dict[str, ColumnInfo]) -> None:
        """The stage's columns as the input describes them (``described``: by name, at least
        the spec's columns), the partition kind, and the lake table: its problems and its
        :class:`LakeState`. The DuckDB engine (core.duck) describes its input in DuckDB and
        shares the rest."""
        spec = self.spec
        columns = [described[c] for c in spec.columns]
        inspection.target_columns = columns
        problems = inspection.problems
        inspection.partition_kind = partition_kind_of(described[spec.partition_key], problems)
        check_total(spec, described, problems)
        wanted: list[tuple[str, pa.DataType]] = []
        for c in columns:
            try:
                wanted.append((c.name, lake_type(c)))
            except SpecError as err:
                problems.append(str(err))
        if spec.records_can_move:
            binary = [c.name for c in columns if c.name in spec.business_key and c.base_type == "bytea"]
            if binary:
                problems.append(
                    f"business key column(s) {', '.join(binary)} are bytea: with records_can_move the lake's "
                    "keys are loaded into PostgreSQL as CSV, which cannot carry arbitrary bytes; use a text key"
                )
        if len(wanted) < len(columns):
            return
        table = self.table(conn)
        try:
            with lake_errors(table, "inspecting"):
                shape = table.shape()
            catalog = self.catalog_of(table)
        finally:
            table.close()
        if shape is not None:
            problems.extend(shape_problems(table.name, shape, wanted, spec.partition_key))
        inspection.target_table = LakeState(table.name, shape is not None, [(n, type_text(t)) for n, t in wanted],
                                            [spec.partition_key], catalog)

    def check(self, conn: psycopg.Connection, inspection: Inspection, partitions: list[PartitionValue],
              transform: str | None) -> None:
        self.check_partitions(partitions)  # the transform was checked by inspect

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """Any partition value can be written (a format whose writes cannot says otherwise)."""

    def stage_table(self, ctx: Context, stage: TableRef) -> sql.Composed:
        """No PostgreSQL table to copy the types from: the types the source or transform gives."""
        spec = self.spec
        input_rel = sqlbuild.input_relation(spec.source_ref, ctx.source_column_names, spec.partition_key,
                                            spec.input_columns, ctx.transform, filtered=False, escape_percent=False)
        return sqlbuild.create_stage_from_input(stage, input_rel, spec.columns)

    def with_target_keys(self, conn: psycopg.Connection, ctx: Context) -> Context:
        """The lake table's distinct (partition key, business key) pairs, read at its current
        version, in a temporary table dropped when the caller's transaction (the snapshot's)
        ends: what core.moves reads where a PostgreSQL target is read in place.

        Raises:
            SourceDataError: a business key lies in more than one partition of the lake table
                (a PostgreSQL target rules that out with UNIQUE (business_key)).
        """
        spec = self.spec
        names = [spec.partition_key, *spec.business_key]
        keys = TableRef("pg_temp", f"{spec.name}__target_keys")
        input_rel = sqlbuild.input_relation(spec.source_ref, ctx.source_column_names, spec.partition_key,
                                            spec.input_columns, ctx.transform, filtered=False, escape_percent=False)
        conn.execute(sqlbuild.create_temp_table(keys.name, input_rel, names))
        table = self.table(conn)
        try:
            with lake_errors(table, "reading the keys of"):
                handle = table.open()
                data = None if handle is None else table.read_columns(handle, names)
        finally:
            table.close()
        if data is not None and data.num_rows:
            _copy_csv(conn, keys, data.group_by(names).aggregate([]).select(names))  # distinct pairs
        refuse_keys_in_several_partitions(spec, conn.execute(
            sqlbuild.keys_in_several_partitions(keys, spec.business_key)).fetchall())
        return ctx.with_keys(keys)

    def _state(self, ctx: Context) -> LakeState:
        state = ctx.inspection.target_table
        assert isinstance(state, LakeState)
        return state

    def plan_fields(self, ctx: Context) -> dict[str, Any]:
        """The schema the stage maps to, which an existing table must have; an Iceberg
        table's catalog too, so that a plan made against one catalog is refused against
        another (absent for other tables: their plan ids unchanged)."""
        state = self._state(ctx)
        catalog = {} if state.catalog is None else {"target_catalog": state.catalog}
        return {**catalog, "target_table_columns": [list(c) for c in state.columns]}

    def creates_target(self, ctx: Context) -> bool | None:
        return not self._state(ctx).exists

    def plan_problems(self, conn: psycopg.Connection, ctx: Context) -> list[str]:
        """Stage A's values the lake table could not hold (an infinite or BC date or time stamp,
        a year after 9999, NaN in a numeric(p,s)), one per partition and column: one pass over
        the stage for every such column, before approval."""
        spec = self.spec
        checked = [(c.name, c.base_type) for c in ctx.target_columns if c.base_type in sqlbuild.unholdable_kinds()]
        if not checked:
            return []
        rows = conn.execute(*sqlbuild.unholdable_values(ctx.stage("a"), spec.partition_key, checked, ctx.partitions))
        return [
            f"partition {label}: column {name} has {n} value(s) a {spec.target.format} column cannot hold "
            "(an infinite or BC date or time stamp, a year after 9999, or NaN in a decimal); fix them in the "
            "source or transform, or keep the target in PostgreSQL"
            for label, *counts in rows for (name, _), n in zip(checked, counts) if n
        ]

    def compared(self, conn: psycopg.Connection, ctx: Context, label: str,
                 version: str | None = None) -> tuple[TableRef, bool]:
        """One partition of the lake table (at its current version, or at ``version``) as its
        canonical text forms rendered from Arrow, in a temporary table of text columns dropped
        when the caller's transaction ends, for core.diff to compare key by key in SQL with the
        stage's text forms. The text travels in CSV slices: no Python object per value, and
        nothing is parsed back into a type that could trim, round or refuse it."""
        spec = self.spec
        rows = TableRef("pg_temp", f"{spec.name}__lake_rows")
        conn.execute(sqlbuild.drop_table(rows))
        conn.execute(sqlbuild.create_text_table(rows.name, spec.columns))
        table = self.table(conn)
        values = [ctx.value_of(label)]
        try:
            with lake_errors(table, f"reading partition {label} of"):
                if version is not None:
                    data = table.read_version(version, spec.partition_key, values)
                else:
                    handle = table.open()
                    data = None if handle is None else table.read(handle, spec.partition_key, values)
        finally:
            table.close()
        if data is not None and data.num_rows:
            _copy_csv(conn, rows, canonical_texts(data, ctx.target_columns))
        return rows, True

    def held_elsewhere(self) -> tuple[list[TableRef], list[str]]:
        return [], []  # files: no lock of the data database holds them

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        return LakeTarget(conn, control, ctx, self.table(conn), checkpoint)



class LakeTarget(AdvisoryLocked):
    """A Delta or Iceberg table whose partitions apply replaces (see the module docstring)."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, table: LakeTable,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        self.conn, self.control, self.ctx, self.table, self.checkpoint = conn, control, ctx, table, checkpoint
        self.schema = lake_schema(ctx.target_columns)  # the stage's columns, in the spec's order
        self._committed: dict[str, str | None] = {}

    def readings_of(self, data: pa.Table) -> Readings:
        """The readings of one partition's rows in Arrow (the canonical fingerprint)."""
        spec = self.ctx.spec
        return arrow_readings(data, self.ctx.target_columns, spec.business_key, spec.total).as_dict()

    def _read(self, handle: Any, labels: list[str]) -> dict[str, Readings]:
        """Each partition as the handle's version holds it, read on its own (partition pruning
        reads only its files)."""
        if handle is None:  # no table yet: every partition is empty
            return {label: self.readings_of(self.schema.empty_table()) for label in labels}
        pk = self.ctx.spec.partition_key
        return {label: self.readings_of(self.table.read(handle, pk, [self.ctx.value_of(label)])) for label in labels}

    def readings(self, labels: list[str]) -> dict[str, Readings]:
        with lake_errors(self.table, "reading"):
            return self._read(self.table.open(), labels)

    def stage_rows(self, label: str) -> pa.Table:
        """Stage A's rows of one partition, in the lake schema and business-key order."""
        ctx, spec = self.ctx, self.ctx.spec
        return read_stage_partition(self.conn, ctx.stage("a"), ctx.target_columns, spec.partition_key,
                                    ctx.value_of(label), spec.business_key).cast(self.schema)

    def data_transaction(self) -> contextlib.AbstractContextManager[None]:
        """What the write holds in the stage's database: a READ COMMITTED transaction on apply's
        connection, in which the stage is rechecked and held until the lake commit is done."""
        return read_committed(self.conn)

    @contextlib.contextmanager
    def writing(self, labels: list[str]) -> Iterator[_LakeWrite]:
        spec = self.ctx.spec
        with transient_errors(f"replacing partition(s) {', '.join(labels)} of {spec.target_name}"), \
                lake_errors(self.table, f"replacing partition(s) {', '.join(labels)} of"), self.data_transaction():
            write = _LakeWrite(self, self.table.open())
            yield write
            # Our commit's version; for partitions found already carrying the approved rows
            # (nothing written), the version they were read at.
            version = write.commit(labels) if write.pending is not None else self.table.version(write.handle)
            self._committed.update(dict.fromkeys(labels, version))

    def committed_readings(self, labels: list[str]) -> dict[str, Readings]:
        version, pk = self._committed[labels[0]], self.ctx.spec.partition_key
        with lake_errors(self.table, f"reading back version {version} of"):
            return {label: self.readings_of(self.table.read_version(version, pk, [self.ctx.value_of(label)]))
                    for label in labels}

    def committed_version(self, labels: list[str]) -> str | None:
        """The version our write of ``labels`` committed, or that a skip found them at."""
        return self._committed.get(labels[0])

    def close(self) -> None:
        self.table.close()


class StagedLakeTarget(LakeTarget):
    """A lake target whose approved rows are read from a stage outside PostgreSQL (a DuckDB
    table, Spark's Parquet files) by :meth:`read_stage`.

    The recheck under the partition lock (:meth:`recheck`) reads stage A's rows into Arrow and
    fingerprints them; the replace then writes exactly those rows, and the verification before
    the commit finds their readings already computed: one read and one fingerprint of the stage
    serve both, and what is checked is what is written."""

    def __init__(self, conn: psycopg.Connection, control: psycopg.Connection, ctx: Context, table: LakeTable,
                 checkpoint: Checkpoint = no_checkpoint) -> None:
        super().__init__(conn, control, ctx, table, checkpoint)
        self._rechecked: dict[str, pa.Table] = {}  # label -> stage A's rows read by the recheck
        self._known: dict[int, tuple[pa.Table, Readings]] = {}  # id(rows) -> (rows, their readings)

    def read_stage(self, label: str) -> pa.Table:
        """Stage A's rows of one partition, in the lake schema."""
        raise NotImplementedError

    def recheck(self, labels: list[str]) -> dict[str, Readings]:
        """Stage A's readings of ``labels`` now, from its rows read into Arrow, which the
        replace that follows in this write then writes."""
        out = {}
        for label in labels:
            rows = self._rechecked[label] = self.read_stage(label)
            out[label] = self.readings_of(rows)
        return out

    def stage_rows(self, label: str) -> pa.Table:
        rows = self._rechecked.pop(label, None)
        return self.read_stage(label) if rows is None else rows

    def readings_of(self, data: pa.Table) -> Readings:
        known = self._known.get(id(data))
        if known is not None and known[0] is data:
            return known[1]
        readings = super().readings_of(data if data.num_rows else self.schema.empty_table())
        self._known[id(data)] = (data, readings)
        return readings

    @contextlib.contextmanager
    def writing(self, labels: list[str]) -> Iterator[_LakeWrite]:
        try:
            with super().writing(labels) as write:
                yield write
        finally:
            self._rechecked.clear()
            self._known.clear()

    @contextlib.contextmanager
    def data_transaction(self) -> Iterator[None]:
        yield  # stage A is rechecked outside PostgreSQL under the partition lock; nothing to hold there


class _LakeWrite:
    def __init__(self, target: LakeTarget, handle: Any) -> None:
        self.target, self.handle = target, handle
        self.pending: dict[str, pa.Table] | None = None  # each partition's rows to commit
        self.note: dict[str, str] = {}  # plan_id, approval_id, ... (core.apply)
        self.metadata: dict[str, str] = {}

    def readings(self, labels: list[str]) -> dict[str, Readings]:
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
        handle = self.handle
        if handle is None:
            created = t.table.create(t.schema, t.ctx.spec.partition_key)
            handle = t.table.open()
            # Our commit is based on this handle: it must be the table as created, or the rows
            # of a writer that came in between would be overwritten without a conflict.
            if t.table.version(handle) != created:
                raise TransientDatabaseError(
                    f"another writer wrote to {t.table.name} right after this run created it; nothing "
                    "of ours was committed"
                )
        spec = t.ctx.spec
        data = pa.concat_tables([self.pending[label] for label in labels])
        values = [t.ctx.value_of(label) for label in labels]
        # With records_can_move: the keys written here, in no other partition at the version
        # our commit is based on, and nothing committed between that version and ours.
        guarded = spec.records_can_move and data.num_rows > 0
        keys = data.select(list(spec.business_key))
        base = t.table.version(handle)
        if guarded:
            found = self._keys_elsewhere(handle, values, keys)
            if found is not None:
                raise KeysElsewhereError(
                    int(self.note.get("approval_id", "0")), self.note.get("plan_id", ""), spec.target_name, base,
                    labels, found.partitions, found.count, found.examples,
                )
        version = t.table.overwrite(handle, spec.partition_key, values, data, self.metadata, exclusive=guarded)
        if guarded and not t.table.follows(handle, base, self.metadata):
            # The engine based our commit on a later version than the one checked: check the
            # version we committed (the handle reads it now). Committed already: say so loudly.
            found = self._keys_elsewhere(handle, values, keys)
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

    def _keys_elsewhere(self, handle: Any, values: list[PartitionValue], keys: pa.Table) -> KeysFound | None:
        t = self.target
        spec = t.ctx.spec
        return keys_found(t.table.keys_elsewhere(handle, spec.partition_key, values, keys), spec.partition_key,
                          spec.business_key)
