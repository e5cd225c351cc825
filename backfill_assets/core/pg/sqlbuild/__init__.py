"""SQL builders: pure functions returning ``(Composed, params)``.

Identifiers are always ``sql.Identifier`` (two parts for tables), values always bound
parameters. Templates are module-level literals. No statement selects ``*``.

The builders live in rooms by what the statement is for: ``parts`` (what every statement is
built from), ``readings`` (partition readings and the format-3 digest), ``builds`` (the input
relation and the stage builds), ``partitioning`` (which partition a row is in: a value or a
time window), ``checks`` (input checks before a build), ``copies``
(snapshot and stage tables and their seals), ``moves`` (records that can move), ``lake`` (a
stage partition read for a lake table), ``replace`` (locks and the insert into the target) and
``profiling`` (what ``profile`` measures). This package re-exports every public name so that
there is one namespace for every statement builder: callers write ``sqlbuild.<name>`` and need
not know which room a builder is in.
"""

from __future__ import annotations

from backfill_assets.core.pg.sqlbuild.builds import (
    SOURCE_CTE,
    InputRead,
    build_stage,
    build_stage_batch,
    create_stage_from_input,
    delete_partition,
    delete_partitions,
    describe_input,
    input_relation,
)
from backfill_assets.core.pg.sqlbuild.checks import (
    any_tied_group,
    input_report,
    ordering_null_counts,
    ordering_ties,
    rows_outside_partitions,
)
from backfill_assets.core.pg.sqlbuild.copies import (
    add_unique_constraint,
    batch_seal_check,
    copy_partitions,
    copy_seal_check,
    copy_writer,
    create_empty_copy,
    create_index,
    current_txid,
    drop_table,
    dropped_columns,
    partition_seal_check,
    rename_table,
    sealable,
)
from backfill_assets.core.pg.sqlbuild.diff import (
    create_text_table,
    first_keys,
    partition_diff,
    partitions_diff_counts,
    prefer_parallel,
)
from backfill_assets.core.pg.sqlbuild.lake import copy_partition_csv, read_settings, unholdable_kinds, unholdable_values
from backfill_assets.core.pg.sqlbuild.moves import (
    copy_keys_in,
    copy_scope,
    create_temp_table,
    key_homes,
    keys_in_several_partitions,
    outside_scope,
    scope_keys,
)
from backfill_assets.core.pg.sqlbuild.partitioning import PartitionBy, ValuesBy, WidenedBy, WindowsBy, as_by
from backfill_assets.core.pg.sqlbuild.parts import GROUP_SIZE_COLUMN, RANK_COLUMN, OrderKey, Query, table
from backfill_assets.core.pg.sqlbuild.profiling import (
    column_profile,
    column_range,
    distinct_partitions,
    key_evidence,
    key_splits,
)
from backfill_assets.core.pg.sqlbuild.readings import (
    digest,
    duplicate_keys,
    in_partition,
    in_partitions,
    partition_counts,
    partition_readings,
    row_text,
    rows_in,
    written_readings,
)
from backfill_assets.core.pg.sqlbuild.replace import (
    LOCKABLE_KINDS,
    advisory_lock,
    advisory_unlock,
    advisory_xact_lock,
    has_unique_index,
    insert_from_stage,
    lock_against_writers,
    lock_for_replace,
    lock_for_snapshot,
)
from backfill_assets.core.pg.sqlbuild.watch import partition_signals, statistics_state, table_counters, window_signals

__all__ = [
    "GROUP_SIZE_COLUMN", "LOCKABLE_KINDS", "PartitionBy", "ValuesBy", "WindowsBy", "as_by", "RANK_COLUMN", "SOURCE_CTE", "InputRead", "WidenedBy", "OrderKey", "Query",
    "add_unique_constraint", "advisory_lock", "advisory_xact_lock", "any_tied_group", "advisory_unlock", "batch_seal_check", "sealable", "build_stage", "build_stage_batch", "delete_partitions",
    "column_profile", "column_range", "copy_partition_csv", "copy_partitions", "digest", "duplicate_keys", "in_partitions", "row_text", "written_readings", "copy_scope",
    "copy_seal_check", "copy_writer", "current_txid", "create_empty_copy", "create_index",
    "create_stage_from_input", "describe_input", "copy_keys_in", "create_temp_table", "keys_in_several_partitions",
    "unholdable_kinds", "unholdable_values", "partition_diff", "partitions_diff_counts", "first_keys", "prefer_parallel", "create_text_table",
    "delete_partition", "distinct_partitions", "drop_table", "dropped_columns",
    "has_unique_index", "in_partition", "input_relation", "input_report", "insert_from_stage",
    "key_evidence", "key_homes", "key_splits", "lock_against_writers", "lock_for_replace", "lock_for_snapshot",
    "ordering_null_counts", "ordering_ties", "outside_scope", "partition_counts",
    "partition_readings", "partition_seal_check", "rows_in", "read_settings", "rename_table", "rows_outside_partitions",
    "scope_keys", "table",
    "partition_signals", "statistics_state", "table_counters", "window_signals",
]
