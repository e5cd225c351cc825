"""The PostgreSQL build engine's half of a lake target (core.lake): what it asks of a Delta or
Iceberg table beyond what every step asks (core.engines.postgres.staged.StagedTarget). Its
stage lives in PostgreSQL, so the stage's types come from the source or transform, the table's
keys and a partition of it are loaded into temporary tables for the SQL that reads them, and
apply reads the approved rows from the stage (:class:`PostgresLakeTarget`).
"""

from __future__ import annotations

import contextlib
import io

import psycopg
import pyarrow as pa
import pyarrow.csv as pcsv
from psycopg import sql

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Target, TransformGuard, no_checkpoint
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.inputs import input_problems, input_reads
from backfill_assets.core.fingerprint.arrow import canonical_texts
from backfill_assets.core.fingerprint.stage_arrow import read_stage_partition
from backfill_assets.core.lake.engine import LakeEngine, refuse_keys_in_several_partitions
from backfill_assets.core.lake.tables import lake_errors
from backfill_assets.core.lake.target import LakeTarget, part_of
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import describe_query, inspect_source
from backfill_assets.core.pg.db import ConnectionFactory, read_committed
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


class StagedLake:
    """A lake table's target engine (core.lake.engine.LakeEngine) as the PostgreSQL build
    engine asks it (core.engines.postgres.staged.StagedTarget)."""

    relation: TableRef | None = None  # not a table of the data database
    compares_read_only = False  # a partition is compared through a temporary table

    def __init__(self, engine: LakeEngine) -> None:
        self.engine, self.spec = engine, engine.spec

    def inspect(self, conn: psycopg.Connection, transform: str | None, guard: TransformGuard) -> Inspection:
        """The source, then the stage's types as the source or the validated transform gives
        them, and the lake table (:meth:`_inspect_table`)."""
        spec = self.spec
        inspection = inspect_source(conn, spec)
        inspection.problems.extend(input_problems(conn, spec, inspection))
        if not inspection.problems:
            if transform is None and spec.transform_sql is not None:
                transform = guard.parsed(spec.transform_sql, spec.inputs)
            guard.check(conn, spec, inspection, transform)
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
            transform, filtered=False, escape_percent=False, inputs=input_reads(conn, spec, None, None),
        )
        described = {c.name: c for c in describe_query(conn, sqlbuild.describe_input(input_rel, spec.columns))}
        self.engine.inspect_table(conn, inspection, described)

    def check(self, conn: psycopg.Connection, inspection: Inspection, partitions: list[PartitionValue],
              transform: str | None, guard: TransformGuard) -> None:
        self.engine.check_partitions(partitions)  # the transform was checked by inspect

    def stage_table(self, ctx: PostgresContext, stage: TableRef) -> sql.Composed:
        """No PostgreSQL table to copy the types from: the types the source or transform gives."""
        spec = self.spec
        input_rel = sqlbuild.input_relation(spec.source_ref, ctx.source_column_names, spec.partition_key,
                                            spec.input_columns, ctx.transform, filtered=False, escape_percent=False,
                                            inputs=ctx.inputs)
        return sqlbuild.create_stage_from_input(stage, input_rel, spec.columns)

    def with_target_keys(self, conn: psycopg.Connection, ctx: PostgresContext) -> PostgresContext:
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
                                            spec.input_columns, ctx.transform, filtered=False, escape_percent=False,
                                            inputs=ctx.inputs)
        conn.execute(sqlbuild.create_temp_table(keys.name, input_rel, names))
        table = self.engine.table(conn)
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

    def compared(self, conn: psycopg.Connection, ctx: PostgresContext, label: str,
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
        table = self.engine.table(conn)
        values = [part_of(ctx, label)]
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

    def plan_problems(self, conn: psycopg.Connection, ctx: PostgresContext) -> list[str]:
        """Stage A's values the lake table could not hold (an infinite or BC date or time stamp,
        a year after 9999, NaN in a numeric(p,s)), one per partition and column: one pass over
        the stage for every such column, before approval."""
        spec = self.spec
        checked = [(c.name, c.base_type) for c in ctx.target_columns if c.base_type in sqlbuild.unholdable_kinds()]
        if not checked:
            return []
        rows = conn.execute(*sqlbuild.unholdable_values(ctx.stage("a"), ctx.by, checked, ctx.partitions))
        return [
            f"partition {label}: column {name} has {n} value(s) a {spec.target.format} column cannot hold "
            "(an infinite or BC date or time stamp, a year after 9999, or NaN in a decimal); fix them in the "
            "source or transform, or keep the target in PostgreSQL"
            for label, *counts in rows for (name, _), n in zip(checked, counts) if n
        ]

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: PostgresContext, checkpoint: Checkpoint = no_checkpoint) -> Target:
        return PostgresLakeTarget(conn, control, ctx, self.engine.table(conn), checkpoint)


class PostgresLakeTarget(LakeTarget):
    """A lake target whose approved rows are stage A's in PostgreSQL (core.lake.target's
    protocol): the stage is rechecked in a READ COMMITTED transaction on apply's connection and
    held there until the lake commit is done."""

    def read_stage(self, label: str) -> pa.Table:
        """Stage A's rows of one partition, in the lake schema and business-key order."""
        ctx, spec = self.ctx, self.ctx.spec
        return read_stage_partition(self.conn, ctx.stage("a"), ctx.target_columns, ctx.by,
                                    ctx.value_of(label), spec.business_key).cast(self.schema)

    def data_transaction(self) -> contextlib.AbstractContextManager[None]:
        """What the write holds in the stage's database: a READ COMMITTED transaction on apply's
        connection, in which the stage is rechecked and held until the lake commit is done."""
        return read_committed(self.conn)
