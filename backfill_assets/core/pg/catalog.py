"""Read-only inspection of the source and target: engine, columns, types, grain constraint.

Every identifier in the spec is checked against the catalog here, before any SQL that
uses it exists.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql

from backfill_assets.core.catalog import (
    PARTITION_KINDS,
    ColumnInfo,
    Inspection,
    ServerInfo,
    check_total,
    partition_kind_of,
)
from backfill_assets.core.pg import sqlbuild
from backfill_assets.core.spec import Spec
from backfill_assets.core.vocabulary import PartitionKind, TableRef

MIN_SERVER_VERSION = 120000

_SERVER = sql.SQL(
    "SELECT current_setting('server_version'), current_setting('server_version_num')::int, "
    "current_setting('server_encoding')"
)

_COLUMNS = sql.SQL(
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), t.typcategory, "
    "coalesce(nullif(t.typcollation, 0), nullif(b.typcollation, 0)) IS NOT NULL, b.typname, "
    "c.relkind "
    "FROM pg_catalog.pg_class AS c "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "JOIN pg_catalog.pg_attribute AS a ON a.attrelid = c.oid "
    "JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid "
    "JOIN pg_catalog.pg_type AS b ON b.oid = coalesce(nullif(t.typbasetype, 0), t.oid) "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND a.attnum > 0 "
    "AND NOT a.attisdropped ORDER BY a.attnum"
)

_TABLE_EXISTS = sql.SQL(
    "SELECT c.relkind FROM pg_catalog.pg_class AS c "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s"
)

# Each valid, plain btree index of a table: its key columns with their collation and options.
_INDEX_KEYS = sql.SQL(
    "SELECT array_agg(a.attname ORDER BY k.ord), array_agg(coalesce(co.collname, '') ORDER BY k.ord), "
    "array_agg(k.opt ORDER BY k.ord) "
    "FROM pg_catalog.pg_index AS i "
    "JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid "
    "JOIN pg_catalog.pg_am AS am ON am.oid = ic.relam "
    "CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[], i.indoption::int2[]) "
    "WITH ORDINALITY AS k(attnum, coll, opt, ord) "
    "LEFT JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    "LEFT JOIN pg_catalog.pg_collation AS co ON co.oid = k.coll "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND am.amname = 'btree' "
    "AND i.indisvalid AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts "
    "GROUP BY i.indexrelid"
)

_TABLE_KINDS = {"r": "table", "p": "partitioned table"}
_READABLE_KINDS = {"r", "p", "v", "m", "f"}


def server_info(conn: psycopg.Connection) -> ServerInfo:
    """Engine, version and encoding of the server."""
    row = conn.execute(_SERVER).fetchone()
    assert row is not None
    return ServerInfo("PostgreSQL", row[0], int(row[1]), row[2])


def table_kind(conn: psycopg.Connection, ref: TableRef) -> str | None:
    """pg_class.relkind of a table, or None when it does not exist."""
    row = conn.execute(_TABLE_EXISTS, {"schema": ref.schema, "name": ref.name}).fetchone()
    return None if row is None else row[0]


def table_columns(conn: psycopg.Connection, ref: TableRef) -> list[ColumnInfo]:
    """The live columns of a table, in attribute order (empty when it does not exist)."""
    rows = conn.execute(_COLUMNS, {"schema": ref.schema, "name": ref.name}).fetchall()
    return [ColumnInfo(r[0], r[1], r[2], bool(r[3]), r[4]) for r in rows]


def has_ordered_index(
    conn: psycopg.Connection, ref: TableRef, equal: str, keys: Sequence[tuple[str, bool]]
) -> bool:
    """Whether a btree index of ``ref`` starts with ``equal`` then ``keys`` (column, sorted by
    bytes?), ascending with NULLs last, so that ``WHERE equal = v ORDER BY keys`` can read
    it without a sort."""
    wanted = [(name, "C" if collate_c else "") for name, collate_c in keys]
    for names, collations, options in conn.execute(_INDEX_KEYS, {"schema": ref.schema, "name": ref.name}):
        if not names or names[0] != equal or len(names) < 1 + len(wanted):
            continue
        got = list(zip(names[1:], collations[1:], options[1:]))
        if all((name, coll) == w and opt == 0 for (name, coll, opt), w in zip(got, wanted)):
            return True
    return False


_UNIQUE_KEYS = sql.SQL(
    "SELECT coalesce(con.conname, ic.relname), array_agg(a.attname ORDER BY k.ord) "
    "FROM pg_catalog.pg_index AS i "
    "JOIN pg_catalog.pg_class AS c ON c.oid = i.indrelid "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "JOIN pg_catalog.pg_class AS ic ON ic.oid = i.indexrelid "
    "LEFT JOIN pg_catalog.pg_constraint AS con ON con.conindid = i.indexrelid AND con.contype IN ('p', 'u') "
    "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
    "JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND i.indisunique AND i.indisvalid "
    "AND i.indpred IS NULL AND i.indexprs IS NULL AND k.ord <= i.indnkeyatts "
    "GROUP BY con.conname, con.contype, ic.relname "
    "ORDER BY con.contype = 'p' DESC NULLS LAST, con.contype IS NULL, coalesce(con.conname, ic.relname)"
)


def unique_keys(conn: psycopg.Connection, ref: TableRef) -> list[tuple[str, list[str]]]:
    """Primary key, unique constraints and plain unique indexes of a table (in that order),
    each named by its constraint, or by its index when no constraint stands behind it.

    Partial, expression and invalid indexes do not count: they do not guarantee the grain.
    One catalog query on the caller's connection.
    """
    rows = conn.execute(_UNIQUE_KEYS, {"schema": ref.schema, "name": ref.name}).fetchall()
    return [(name, list(columns)) for name, columns in rows]


def _grain_name(target: TableRef, columns: Sequence[str]) -> str:
    name = "_".join([target.name, *columns, "key"])
    while len(name.encode("utf-8")) > 63:
        name = name[:-1]
    return name


def _partition_kind(
    spec: Spec, snames: dict[str, ColumnInfo], tnames: dict[str, ColumnInfo], problems: list[str],
) -> PartitionKind | None:
    """The kind of the target's partition key (None, with a problem, when it cannot be one),
    which the source's must share."""
    if spec.partition_key not in tnames:
        return None
    target_type = tnames[spec.partition_key]
    if spec.partition_window is not None:
        kind = partition_kind_of(target_type, problems, spec)
        source = snames.get(spec.partition_key)
        if kind is not None and source is not None and source.base_type != target_type.base_type:
            problems.append(
                f"partition_key {spec.partition_key} is {source.type_name} in the source but {target_type.type_name} "
                "in the target; a window compares both with the same bounds, so they must be of one type"
            )
        return kind
    kind = PARTITION_KINDS.get(target_type.base_type)
    if kind is None:
        problems.append(
            f"partition_key {spec.partition_key} has type {target_type.type_name}; "
            "use a date, integer or text partition key"
        )
    elif spec.partition_key in snames and PARTITION_KINDS.get(snames[spec.partition_key].base_type) != kind:
        problems.append(
            f"partition_key {spec.partition_key} is {snames[spec.partition_key].type_name} "
            f"in the source but {target_type.type_name} in the target"
        )
    return kind


