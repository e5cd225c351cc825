"""``diff`` in DuckDB: one partition of two relations a DuckDB connection can read (the DuckDB
engine's stage tables, a lake partition or the Spark engine's stage files registered as
Arrow), key by key, as the PostgreSQL engine's diff gives it (core.engines.postgres.diff).

Exact on the canonical text the fingerprint hashes (docs/fingerprint.md): ``-0`` against
``0``, NULL against ``''`` or a trailing space differ (core.comparison.compare.partition_diff). Only
the counts and up to ``limit`` example keys come back from DuckDB; the examples' values are
then rendered to PostgreSQL's text forms (core.fingerprint.arrow.canonical_texts), the forms the
PostgreSQL engine shows, so the same difference reads the same on every engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from backfill_assets.core.catalog import ColumnInfo
from backfill_assets.core.comparison import compare
from backfill_assets.core.context import Context
from backfill_assets.core.differences import KINDS, Example, PartitionDiff
from backfill_assets.core.fingerprint import rows
from backfill_assets.core.fingerprint.arrow import canonical_texts
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets.core.vocabulary import PartitionValue


def diff_partition(duck: Any, ctx: Context, left: str, right: str, label: str, limit: int) -> PartitionDiff:
    """Partition ``label`` of ``left`` (stage A, the rows a replacement writes) against
    ``right`` (the target, or stage B), two relations of ``duck`` with the target's columns."""
    spec = ctx.spec
    return diff_relations(duck, left, right, ctx.target_columns, spec.partition_key, spec.business_key,
                          label, ctx.value_of(label), limit)


def diff_relations(duck: Any, left: str, right: str, columns: Sequence[ColumnInfo], partition_key: str,
                   business_key: Sequence[str], label: str, value: PartitionValue, limit: int) -> PartitionDiff:
    """:func:`diff_partition` of the partition ``value`` (``label``) of two relations with ``columns``."""
    fields = [(c.name, rows.kind_of(c)) for c in columns]
    query = compare.partition_diff(left, right, partition_key, business_key, fields, limit)
    found = duck.sql(query, params={"partition": value}).to_arrow_table()
    counts = dict.fromkeys(KINDS, 0)
    kinds, ns = found.column("__kind").to_pylist(), found.column("__n").to_pylist()
    for row, kind, n in zip(found.column("__row").to_pylist(), kinds, ns):
        if row == "count":
            counts[kind] = int(n)
    first = [i for i, row in enumerate(found.column("__row").to_pylist()) if row == "example"]
    if not first:
        return PartitionDiff(label, **counts)
    examples = found.take(first)
    a, b = (_texts(columns, examples.column(side)) for side in ("__a", "__b"))
    names = [c.name for c in columns]
    out = []
    for i, kind in enumerate(examples.column("__kind").to_pylist()):
        left_row, right_row = a[i], b[i]
        present = left_row if left_row is not None else right_row
        differing = (names if kind != "changed"  # a whole row on one side: its values, against nothing
                     else [c for c in names if left_row[c] != right_row[c]])  # type: ignore[index]
        out.append(Example(
            key={k: present[k] for k in business_key}, kind=kind, columns=differing,  # type: ignore[index]
            values={c: [None if left_row is None else left_row[c], None if right_row is None else right_row[c]]
                    for c in differing}))
    return PartitionDiff(label, **counts, examples=out)


def _texts(columns: Sequence[ColumnInfo], side: pa.ChunkedArray) -> list[dict[str, str | None] | None]:
    """Each example's row on one side (a struct, NULL where the side has none) as PostgreSQL's
    text forms of its columns, by name."""
    side = side.combine_chunks()
    present = side.is_valid().to_pylist()
    table = pa.Table.from_arrays(side.flatten(), names=[c.name for c in columns]).cast(lake_schema(columns))
    texts = canonical_texts(table, columns).to_pylist()
    return [row if here else None for row, here in zip(texts, present)]
