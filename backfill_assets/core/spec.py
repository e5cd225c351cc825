"""The declared backfill: a YAML spec validated by pydantic.

Nothing here touches a database. Identifiers are checked for shape only (core.vocabulary);
core.pg.catalog checks that they exist. The source and target formats are core.spec_formats',
the other parts core.spec_settings'; what each engine supports, core.supports' (each engine
declares its own, as data, in its folder). Every name is importable from here.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Annotated

import pydantic
import yaml
from pydantic import BaseModel, Field

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec_formats import (
    SOURCE_TAGS,
    STRICT,
    AnySourceSpec,
    DeltaSourceSpec,
    DeltaTargetSpec,
    EnvName,
    IcebergCatalogSpec,
    IcebergSourceSpec,
    IcebergTargetSpec,
    JdbcSourceSpec,
    LakeSourceSpec,
    ParquetSourceSpec,
    ParquetTargetSpec,
    PostgresTargetSpec,
    SourceSpec,
    SparkTableSpec,
    TargetSpec,
)
from backfill_assets.core.spec_inputs import InputSpec, input_problems
from backfill_assets.core.spec_settings import (
    DEFAULT_APPROVAL_EXPIRY,
    DEFAULT_ENGINE_SPEC,
    ENGINE_TAGS,
    MAX_CONCURRENT_BUILDS,
    MAX_PARTITIONS_PER_RUN,
    Duration,
    EngineSpec,
    OrderingColumn,
    ParallelSpec,
    PartitionsSpec,
    PartitionWindowSpec,
    TrustedFunction,
)
from backfill_assets.core.supports import OPTIONS, SUPPORTS, engine_problems, rule_problems
from backfill_assets.core.vocabulary import MAX_SPEC_NAME, Identifier, Limits, TableRef

__all__ = [
    "DEFAULT_APPROVAL_EXPIRY",
    "MAX_CONCURRENT_BUILDS",
    "MAX_PARTITIONS_PER_RUN",
    "AnySourceSpec",
    "DeltaSourceSpec",
    "DeltaTargetSpec",
    "Duration",
    "InputSpec",
    "EngineSpec",
    "IcebergCatalogSpec",
    "IcebergSourceSpec",
    "IcebergTargetSpec",
    "JdbcSourceSpec",
    "LakeSourceSpec",
    "OrderingColumn",
    "ParallelSpec",
    "ParquetSourceSpec",
    "ParquetTargetSpec",
    "PartitionWindowSpec",
    "PartitionsSpec",
    "PostgresTargetSpec",
    "SourceSpec",
    "SparkTableSpec",
    "Spec",
    "TargetSpec",
    "TrustedFunction",
    "load_spec",
    "spec_from_mapping",
]


class Spec(BaseModel):
    """A declared backfill. See docs/spec.md."""

    model_config = STRICT

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=MAX_SPEC_NAME)]
    # The variable holding the URL of the PostgreSQL database the spec reads (engine postgres)
    # and keeps its control store in; optional on an engine whose data is not in PostgreSQL,
    # whose control store is then the embedded server's (core.pg.embedded.spec_url).
    database_url_env: EnvName | None = None
    # The control store (plans, approvals, ledger, the runs' locks) in another PostgreSQL
    # database, named by this variable; without it they live in control_schema of the data's.
    control_database_url_env: EnvName | None = None
    engine: EngineSpec = DEFAULT_ENGINE_SPEC
    source: AnySourceSpec
    target: TargetSpec
    partition_key: Identifier
    # Partitions that are time windows of partition_key, a time stamp or date column (hours,
    # days, weeks, months or years in a zone); without it, each value of the column is one.
    partition_window: PartitionWindowSpec | None = None
    business_key: Annotated[list[Identifier], Field(min_length=1)]
    ordering: Annotated[list[OrderingColumn], Field(min_length=1)]
    columns: Annotated[list[Identifier], Field(min_length=1)]
    total: Identifier | None = None
    records_can_move: bool = False
    transform_version: Annotated[str, Field(min_length=1, max_length=200)]
    transform_sql: str | None = None
    # Other tables transform_sql reads by name beside 'source', each pinned with it (core.spec_inputs).
    inputs: dict[Identifier, InputSpec] = {}
    control_schema: Identifier = "backfill_control"
    partitions: PartitionsSpec | None = None
    parallel: ParallelSpec | None = None
    lock_timeout_ms: Annotated[int, Field(gt=0, le=3_600_000)] = 5_000
    statement_timeout_ms: Annotated[int, Field(gt=0, le=86_400_000)] = 600_000
    # Functions outside pg_catalog that transform_sql may call (core.engines.postgres.guard.transform).
    trusted_functions: list[TrustedFunction] = []
    # An approval not applied within this long is expired: apply refuses it, status and the
    # approval sensor say so.
    approval_expires_after: Duration = DEFAULT_APPROVAL_EXPIRY
    # Apply replaces consecutive partitions together, in one transaction, while they hold at
    # most this many approved rows (0: one partition, or one group of linked partitions, per
    # transaction). Each partition is still verified on its own; a failure rolls back its batch.
    replace_batch_rows: Annotated[int, Field(ge=0, le=100_000_000)] = 0
    # When the Dagster code location audits the target (core.audit): a cron expression, five
    # fields, in UTC; daily at 06:00 unless the spec says otherwise.
    audit_schedule: str = "0 6 * * *"

    @pydantic.model_validator(mode="after")
    def _parts_agree(self) -> Spec:
        problems = [*self._column_problems(), *self._engine_problems(), *self._option_problems(),
                    *input_problems(self.inputs, self.transform_sql,
                                    self.source.display_name if isinstance(self.source, SourceSpec) else None)]
        if self.inputs and isinstance(self.source, SourceSpec) and self.source.snapshot == "immutable":
            problems.append("inputs are pinned in the source's snapshot; `snapshot: immutable` with inputs is not "
                            "built yet: use `snapshot: exported` (the default) or `snapshot: copy`")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _column_problems(self) -> list[str]:
        problems = []
        if len(set(self.columns)) != len(self.columns):
            problems.append("columns lists a column twice")
        if self.partition_key not in self.columns:
            problems.append(f"partition_key {self.partition_key!r} must be one of columns")
        if len(set(self.business_key)) != len(self.business_key):
            problems.append("business_key lists a column twice")
        if self.partition_key in self.business_key:
            problems.append(
                "business_key must not include partition_key: the grain is "
                "(partition_key, business_key)"
            )
        missing = [c for c in self.business_key if c not in self.columns]
        if missing:
            problems.append(f"business_key columns {missing} must be in columns")
        ordering = [o.column for o in self.ordering]
        if len(set(ordering)) != len(ordering):
            problems.append("ordering lists a column twice")
        in_key = [c for c in ordering if c in self.business_key or c == self.partition_key]
        if in_key:
            problems.append(f"ordering columns {in_key} are part of the key and cannot order it")
        if self.total is not None and self.total not in self.columns:
            problems.append(f"total {self.total!r} must be one of columns")
        if self.transform_sql is not None and not self.transform_sql.strip():
            problems.append("transform_sql is empty; remove it or write a SELECT")
        return problems

    def _engine_problems(self) -> list[str]:
        """What the engine's allow-list refuses of the source, the target and the options in use."""
        in_use = [name for name in OPTIONS if getattr(self, name)]
        return engine_problems(SUPPORTS[self.engine.type], self.source.format, self.target.format, in_use, SUPPORTS)

    def _option_problems(self) -> list[str]:
        problems = []
        own = SUPPORTS[self.engine.type].capabilities.get("own_control_store")
        if self.database_url_env is None and not (own is not None and own.can):
            problems.append(
                f"database_url_env is required on engine {self.engine.type}: name the environment variable that "
                "holds the URL of the PostgreSQL database the source is read from"
            )
        if getattr(self.source, "change_column", None) == self.partition_key:
            problems.append(
                "source.change_column must not be the partition_key: it must move on every write "
                "within a partition (an ingest sequence or an updated_at column)"
            )
        if self.records_can_move and isinstance(self.source, SourceSpec) and self.source.snapshot != "copy":
            problems.append(
                "records_can_move needs `snapshot: copy`: the versions of every moved key "
                "are copied so that old and new partitions are rebuilt from one snapshot"
            )
        window_parts = self.partitions is not None and self.partitions.type == "window"
        if self.partition_window is not None and self.partitions is not None and not window_parts:
            problems.append(
                f"partitions.type {self.partitions.type} keys partitions by value, but this spec's partitions are its "
                "partition_window's windows: write `partitions: {type: window, start: <date>}`"
            )
        if window_parts and self.partition_window is None:
            problems.append("partitions.type window needs partition_window (the windows it keys); declare it, or use "
                            "type daily, monthly or static")
        if self.records_can_move and self.transform_sql is not None:
            problems.append(
                "records_can_move cannot be combined with transform_sql yet: a key's versions "
                "are found by the source's own business key columns"
            )
        # The engine's own rules on an option it takes (its supports.toml).
        in_use = {name: getattr(self, name) for name in OPTIONS if getattr(self, name)}
        problems.extend(rule_problems(SUPPORTS[self.engine.type], self.target.format, in_use))
        if self.parallel is not None and self.records_can_move:
            problems.append(
                "parallel cannot be combined with records_can_move: the partitions a moved key "
                "links are built and replaced together, and a multi-run backfill splits the range "
                "into runs without knowing them; remove `parallel` (one run) or records_can_move"
            )
        return problems

    @pydantic.field_validator("audit_schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        fields = value.split()
        if len(fields) != 5 or not all(re.fullmatch(r"[0-9A-Za-z*/,?-]+", f) for f in fields):
            raise ValueError(f"audit_schedule {value!r} is not a cron expression of five fields "
                             "(minute hour day month weekday), for example '0 6 * * *' (daily at 06:00 UTC)")
        return value

    @pydantic.field_validator("approval_expires_after")
    @classmethod
    def _positive_expiry(cls, value: dt.timedelta) -> dt.timedelta:
        if value <= dt.timedelta(0) or value > dt.timedelta(days=3650):
            raise ValueError("approval_expires_after must be between 1 minute and 3650 days (for example 7d or 36h)")
        if value < dt.timedelta(minutes=1):
            raise ValueError("approval_expires_after must be at least 1 minute (for example 7d or 36h)")
        return value

    @property
    def limits(self) -> Limits:
        """The finite waits every connection of this spec carries (vocabulary.Limits)."""
        return Limits(self.lock_timeout_ms, self.statement_timeout_ms)

    @property
    def target_name(self) -> str:
        """The target as plans, ledgers and messages name it (see TargetSpec.display_name)."""
        return self.target.display_name

    @property
    def source_ref(self) -> TableRef:
        """A PostgreSQL source's table (TypeError for a lake source)."""
        if not isinstance(self.source, SourceSpec):
            raise TypeError(f"a {self.source.format} source is not a PostgreSQL table")
        return self.source.ref

    @property
    def source_name(self) -> str:
        """The source as plans and messages name it (``schema.table``, ``delta:<path>``, ...)."""
        return self.source.display_name

    @property
    def target_ref(self) -> TableRef:
        """A PostgreSQL target's table (TypeError for any other format)."""
        if not isinstance(self.target, PostgresTargetSpec):
            raise TypeError(f"a {self.target.format} target is not a PostgreSQL table")
        return self.target.ref

    @property
    def partition_by(self) -> str:
        """What a partition is, as snapshots record it: the partition key's name, or its windows
        (``created_at every hour in America/New_York``), so that a label of one never finds a
        snapshot of the other."""
        window = self.partition_window
        if window is None:
            return self.partition_key
        read_in = f" read in {window.column_time_zone}" if window.column_time_zone else ""
        every = f"every {window.every}" if window.cron is None else f"on cron {' '.join(window.cron.split())}"
        return f"{self.partition_key}{read_in} {every} in {window.time_zone}"

    @property
    def input_columns(self) -> list[str]:
        """Columns the newest-wins step reads: the target columns, then ordering-only ones."""
        extra = [o.column for o in self.ordering if o.column not in self.columns]
        return [*self.columns, *extra]


def _format_validation_error(err: pydantic.ValidationError) -> str:
    # Only the location and the message: pydantic's default text echoes the input value.
    lines = []
    for item in err.errors(include_input=False, include_url=False):
        # A union's tag (source.postgres.snapshot, engine.spark.master) is not a key the user wrote: left out.
        tags = {"source": SOURCE_TAGS, "engine": ENGINE_TAGS}
        parts = [str(p) for n, p in enumerate(item["loc"])
                 if not (n == 1 and p in tags.get(item["loc"][0], ()))]
        loc = ".".join(parts) or "spec"
        msg = item["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def spec_from_mapping(data: object, origin: str = "spec") -> Spec:
    """Validate a parsed spec mapping; raise :class:`SpecError` naming every problem."""
    if not isinstance(data, dict):
        raise SpecError(f"{origin}: the spec must be a YAML mapping of keys to values")
    try:
        return Spec.model_validate(data)
    except pydantic.ValidationError as err:
        raise SpecError(f"{origin} is invalid: {_format_validation_error(err)}") from None


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file.

    Raises:
        SpecError: the file is missing, is not YAML, or does not validate.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist; pass --spec with a YAML spec") from None
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"spec file {path} cannot be read: {err.__class__.__name__}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise SpecError(f"spec file {path} is not valid YAML{where}: {problem}") from None
    return spec_from_mapping(data, origin=f"spec file {path}")
