"""The snapshot's copies on engine postgres (``snapshot: copy``): a table of the rows a snapshot
read, named by its content (``snap_<digest>``) and sealed (every row written by the one
statement that filled it, its count and columns recorded), so that a copy is reused, built
from and approved only while its seal holds (:func:`copy_problem`). The source's partitions
are copied so (core.engines.postgres.snapshot), and so is each of the spec's other inputs
(:func:`copy_inputs`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
from psycopg import sql

from backfill_assets.core.context import Clock
from backfill_assets.core.engines.postgres.context import PostgresContext
from backfill_assets.core.engines.postgres.inputs import input_pin
from backfill_assets.core.fingerprint.partition import rows_digest
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.pg.catalog import table_columns, table_kind
from backfill_assets.core.progress import Progress, ProgressEvent
from backfill_assets.core.store import control as store
from backfill_assets.core.vocabulary import TableRef, parse_table_name

PENDING_COPY = "snap_new_{}"  # a copy being written, named after its transaction


def name_copy(
    conn: psycopg.Connection, ctx: PostgresContext, pending: TableRef, rows: int, fingerprint: str,
    snapshot_id: str, clock: Clock, progress: Progress,
) -> TableRef:
    """Give the new copy its content's name and seal it, or keep an intact copy of the same
    content made earlier (plans built from it stay valid) and drop the new one."""
    spec = ctx.spec
    relation = TableRef(spec.control_schema, f"snap_{fingerprint[:16]}")
    if copy_intact(conn, ctx, relation, fingerprint):
        conn.execute(sqlbuild.drop_table(pending))
        progress(ProgressEvent("snapshot", f"{snapshot_id}: the copy {relation} is intact; reusing it",
                               status="reused"))
        return relation
    conn.execute(sqlbuild.drop_table(relation))
    conn.execute(sqlbuild.rename_table(pending, relation.name))
    # One statement filled the new table, so every row carries that statement's xmin.
    writer = conn.execute(sqlbuild.copy_writer(relation)).fetchone()
    store.record_copy(
        conn, spec.control_schema, snapshot_table=str(relation), fingerprint=fingerprint,
        writer_xid=writer[0] if writer else None, row_count=rows,
        columns=[[c.name, c.type_name] for c in table_columns(conn, relation)], copied_at=clock(),
    )
    return relation


# A 32-bit transaction id comes round again after 2^32 more; trust a seal for half of that.
SEAL_HORIZON = 2**31


def copy_problem(conn: psycopg.Connection, ctx: PostgresContext, relation: TableRef, fingerprint: str) -> str | None:
    """Why a snapshot copy may no longer hold exactly the rows it was made with, or None.

    Checked by its seal: the same columns, the same row count, and every row still written
    by the one transaction that made the copy (an UPDATE, INSERT or DELETE and INSERT leaves
    another xmin; a DELETE changes the count). One pass over the copy without a sort, instead
    of hashing it again. xmin survives VACUUM FREEZE (the raw id is kept); a seal older than
    2^31 transactions is not trusted, as its id could have been reused."""
    kind = table_kind(conn, relation)
    if kind is None:
        return "is gone"
    if kind != "r":
        return "is no longer a plain table"
    seal = store.copy_seal(conn, ctx.spec.control_schema, str(relation))
    if seal is None or seal["transactions_since"] is None:
        return "has no seal (an earlier version made it)"
    if seal["fingerprint"] != fingerprint:
        return "was made for another snapshot"
    if seal["transactions_since"] >= SEAL_HORIZON:
        return "is too old for its seal to be trusted"
    dropped = conn.execute(*sqlbuild.dropped_columns(relation)).fetchone()
    if [[c.name, c.type_name] for c in table_columns(conn, relation)] != seal["columns"] or (dropped and dropped[0]):
        return "changed its columns since it was taken"
    rows, foreign = conn.execute(*sqlbuild.copy_seal_check(relation, seal["writer_xid"])).fetchone() or (None, None)
    if rows != seal["row_count"] or foreign != 0:
        return "changed since it was taken"
    return None


def copy_intact(conn: psycopg.Connection, ctx: PostgresContext, relation: TableRef, fingerprint: str) -> bool:
    """Whether a snapshot copy's seal holds (see :func:`copy_problem`)."""
    return copy_problem(conn, ctx, relation, fingerprint) is None


_FILL = sql.SQL("INSERT INTO {copy} ({cols}) SELECT {cols} FROM ({rows}) AS i")


def copy_inputs(conn: psycopg.Connection, ctx: PostgresContext, clock: Clock, progress: Progress
                ) -> tuple[PostgresContext, tuple[dict[str, Any], ...] | None]:
    """Copy each of the spec's other inputs (the rows the builds read of it: all of them, or
    those of the partitions) in the snapshot's transaction into a copy of its own, named by its
    content and sealed as the source's copy is. Returns the context reading the copies, and
    the inputs' pins (core.store.plan_document.InputPin), each naming its copy (None: no input)."""
    if not ctx.inputs:
        return ctx, None
    spec = ctx.spec
    txid = conn.execute(sqlbuild.current_txid()).fetchone()
    assert txid is not None
    reads, pins = [], []
    for n, read in enumerate(ctx.inputs):
        pending = TableRef(spec.control_schema, PENDING_COPY.format(f"{txid[0]}_{n}"))
        conn.execute(sqlbuild.create_empty_copy(pending, read.table, list(read.columns), unlogged=True))
        names = sql.SQL(", ").join(sql.Identifier(c) for c in read.columns)
        rows = conn.execute(_FILL.format(copy=sqlbuild.table(pending), cols=names, rows=read.relation(filtered=True)),
                            ctx.bound()).rowcount  # one statement: every row carries its xmin (the seal)
        count, digest = rows_digest(conn, pending, table_columns(conn, pending), sql.SQL("true"), {}, utf8=ctx.utf8)
        relation = name_copy(conn, ctx, pending, rows, digest, f"input {read.name}", clock, progress)
        pins.append(input_pin(spec, read, count, digest, copied_to=str(relation)))
        reads.append(sqlbuild.InputRead(read.name, relation, read.columns))
    progress(ProgressEvent("snapshot", f"copied {len(pins)} other input(s)", status="copied"))
    return dataclasses.replace(ctx, inputs=tuple(reads)), tuple(pins)


def input_copy_problems(conn: psycopg.Connection, ctx: PostgresContext, pins: Any) -> list[str]:
    """Why each input copy of a snapshot (its pins, core.store.inputs) may no longer hold the
    rows it was made with (:func:`copy_problem`), naming the copy."""
    found = []
    for pin in pins or ():
        copy = pin.get("copied_to")
        if copy is not None:
            problem = copy_problem(conn, ctx, parse_table_name(copy), pin["content_hash"])
            if problem is not None:
                found.append(f"the copy {copy} of input {pin['name']} {problem}")
    return found


def input_copies(conn: psycopg.Connection, pins: Any) -> tuple[sqlbuild.InputRead, ...]:
    """How the builds read each input of a copied snapshot (its pins): its copy, whole."""
    return tuple(sqlbuild.InputRead(pin["name"], parse_table_name(pin["copied_to"]),
                                    tuple(c.name for c in table_columns(conn, parse_table_name(pin["copied_to"]))))
                 for pin in pins or () if pin.get("copied_to") is not None)
