"""A lake table as the target, as the steps ask of it (core.context.TargetEngine): the stage
lives in PostgreSQL or in the build engine, the target is a Delta or Iceberg table
(core.lake.tables; each format's engine in its own module), and one fingerprint
(core.fingerprint.arrow) says whether they hold the same rows.

:class:`LakeEngine`: the lake table's side of inspection (every build engine describes its
input, then shares it), the partitions it can be written with, what the plan records (the
schema the stage maps to, whether apply creates the table) and the values a lake column
cannot hold. What a build engine asks beyond this is its own: the PostgreSQL engine's half of
a lake target is core.engines.postgres.lake; the DuckDB and Spark engines reach this class
through :func:`lake_engine_for`. What apply reads through here (a read-only target) is a
:class:`~backfill_assets.core.lake.target.LakeTarget`; each build engine writes through its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pyarrow as pa

from backfill_assets.core.catalog import ColumnInfo, Inspection, check_total, partition_kind_of, windowing_of
from backfill_assets.core.context import Checkpoint, Context, Target, no_checkpoint
from backfill_assets.core.errors import SourceDataError, SpecError
from backfill_assets.core.fingerprint.kinds import lake_type
from backfill_assets.core.lake.tables import LakeTable, TableShape, lake_errors, shape_problems, type_text
from backfill_assets.core.lake.target import LakeTarget
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.targets import ENGINES
from backfill_assets.core.vocabulary import PartitionValue, TableRef
from backfill_assets.core.windows import Windowing


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

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def table(self, conn: psycopg.Connection) -> LakeTable:
        """The lake table of the spec's target (close it when done)."""
        raise NotImplementedError

    def catalog_of(self, table: LakeTable) -> str | None:
        """The catalog a plan names the table by (without a password); None: its location
        names it."""
        return None

    def inspect_table(self, conn: psycopg.Connection, inspection: Inspection, described: dict[str, ColumnInfo]) -> None:
        """The stage's columns as the input describes them (``described``: by name, at least
        the spec's columns), the partition kind, and the lake table: its problems and its
        :class:`LakeState`. The DuckDB engine (core.engines.duckdb) describes its input in DuckDB and
        shares the rest."""
        spec = self.spec
        columns = [described[c] for c in spec.columns]
        inspection.target_columns = columns
        problems = inspection.problems
        inspection.partition_kind = partition_kind_of(described[spec.partition_key], problems, spec)
        windowing = windowing_of(spec, described[spec.partition_key]) if inspection.partition_kind == "window" else None
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
        if windowing is None:
            partitioned_by = [spec.partition_key]
        else:
            try:
                partitioned_by = self.window_partitioning(windowing, shape)
            except SpecError as err:
                problems.append(str(err))
                partitioned_by = [] if shape is None else shape.partitioned_by
        if shape is not None:
            problems.extend(shape_problems(table.name, shape, wanted, partitioned_by))
        inspection.target_table = LakeState(table.name, shape is not None, [(n, type_text(t)) for n, t in wanted],
                                            partitioned_by, catalog)

    def window_partitioning(self, windowing: Windowing, shape: TableShape | None) -> list[str]:
        """How a table written by the spec's time windows is partitioned: an existing table's
        own partitioning where it can hold them, else what apply creates.

        Raises:
            SpecError: the existing table's partitioning cannot hold the windows (naming what
                to declare instead).
        """
        raise SpecError(f"partition_window is not built for a {self.spec.target.format} target; "
                        "write a PostgreSQL target, or partition by a date column")

    def check_partitions(self, partitions: list[PartitionValue]) -> None:
        """Any partition value can be written (a format whose writes cannot says otherwise)."""

    def _state(self, ctx: Context) -> LakeState:
        state = ctx.inspection.target_table
        assert isinstance(state, LakeState)
        return state

    def plan_fields(self, ctx: Context) -> dict[str, Any]:
        """The schema the stage maps to, which an existing table must have; an Iceberg
        table's catalog too, so that a plan made against one catalog is refused against
        another (absent for other tables: their plan ids unchanged); for time windows, how the
        table is partitioned (not by the key's values: nothing for Delta, a transform of the
        column for Iceberg), which an existing table must keep."""
        state = self._state(ctx)
        catalog = {} if state.catalog is None else {"target_catalog": state.catalog}
        windows = {} if ctx.windowing is None else {"target_partitioned_by": list(state.partitioned_by)}
        return {**catalog, **windows, "target_table_columns": [list(c) for c in state.columns]}

    def creates_target(self, ctx: Context) -> bool | None:
        return not self._state(ctx).exists

    def held_elsewhere(self) -> tuple[list[TableRef], list[str]]:
        return [], []  # files: no lock of the data database holds them

    def open(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
             ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        """The table's readings (core.planning.target_readings); apply writes through the target
        its build engine opens (core.build.BuildEngine.open_target), which reads its stage."""
        return LakeTarget(conn, control, ctx, self.table(conn), checkpoint)


def lake_engine_for(spec: Spec) -> LakeEngine:
    """The target engine of a spec whose build engine writes lake tables only (the DuckDB and
    Spark engines: their allow-lists name no other target), as the lake engine it is: what
    they ask of it (its table, the target's side of inspection) only a lake table answers.

    Raises:
        SpecError: the spec's target is not a lake table (the spec's allow-list refuses that first).
    """
    module, name = ENGINES[spec.target.format].split(":")
    engine = getattr(importlib.import_module(module), name)
    if not issubclass(engine, LakeEngine):
        raise SpecError(f"engine {spec.engine.type} writes lake tables; a {spec.target.format} target is not one")
    return engine(spec)


def inspect_input(conn: psycopg.Connection | None, spec: Spec, inspection: Inspection,
                  found: Sequence[tuple[str, str]], info_of: Callable[[str, str], ColumnInfo | None],
                  unsupported: Callable[[str, str], str]) -> None:
    """The input's columns as the DuckDB or Spark engine describes them (``found``: name and
    the engine's type), as the PostgreSQL types that hold the same values (``info_of``), then
    the lake target's side of the inspection. A column without a counterpart is a problem of
    the inspection (``unsupported`` names the cast that gives it one), and the target is not
    read then."""
    by_name: dict[str, ColumnInfo] = {}
    for name, kind in found:
        info = info_of(name, kind)
        if info is None:
            inspection.problems.append(unsupported(name, kind))
        else:
            by_name[name] = info
    if not inspection.problems:
        lake_engine_for(spec).inspect_table(conn, inspection, by_name)  # type: ignore[arg-type]