def _check_source_columns(spec: Spec, snames: dict[str, ColumnInfo], source_kind: str | None,
                          problems: list[str]) -> None:
    if not source_kind:
        return
    src = spec.source_ref
    if spec.partition_key not in snames:
        problems.append(f"source {src} has no partition_key column {spec.partition_key}")
    if spec.transform_sql is None:
        missing = [c for c in spec.input_columns if c not in snames]
        if missing:
            problems.append(f"source {src} has no column(s) {', '.join(missing)}")
    clash = [c for c in spec.input_columns if c.startswith("__backfill") or c.startswith("__v")]
    if clash:
        problems.append(f"column names starting with '__backfill' or '__v' are reserved: {clash}")


_DESCRIBE_TYPES = sql.SQL(
    "SELECT format_type(t.oid, m.mod), t.typcategory, "
    "coalesce(nullif(t.typcollation, 0), nullif(b.typcollation, 0)) IS NOT NULL, b.typname "
    "FROM unnest(%(oids)s::oid[], %(mods)s::int[]) WITH ORDINALITY AS m(oid, mod, ord) "
    "JOIN pg_catalog.pg_type AS t ON t.oid = m.oid "
    "JOIN pg_catalog.pg_type AS b ON b.oid = coalesce(nullif(t.typbasetype, 0), t.oid) ORDER BY m.ord"
)


