"""The spec's other inputs as each snapshot read them (core.spec_inputs): kept beside the
snapshot's record (``snapshots.inputs``), for the source sensor to tell which partitions an
input that moved since feeds.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

_RECORD = sql.SQL("UPDATE {schema}.snapshots SET inputs = %(inputs)s WHERE snapshot_id = %(snapshot_id)s")

# The snapshots that are the newest of some partition of the source and read other inputs:
# each with those partitions, every partition it read, and its inputs' pins.
_NEWEST_WITH_INPUTS = sql.SQL(
    "SELECT n.snapshot_id, array_agg(n.partition ORDER BY n.partition), "
    "(SELECT array_agg(e ->> 'partition') FROM jsonb_array_elements(s.partitions) AS e), s.inputs FROM ("
    "SELECT DISTINCT ON (e ->> 'partition') e ->> 'partition' AS partition, s.snapshot_id "
    "FROM {schema}.snapshots AS s, jsonb_array_elements(s.partitions) AS e "
    "WHERE s.source_table = %(source_table)s AND s.fingerprint_format = %(format)s "
    "ORDER BY e ->> 'partition', coalesce(s.taken_at, s.created_at) DESC) AS n "
    "JOIN {schema}.snapshots AS s ON s.snapshot_id = n.snapshot_id WHERE s.inputs IS NOT NULL "
    "GROUP BY n.snapshot_id, s.partitions, s.inputs ORDER BY n.snapshot_id"
)


def record_inputs(conn: psycopg.Connection, schema: str, snapshot_id: str,
                  inputs: tuple[dict[str, Any], ...] | None) -> None:
    """Keep the inputs' pins (core.store.plan_document.InputPin) beside a recorded snapshot."""
    if inputs is not None:
        conn.execute(_RECORD.format(schema=sql.Identifier(schema)),
                     {"inputs": Jsonb(list(inputs)), "snapshot_id": snapshot_id})


def newest_with_inputs(conn: psycopg.Connection, schema: str, source_table: str, fingerprint_format: int
                       ) -> list[tuple[list[str], list[str], list[dict[str, Any]]]]:
    """(the partitions it is the newest snapshot of, every partition it read, its inputs'
    pins) for each snapshot of the source that read other inputs and is still the newest of a
    partition (a pin is of the rows read for every partition of its snapshot)."""
    rows = conn.execute(_NEWEST_WITH_INPUTS.format(schema=sql.Identifier(schema)),
                        {"source_table": source_table, "format": fingerprint_format}).fetchall()
    return [(list(r[1]), list(r[2]), list(r[3])) for r in rows]


_OF_SNAPSHOT = sql.SQL("SELECT inputs FROM {schema}.snapshots WHERE snapshot_id = %(snapshot_id)s")


def snapshot_inputs(conn: psycopg.Connection, schema: str, snapshot_id: str) -> tuple[dict[str, Any], ...] | None:
    """The inputs' pins a recorded snapshot read (None: it read no other input)."""
    row = conn.execute(_OF_SNAPSHOT.format(schema=sql.Identifier(schema)), {"snapshot_id": snapshot_id}).fetchone()
    return None if row is None or row[0] is None else tuple(row[0])
