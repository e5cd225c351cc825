"""What the guard reads of the server's catalog for one transform: the operators, types,
collations and functions its analysed query uses, with what makes each exact or not (a
clock-reading type, a sort or hash method, a deterministic collation)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from backfill_assets.core.engines.postgres.guard.catalog import SUPPORT_NUMBERS, Catalog, compared_types, referenced
from backfill_assets.core.engines.postgres.guard.userfunctions import read_functions

_OPERATORS = sql.SQL(
    "SELECT o.oid::bigint, o.oprcode::oid::bigint FROM pg_catalog.pg_operator AS o "
    "WHERE o.oid = ANY(%(oids)s::oid[])"
)
# Each type with its I/O functions, and its parts: an array's element, a domain's base, a
# range's subtype, a multirange's range, a composite's attribute types.
_TYPES = sql.SQL(
    "SELECT t.oid::bigint, t.typinput::oid::bigint, t.typoutput::oid::bigint, t.typtype, "
    "t.typbasetype::bigint, t.typtypmod, "
    "CASE WHEN t.typcategory = 'A' THEN t.typelem::bigint END, r.rngsubtype::bigint, m.rngtypid::bigint, "
    "(SELECT array_agg(a.atttypid::bigint) FROM pg_catalog.pg_attribute AS a "
    "WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped) "
    "FROM pg_catalog.pg_type AS t "
    "LEFT JOIN pg_catalog.pg_range AS r ON r.rngtypid = t.oid "
    "LEFT JOIN pg_catalog.pg_range AS m ON m.rngmultitypid = t.oid "
    "WHERE t.oid = ANY(%(oids)s::oid[])"
)
# The support functions of the btree and hash operator families of each operator, for its
# argument types (a merge join compares left with right, and sorts each side by its own).
_OPERATOR_SUPPORT = sql.SQL(
    "SELECT o.amopopr::bigint, p.amproc::oid::bigint FROM pg_catalog.pg_amop AS o "
    "JOIN pg_catalog.pg_am AS a ON a.oid = o.amopmethod "
    "JOIN pg_catalog.pg_amproc AS p ON p.amprocfamily = o.amopfamily "
    "AND p.amproclefttype IN (o.amoplefttype, o.amoprighttype) "
    "AND p.amprocrighttype IN (o.amoplefttype, o.amoprighttype) "
    "WHERE o.amopopr = ANY(%(oids)s::oid[]) AND a.amname = ANY(%(methods)s::text[]) "
    "AND p.amprocnum = ANY(%(numbers)s::int2[]) ORDER BY 1, 2"
)
# The comparison functions of each type's default btree operator class (GREATEST, LEAST).
_TYPE_COMPARISON = sql.SQL(
    "SELECT c.opcintype::bigint, p.amproc::oid::bigint FROM pg_catalog.pg_opclass AS c "
    "JOIN pg_catalog.pg_am AS a ON a.oid = c.opcmethod "
    "JOIN pg_catalog.pg_amproc AS p ON p.amprocfamily = c.opcfamily "
    "AND p.amproclefttype = c.opcintype AND p.amprocrighttype = c.opcintype "
    "WHERE c.opcdefault AND c.opcintype = ANY(%(oids)s::oid[]) AND a.amname = %(method)s "
    "AND p.amprocnum = ANY(%(numbers)s::int2[]) ORDER BY 1, 2"
)
_SORT_AND_HASH_METHODS = ["btree", "hash"]
_COLLATIONS = sql.SQL(
    "SELECT c.oid::bigint, c.collisdeterministic FROM pg_catalog.pg_collation AS c "
    "WHERE c.oid = ANY(%(oids)s::oid[])"
)

# Types whose equal values print the same (see core.engines.postgres.guard.determinism); text types need a
# deterministic collation, numeric and char(n) a declared typmod.
_EXACT_TYPES = {16, 17, 18, 19, 20, 21, 23, 26, 1082, 1083, 1114, 1184, 2950}
_TEXT_TYPES = {25, 1043}
_NUMERIC, _BPCHAR = 1700, 1042


def read_catalog(conn: psycopg.Connection, tree: object) -> Catalog:
    """What the determinism rules need to know about the functions, operators and types
    that the analysed ``tree`` uses, in a few catalog reads."""
    funcs, ops, io_types, typed = referenced(tree)
    operator_functions = {int(o): int(f) for o, f in conn.execute(_OPERATORS, {"oids": sorted(ops)}).fetchall()}
    operator_support = _grouped(conn.execute(_OPERATOR_SUPPORT, {
        "oids": sorted(ops), "methods": _SORT_AND_HASH_METHODS, "numbers": list(SUPPORT_NUMBERS)}).fetchall())
    type_comparison = _grouped(conn.execute(_TYPE_COMPARISON, {
        "oids": sorted(compared_types(tree)), "method": "btree", "numbers": list(SUPPORT_NUMBERS)}).fetchall())
    types = _types_with_parts(conn, io_types | {t for t, _, _ in typed})
    io = {oid: (row[1], row[2]) for oid, row in types.items()}
    funcs |= set(operator_functions.values()) | {f for pair in io.values() for f in pair if f}
    funcs |= {f for group in (operator_support, type_comparison) for fs in group.values() for f in fs}
    functions = read_functions(conn, funcs)
    collations = sorted({c for _, _, c in typed if c})
    deterministic = {int(o): bool(d) for o, d in conn.execute(_COLLATIONS, {"oids": collations}).fetchall()}
    exact = {t for t in typed if _is_exact(t, types, deterministic)}
    clock_read = _clock_read(types, {t for t, _, _ in typed})
    return Catalog(functions, operator_functions, {k: v for k, v in io.items() if k in io_types}, exact, clock_read,
                   operator_support, type_comparison)


def _grouped(rows: list[tuple]) -> dict[int, tuple[int, ...]]:
    """(key, function OID) rows -> key -> its function OIDs."""
    out: dict[int, tuple[int, ...]] = {}
    for key, fn in rows:
        out[int(key)] = (*out.get(int(key), ()), int(fn))
    return out


# The types whose input function reads 'now', 'today', 'tomorrow' and 'yesterday' as the clock.
_CLOCK_TYPES = {1082, 1083, 1114, 1184, 1266}


def _parts(row: tuple) -> set[int]:
    """The types a type is made of (see _TYPES): the base of a domain, and the others."""
    base = [row[4]] if row[3] == "d" else []
    return {int(x) for x in [*base, *row[6:9], *(row[9] or [])] if x}


def _types_with_parts(conn: psycopg.Connection, oids: set[int]) -> dict[int, tuple]:
    """type OID -> its _TYPES row, for ``oids`` and every type they are made of (domains over
    domains, arrays of ranges, ...)."""
    found: dict[int, tuple] = {}
    wanted = {o for o in oids if o > 0}
    while wanted:
        rows = conn.execute(_TYPES, {"oids": sorted(wanted)}).fetchall()
        found.update({int(r[0]): tuple(r) for r in rows})
        wanted = {c for r in rows for c in _parts(r)} - found.keys()
    return found


def _clock_read(types: dict[int, tuple], oids: set[int]) -> set[int]:
    """The types among ``oids`` whose literals pass through a date/time input function: the
    date/time types, and arrays, ranges, multiranges, domains and composites of them."""

    def reads(oid: int, seen: frozenset[int] = frozenset()) -> bool:
        row = types.get(oid)
        return oid in _CLOCK_TYPES or (row is not None and any(
            reads(c, seen | {oid}) for c in _parts(row) if c not in seen))

    return {o for o in oids if reads(o)}


def _is_exact(typed: tuple[int, int, int], types: dict[int, tuple], deterministic: dict[int, bool]) -> bool:
    oid, typmod, collation = typed
    row = types.get(oid)
    while row is not None and row[3] == "d":  # a domain: its base type, and its typmod
        typmod = typmod if typmod >= 0 else int(row[5])
        row = types.get(int(row[4]))
    if row is None:
        return False
    base = int(row[0])
    if row[3] == "e":  # an enum: one label per value
        return True
    if base in (_NUMERIC, _BPCHAR):
        return typmod >= 0 and (base == _NUMERIC or deterministic.get(collation, collation == 0))
    if base in _TEXT_TYPES:
        return deterministic.get(collation, collation == 0)
    return base in _EXACT_TYPES