def describe_query(conn: psycopg.Connection, query: sql.Composable) -> list[ColumnInfo]:
    """The output columns of a query, with their exact types (modifiers included), read from
    the server's description of its result (give it a query that reads no row, such as
    sqlbuild.describe_input's)."""
    with conn.cursor() as cur:
        cur.execute(query)
        result = cur.pgresult
        assert result is not None and cur.description is not None
        names = [c.name for c in cur.description]
        oids = [result.ftype(i) for i in range(result.nfields)]
        mods = [result.fmod(i) for i in range(result.nfields)]
    rows = conn.execute(_DESCRIBE_TYPES, {"oids": oids, "mods": mods}).fetchall()
    return [ColumnInfo(name, r[0], r[1], bool(r[2]), r[3]) for name, r in zip(names, rows)]


def _inspect_source(conn: psycopg.Connection, spec: Spec,
                    problems: list[str]) -> tuple[ServerInfo, str | None, list[ColumnInfo]]:
    """The server, the source's kind and its columns; a problem for each thing wrong."""
    server = server_info(conn)
    if server.version_num < MIN_SERVER_VERSION:
        problems.append(f"PostgreSQL {server.version} is too old; version 12 or newer is needed")
    src = spec.source_ref
    source_kind = table_kind(conn, src)
    source_cols = table_columns(conn, src) if source_kind else []
    if source_kind is None:
        problems.append(f"source table {src} does not exist")
    elif source_kind not in _READABLE_KINDS:
        problems.append(f"source {src} is not a table or view")
    return server, source_kind, source_cols


def inspect_source(conn: psycopg.Connection, spec: Spec) -> Inspection:
    """Inspect the source alone, for a target outside the database: the target's columns and
    partition kind are left for its engine to fill in (core.lake.target)."""
    problems: list[str] = []
    server, source_kind, source_cols = _inspect_source(conn, spec, problems)
    _check_source_columns(spec, {c.name: c for c in source_cols}, source_kind, problems)
    return Inspection(server=server, source_columns=source_cols, target_columns=[], target_unique_keys=[],
                      partition_kind=None, grain_columns=[spec.partition_key, *spec.business_key],
                      grain_ddl=None, problems=problems)


def inspect_tables(conn: psycopg.Connection, spec: Spec) -> Inspection:
    """Inspect source and target read-only and collect every problem with the spec.

    Args:
        conn: a pinned connection.
        spec: the declared backfill.
    """
    problems: list[str] = []
    server, source_kind, source_cols = _inspect_source(conn, spec, problems)
    tgt = spec.target_ref
    target_kind = table_kind(conn, tgt)
    target_cols = table_columns(conn, tgt) if target_kind else []
    if target_kind is None:
        problems.append(f"target table {tgt} does not exist")
    elif target_kind not in _TABLE_KINDS:
        problems.append(f"target {tgt} is not a table (a view or other relation cannot be replaced)")

    tnames = {c.name: c for c in target_cols}
    snames = {c.name: c for c in source_cols}
    if target_kind:
        missing = [c for c in spec.columns if c not in tnames]
        if missing:
            problems.append(f"target {tgt} has no column(s) {', '.join(missing)}")
    _check_source_columns(spec, snames, source_kind, problems)
    partition_kind = _partition_kind(spec, snames, tnames, problems)
    check_total(spec, tnames, problems)

    grain = list(spec.business_key) if spec.records_can_move else [spec.partition_key, *spec.business_key]
    keys: list[tuple[str, list[str]]] = []
    grain_ddl = None
    if target_kind in _TABLE_KINDS and not any(c not in tnames for c in grain):
        keys = unique_keys(conn, tgt)
        # A unique key over a subset of the grain columns guarantees the grain too.
        if not any(set(cols) <= set(grain) for _, cols in keys):
            grain_ddl = sqlbuild.add_unique_constraint(tgt, _grain_name(tgt, grain), grain).as_string(conn) + ";"
            why = "records can move, so the business key must be unique across the table" if spec.records_can_move else "the target grain must be enforced"
            problems.append(
                f"target {tgt} has no UNIQUE ({', '.join(grain)}) or equivalent constraint ({why}); "
                f"add it with: {grain_ddl}"
            )
    return Inspection(
        server=server, source_columns=source_cols, target_columns=target_cols,
        target_unique_keys=keys, partition_kind=partition_kind, grain_columns=grain,
        grain_ddl=grain_ddl, problems=problems,
    )


def business_key_order(columns: Sequence[ColumnInfo], business_key: Sequence[str]) -> list[sqlbuild.OrderKey]:
    """Ascending business-key order; collatable columns by bytes (locale-independent)."""
    by_name = {c.name: c for c in columns}
    return [sqlbuild.OrderKey(k, collate_c=by_name[k].collatable) for k in business_key]
