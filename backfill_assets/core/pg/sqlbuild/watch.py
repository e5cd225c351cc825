"""What the source sensor reads to tell whether a source moved, cheapest first: the table's
change counters in the statistics system (no row is read), then per partition the row count
and a digest of a declared change column's values through an index on (partition key,
change column).
"""

from __future__ import annotations

from psycopg import sql

from backfill_assets.core.pg.sqlbuild.parts import Query, table
from backfill_assets.core.vocabulary import TableRef

# Gate 1. Each relation that holds the source's rows (the table itself; for a partitioned
# table its leaf partitions), its kind, its file (a TRUNCATE, VACUUM FULL, CLUSTER or
# rewriting ALTER gives a new one) and its cumulative insert, update and delete counts.
# pg_partition_tree lists nothing for a plain table, hence the first branch.
_TABLE_COUNTERS = sql.SQL(
    "WITH rel AS (SELECT c.oid, c.relkind FROM pg_catalog.pg_class AS c "
    "JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %(schema)s AND c.relname = %(name)s), "
    "leaves AS (SELECT rel.oid AS relid FROM rel WHERE rel.relkind <> 'p' "
    "UNION ALL SELECT t.relid FROM rel, pg_catalog.pg_partition_tree(rel.oid) AS t "
    "WHERE rel.relkind = 'p' AND t.isleaf) "
    "SELECT l.relid::bigint, c.relkind::text, pg_catalog.pg_relation_filenode(l.relid)::bigint, "
    "pg_catalog.pg_stat_get_tuples_inserted(l.relid), pg_catalog.pg_stat_get_tuples_updated(l.relid), "
    "pg_catalog.pg_stat_get_tuples_deleted(l.relid), c.relhassubclass "
    "FROM leaves AS l JOIN pg_catalog.pg_class AS c ON c.oid = l.relid ORDER BY 1"
)

# Whether the counters can be trusted, and when they last started from zero: a reset of the
# database's counters (pg_stat_reset, or one table's) moves pg_stat_database.stats_reset;
# crash recovery discards every counter and sets the shared counters' reset time, which
# pg_stat_bgwriter shows. A standby does not count the writes it replays.
_STATISTICS_STATE = sql.SQL(
    "SELECT pg_catalog.current_setting('track_counts')::boolean, pg_catalog.pg_is_in_recovery(), "
    "(SELECT d.stats_reset::text FROM pg_catalog.pg_stat_database AS d "
    "WHERE d.datname = pg_catalog.current_database()), "
    "(SELECT b.stats_reset::text FROM pg_catalog.pg_stat_bgwriter AS b)"
)

# Gate 2. Per partition label: the row count, the change column's newest value, its NULL
# count and a sum of its values' hashes, in one walk over the partition's entries of the
# index on (partition key, change column) (an index-only scan where the visibility map
# allows): no sort, no heap row decoded. The sum moves when any row's change value does,
# whatever order the writers commit in; the count when a row comes or goes. Labels are bound
# as text and cast to the key's type; a window's label comes with its bounds, a range of the index.
_SIGNALS = sql.SQL(
    "SELECT l.label, g.n, g.v, g.z, g.h FROM {labels} "
    "CROSS JOIN LATERAL (SELECT count(*), max(s.{c})::text, count(*) FILTER (WHERE s.{c} IS NULL), "
    "sum(pg_catalog.hashtextextended(s.{c}::text, 0))::text "
    "FROM {rel} AS s WHERE {where}) AS g(n, v, z, h) ORDER BY l.label"
)
_LABELS = sql.SQL("unnest(CAST(%(labels)s AS pg_catalog.text[])) AS l(label)")
_AT_LABEL = sql.SQL("s.{pk} = CAST(l.label AS {t})")
# Windows: each label with its bounds, a range of the same index.
_WINDOW_LABELS = sql.SQL(
    "unnest(CAST(%(labels)s AS pg_catalog.text[]), CAST(%(starts)s AS {t}[]), CAST(%(ends)s AS {t}[])) "
    "AS l(label, lo, hi)"
)
_IN_WINDOW = sql.SQL("s.{pk} >= l.lo AND s.{pk} < l.hi")


def table_counters(rel: TableRef) -> Query:
    """Per relation holding the rows of ``rel``: oid, relkind, file node, the inserted,
    updated and deleted tuple counts of the statistics system, and whether it has inheritance
    children (whose rows a read of it includes, but whose writes its counters do not)."""
    return _TABLE_COUNTERS, {"schema": rel.schema, "name": rel.name}


def statistics_state() -> Query:
    """track_counts, whether the server is a standby, and the two counter reset times."""
    return _STATISTICS_STATE.format(), {}


def partition_signals(
    rel: TableRef, partition_key: str, key_type: str, change_column: str, labels: list[str],
) -> Query:
    """Per label: (label, row count, newest change value as text, change NULL count, sum of
    the change values' hashes as text).

    Args:
        key_type: the partition key's base type name in ``pg_catalog`` (date, int8, text...).
    """
    pk, t = sql.Identifier(partition_key), sql.Identifier("pg_catalog", key_type)
    return _SIGNALS.format(
        labels=_LABELS, rel=table(rel), c=sql.Identifier(change_column), where=_AT_LABEL.format(pk=pk, t=t),
    ), {"labels": labels}


def window_signals(
    rel: TableRef, partition_key: str, key_type: str, change_column: str, windows: list[tuple[str, object, object]],
) -> Query:
    """:func:`partition_signals` of time windows: ``windows`` are (label, start, end), the
    bounds as the column holds them (core.windows.Windowing.bound)."""
    pk, t = sql.Identifier(partition_key), sql.Identifier("pg_catalog", key_type)
    query = _SIGNALS.format(labels=_WINDOW_LABELS.format(t=t), rel=table(rel), c=sql.Identifier(change_column),
                            where=_IN_WINDOW.format(pk=pk))
    return query, {"labels": [w[0] for w in windows], "starts": [w[1] for w in windows],
                   "ends": [w[2] for w in windows]}
