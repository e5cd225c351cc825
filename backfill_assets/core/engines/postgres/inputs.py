"""The spec's other inputs (core.spec_inputs) on engine postgres: tables of the spec's
database, read in the source's exported snapshot (one snapshot of the whole database pins
every input with the source), each as a CTE of its name beside ``source``
(core.pg.sqlbuild.InputRead). An input with a partition column of its own is read for the
same partitions as the source, through that column: its values, or the same time windows,
widened by ``before`` and ``after``; an input without one is read whole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

import pglast
import psycopg
from pglast import ast
from pglast.visitors import Visitor
from psycopg import sql

from backfill_assets.core.catalog import ColumnInfo, Inspection, windowing_of
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.errors import SpecError
from backfill_assets.core.fingerprint.partition import rows_digest
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.spec import Spec
from backfill_assets.core.windows import Windowing

_ZERO = dt.timedelta(0)  # no widening


def input_reads(conn: psycopg.Connection, spec: Spec, key: ColumnInfo | None,
                windowing: Windowing | None) -> tuple[sqlbuild.InputRead, ...]:
    """How the builds read each input (read-only: the catalog only). ``key``: the partition
    key's column, whose type an input's partition column must have; ``windowing``: the
    spec's windows over it (None: not known yet; the reads are then only read whole, as the
    guard's view of the transform reads them).

    Raises:
        SpecError: naming every input that does not exist, and every partition column that
            is missing or of another type.
    """
    reads, problems = read_inputs(conn, spec, key, windowing)
    if problems:
        raise SpecError("; ".join(problems))
    return reads


def read_inputs(conn: psycopg.Connection, spec: Spec, key: ColumnInfo | None,
                windowing: Windowing | None) -> tuple[tuple[sqlbuild.InputRead, ...], list[str]]:
    """:func:`input_reads` and the problems found, without raising (what ``inspect`` lists)."""
    reads, problems = [], []
    for name, given in spec.inputs.items():
        columns = table_columns(conn, given.ref)
        if not columns:
            problems.append(f"input {name}: table {given.display_name} does not exist (or this role cannot see it)")
            continue
        by: sqlbuild.PartitionBy | sqlbuild.WidenedBy | None = None
        column = next((c for c in columns if c.name == given.partition_key), None)
        if given.partition_key is not None and column is None:
            problems.append(f"input {name}: {given.display_name} has no column {given.partition_key} "
                            "(its partition_key)")
        elif column is not None and key is not None and column.type_name != key.type_name:
            problems.append(f"input {name}: its partition_key {column.name} is {column.type_name}, the source's "
                            f"{key.name} is {key.type_name}; an input is read for the same partitions through a column "
                            "of the same type (cast it in a view)")
        elif column is not None and spec.partition_window is None and (given.before or given.after):
            problems.append(f"input {name}: before and after widen time windows; this spec's partitions are values "
                            "of a column (declare partition_window, or remove them)")
        elif column is not None and windowing is not None:
            windows = sqlbuild.WindowsBy(column.name, windowing)
            widened = given.before is not None or given.after is not None
            by = sqlbuild.WidenedBy(windows, given.before or _ZERO, given.after or _ZERO) if widened else windows
        elif column is not None and spec.partition_window is None:
            by = sqlbuild.ValuesBy(column.name)
        reads.append(sqlbuild.InputRead(name, given.ref, tuple(c.name for c in columns), by))
    return tuple(reads), problems



def input_pins(conn: psycopg.Connection, ctx: PostgresContext,
               whole: dict[str, tuple[int, str]] | None = None) -> tuple[dict[str, Any], ...] | None:
    """Each input's rows as the builds read them, fingerprinted in ``conn``'s transaction (one
    that imported the source's snapshot): the pins of core.store.plan_document.InputPin, in
    the spec's order (None: the spec has no other input). ``whole``: the digests of inputs read
    whole already taken in this transaction, by name (the same for any partitions), kept there
    for the next call."""
    if not ctx.inputs:
        return None
    spec, pins, whole = ctx.spec, [], {} if whole is None else whole
    for read in ctx.inputs:
        if read.by is None and read.name in whole:
            rows, digest = whole[read.name]
        else:
            where = sql.SQL("true") if read.by is None else read.by.among("t")
            rows, digest = rows_digest(conn, read.table, table_columns(conn, read.table), where, ctx.bound(),
                                       utf8=ctx.utf8)
            if read.by is None:
                whole[read.name] = rows, digest
        pins.append(input_pin(spec, read, rows, digest))
    return tuple(pins)


def input_pin(spec: Spec, read: sqlbuild.InputRead, rows: int, digest: str, **more: str) -> dict[str, Any]:
    """An input's pin (core.store.plan_document.InputPin): what was read of it, and the digest."""
    given = spec.inputs[read.name]
    return {"name": read.name, "table": str(read.table), "partition_key": given.partition_key,
            "before": None if given.before is None else str(given.before),
            "after": None if given.after is None else str(given.after),
            "row_count": rows, "content_hash": digest, **more}


def join_keys(transform: str, inputs: Collection[str]) -> dict[str, list[str]]:
    """Per input the transform reads directly (``FROM customers AS c``), the columns of it
    that an equality with another relation's column joins on (``c.customer_id =
    s.customer_id``), in a JOIN's ON or in a WHERE: what makes the join repeat a row when the
    input holds a value of them twice."""
    stmt = pglast.parse_sql(transform)[0].stmt
    aliases: dict[str, str] = {}  # alias (or bare name) -> the input it reads
    pairs: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    class _Joins(Visitor):  # type: ignore[misc]
        def visit_RangeVar(self, ancestors: Any, node: Any) -> None:  # noqa: N802 - pglast's protocol
            if node.schemaname is None and node.relname in inputs:
                aliases[node.alias.aliasname if node.alias is not None else node.relname] = node.relname

        def visit_A_Expr(self, ancestors: Any, node: Any) -> None:  # noqa: N802
            names = [getattr(n, "sval", None) for n in node.name or ()]
            if names == ["="] and all(isinstance(e, ast.ColumnRef) for e in (node.lexpr, node.rexpr)):
                pairs.append((tuple(getattr(f, "sval", "") for f in node.lexpr.fields),
                              tuple(getattr(f, "sval", "") for f in node.rexpr.fields)))

    _Joins()(stmt)
    found: dict[str, list[str]] = {}
    for left, right in pairs:
        for mine, other in ((left, right), (right, left)):
            if len(mine) == 2 and mine[0] in aliases and (len(other) != 2 or other[0] != mine[0]):
                columns = found.setdefault(aliases[mine[0]], [])
                if mine[1] not in columns:
                    columns.append(mine[1])
    return found


_REPEATED = sql.SQL("SELECT {shown}, count(*) FROM ({rel}) AS i GROUP BY {cols} HAVING count(*) > 1 "
                    "ORDER BY count(*) DESC, {cols} LIMIT 3")


def repeated_join_keys(conn: psycopg.Connection, ctx: PostgresContext) -> list[str]:
    """Each input that holds a value of its join columns (:func:`join_keys`) in more than one
    of the rows the builds read, with up to three such values: why a join repeats the
    source's rows (read in ``conn``'s transaction, the source's snapshot)."""
    if ctx.transform is None or not ctx.inputs:
        return []
    keys = join_keys(ctx.transform, [i.name for i in ctx.inputs])
    found = []
    for read in ctx.inputs:
        columns = [c for c in keys.get(read.name, []) if c in read.columns]
        if not columns:
            continue
        query = _REPEATED.format(
            shown=sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier("i", c)) for c in columns),
            rel=read.relation(filtered=True), cols=sql.SQL(", ").join(sql.Identifier("i", c) for c in columns))
        for *values, n in conn.execute(query, ctx.bound()).fetchall():
            shown = ", ".join(f"{c}={'NULL' if v is None else v}" for c, v in zip(columns, values))
            found.append(f"input {read.name} holds {shown} in {n} rows")
    return found


def input_problems(conn: psycopg.Connection, spec: Spec, inspection: Inspection) -> list[str]:
    """What ``inspect`` finds wrong with the spec's inputs: a table that does not exist, a
    partition column missing or of another type than the source's partition key."""
    if not spec.inputs:
        return []
    key = next((c for c in inspection.source_columns if c.name == spec.partition_key), None)
    windowing = None
    if spec.partition_window is not None and key is not None:
        try:
            windowing = windowing_of(spec, key)
        except SpecError:
            pass  # the source's own problem, which inspection names
    return read_inputs(conn, spec, key, windowing)[1]

