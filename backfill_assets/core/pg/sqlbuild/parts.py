"""What every statement is built from: qualified identifiers, column lists,
ORDER BY items and key NULL tests, and the working column names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from psycopg import sql

from backfill_assets.core.vocabulary import TableRef

Query = tuple[sql.Composed, dict[str, Any]]

# Working columns (build B's rank, the tie check's group size); spec columns starting with
# "__backfill" are refused, so they cannot collide.
RANK_COLUMN = "__backfill_rank"
GROUP_SIZE_COLUMN = "__backfill_group_size"
PARTITION_COLUMN = "__backfill_partition"  # a row's partition carried through a subquery


def table(ref: TableRef) -> sql.Identifier:
    """A schema-qualified table as a two-part identifier."""
    return sql.Identifier(ref.schema, ref.name)


@dataclass(frozen=True)
class OrderKey:
    """One ORDER BY item over a column of the relation aliased ``alias``.

    ``collate_c`` sorts a collatable column by bytes, so the order does not depend on the
    server's locale; ``as_text`` sorts the column's text form instead of its typed value.
    """

    column: str
    direction: Literal["asc", "desc"] = "asc"
    nulls: Literal["first", "last"] | None = None
    collate_c: bool = False
    as_text: bool = False


def col(alias: str, column: str) -> sql.Identifier:
    return sql.Identifier(alias, column)


def cols(alias: str, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(col(alias, c) for c in columns)


def order_by(alias: str, keys: Sequence[OrderKey]) -> sql.Composed:
    items = []
    for key in keys:
        parts: list[sql.Composable] = [col(alias, key.column)]
        if key.as_text:
            parts = [sql.SQL("{}::text").format(col(alias, key.column))]
        if key.collate_c or key.as_text:
            parts.append(sql.SQL('COLLATE "C"'))
        parts.append(sql.SQL("DESC") if key.direction == "desc" else sql.SQL("ASC"))
        if key.nulls == "first":
            parts.append(sql.SQL("NULLS FIRST"))
        elif key.nulls == "last":
            parts.append(sql.SQL("NULLS LAST"))
        items.append(sql.SQL(" ").join(parts))
    return sql.SQL(", ").join(items)


def key_not_null(alias: str, key: Sequence[str]) -> sql.Composed:
    return sql.SQL(" AND ").join(
        sql.SQL("{} IS NOT NULL").format(col(alias, c)) for c in key
    )


def key_is_null(alias: str, key: Sequence[str]) -> sql.Composed:
    return sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(col(alias, c)) for c in key)
