"""Two relations compared in DuckDB by the canonical text of their rows (docs/fingerprint.md),
key by key: the change preview and the keys that explain a refused plan or a failed
verification, for every engine whose stages or target DuckDB can read (DuckDB's own stages,
and Arrow data registered on a DuckDB connection). The statements are composed with
psycopg.sql (whose identifier quoting is DuckDB's too) and rendered to text without a
PostgreSQL connection; the partition is DuckDB's named parameter ``$partition``."""

from __future__ import annotations

from collections.abc import Sequence

from psycopg import sql

from backfill_assets.core.differences import FirstKey
from backfill_assets.core.fingerprint import digest


def text_of(composed: sql.Composable) -> str:
    """A composed statement as DuckDB's text."""
    return composed.as_string(None)


def identifiers(names: Sequence[str], alias: str | None = None) -> sql.Composed:
    """Quoted column names, qualified by ``alias`` when given."""
    return sql.SQL(", ").join(sql.Identifier(alias, n) if alias else sql.Identifier(n) for n in names)


def _compared(left: str, right: str, partition_key: str, business_key: Sequence[str],
              fields: Sequence[tuple[str, str]]) -> sql.Composed:
    """One partition (``$partition``) of two relations joined on the business key, each side's
    row as its canonical text (NULL where the side has no row)."""
    def side(rel: str) -> sql.Composed:
        return sql.SQL("(SELECT {keys}, {text} AS row_text FROM {rel} AS t WHERE t.{pk} = $partition)").format(
            keys=identifiers(business_key, "t"), text=sql.SQL(digest.row_text(fields)), rel=sql.Identifier(rel),
            pk=sql.Identifier(partition_key))
    on = sql.SQL(" AND ").join(sql.SQL("l.{k} IS NOT DISTINCT FROM r.{k}").format(k=sql.Identifier(k))
                               for k in business_key)
    return sql.SQL("{l} AS l FULL JOIN {r} AS r ON {on}").format(l=side(left), r=side(right), on=on)


def differing_keys(left: str, right: str, partition_key: str, business_key: Sequence[str],
                   fields: Sequence[tuple[str, str]], most: int = 3) -> str:
    """The first ``most`` business keys (in key order) whose rows differ between two relations
    in partition ``$partition``."""
    keys = sql.SQL(", ").join(sql.SQL("CAST(coalesce(l.{k}, r.{k}) AS VARCHAR)").format(k=sql.Identifier(k))
                              for k in business_key)
    order = sql.SQL(", ").join(sql.SQL("coalesce(l.{k}, r.{k})").format(k=sql.Identifier(k)) for k in business_key)
    return text_of(sql.SQL("SELECT {keys} FROM {joined} WHERE l.row_text IS DISTINCT FROM r.row_text "
                         "ORDER BY {order} LIMIT {most}").format(
        keys=keys, joined=_compared(left, right, partition_key, business_key, fields), order=order,
        most=sql.Literal(most)))


def first_changes(stage: str, target: str, partition_key: str, business_key: Sequence[str],
                  fields: Sequence[tuple[str, str]], most: int) -> str:
    """For partition ``$partition``: the first ``most`` keys (in key order) that replacing
    ``target`` with ``stage`` adds, removes or changes, each with its key as text, its kind
    and the columns whose canonical text differs (none for a key added or removed)."""
    def side(rel: str) -> sql.Composed:
        columns = sql.SQL(", ").join(sql.SQL("{} AS {}").format(sql.SQL(digest.field_text(n, k)), sql.Identifier(f"c{i}"))
                                     for i, (n, k) in enumerate(fields))
        return sql.SQL("(SELECT {keys}, {text} AS row_text, {columns} FROM {rel} AS t WHERE t.{pk} = $partition)").format(
            keys=identifiers(business_key, "t"), text=sql.SQL(digest.row_text(fields)), columns=columns,
            rel=sql.Identifier(rel), pk=sql.Identifier(partition_key))
    on = sql.SQL(" AND ").join(sql.SQL("l.{k} IS NOT DISTINCT FROM r.{k}").format(k=sql.Identifier(k))
                               for k in business_key)
    keys = sql.SQL(", ").join(sql.SQL("CAST(coalesce(l.{k}, r.{k}) AS VARCHAR)").format(k=sql.Identifier(k))
                              for k in business_key)
    order = sql.SQL(", ").join(sql.SQL("coalesce(l.{k}, r.{k})").format(k=sql.Identifier(k)) for k in business_key)
    differ = sql.SQL(", ").join(
        sql.SQL("CASE WHEN l.{c} IS DISTINCT FROM r.{c} THEN {name} END").format(
            c=sql.Identifier(f"c{i}"), name=sql.Literal(n)) for i, (n, _) in enumerate(fields))
    return text_of(sql.SQL(
        "SELECT {keys}, CASE WHEN r.row_text IS NULL THEN 'added' WHEN l.row_text IS NULL THEN 'removed' "
        "ELSE 'changed' END, CASE WHEN l.row_text IS NULL OR r.row_text IS NULL THEN []::VARCHAR[] "
        "ELSE list_filter([{differ}], lambda x: x IS NOT NULL) END "
        "FROM {l} AS l FULL JOIN {r} AS r ON {on} WHERE l.row_text IS DISTINCT FROM r.row_text "
        "ORDER BY {order} LIMIT {most}").format(
        keys=keys, differ=differ, l=side(stage), r=side(target), on=on, order=order, most=sql.Literal(most)))


def first_changes_json(rows: Sequence[tuple], business_key: Sequence[str]) -> list[FirstKey]:
    """:func:`first_changes`'s rows as the PostgreSQL engine's change preview gives them (keys, kind, columns)."""
    n = len(business_key)
    return [FirstKey(key=dict(zip(business_key, r[:n])), kind=r[n], columns=list(r[n + 1])) for r in rows]


def change_counts(stage: str, target: str, partition_key: str, business_key: Sequence[str],
                  fields: Sequence[tuple[str, str]]) -> str:
    """For partition ``$partition``: the keys replacing ``target`` with ``stage`` adds,
    removes, changes and keeps."""
    return text_of(sql.SQL(
        "SELECT count(*) FILTER (WHERE r.row_text IS NULL), count(*) FILTER (WHERE l.row_text IS NULL), "
        "count(*) FILTER (WHERE l.row_text <> r.row_text), count(*) FILTER (WHERE l.row_text = r.row_text) "
        "FROM {joined}").format(joined=_compared(stage, target, partition_key, business_key, fields)))


def partition_diff(left: str, right: str, partition_key: str, business_key: Sequence[str],
                   fields: Sequence[tuple[str, str]], most: int) -> str:
    """For partition ``$partition``, the ``diff`` of ``left`` (the rows a replacement writes)
    against ``right`` (what is there), keyed by the business key and decided by each row's
    canonical text (its 64-bit hash, as the PostgreSQL engine's diff: a changed row escapes only by a
    collision, about 1 in 2^64; plans and verifications are decided by the fingerprint): rows
    (``'count'``, kind, count, NULL, NULL, NULL) per kind, then up to ``most`` differing keys
    in key order as (``'example'``, kind, their rank, NULL, left's row, right's row), each row
    a struct of the columns (NULL where that side has no row; of a key a side holds more than
    once, which counts once, as changed, its row with the least canonical text)."""
    keys = identifiers(business_key)

    def grouped(rel: str) -> sql.Composed:
        return sql.SQL("(SELECT {keys}, count(*) AS __n, min(hash({text})) AS __h FROM {rel} AS t "
                       "WHERE t.{pk} = $partition GROUP BY ALL)").format(
            keys=identifiers(business_key, "t"), text=sql.SQL(digest.row_text(fields)), rel=sql.Identifier(rel),
            pk=sql.Identifier(partition_key))

    def row_of(rel: str) -> sql.Composed:
        match = sql.SQL(" AND ").join(sql.SQL("t.{k} IS NOT DISTINCT FROM e.{k}").format(k=sql.Identifier(k))
                                      for k in business_key)
        return sql.SQL("(SELECT struct_pack({members}) FROM {rel} AS t WHERE t.{pk} = $partition AND {match} "
                       "ORDER BY {text} LIMIT 1)").format(
            members=sql.SQL(", ").join(sql.SQL("{} := t.{}").format(sql.Identifier(n), sql.Identifier(n))
                                       for n, _ in fields),
            rel=sql.Identifier(rel), pk=sql.Identifier(partition_key), match=match,
            text=sql.SQL(digest.row_text(fields)))

    on = sql.SQL(" AND ").join(sql.SQL("l.{k} IS NOT DISTINCT FROM r.{k}").format(k=sql.Identifier(k))
                               for k in business_key)
    coalesced = sql.SQL(", ").join(sql.SQL("coalesce(l.{k}, r.{k}) AS {k}").format(k=sql.Identifier(k))
                                   for k in business_key)
    return text_of(sql.SQL(
        "WITH j AS MATERIALIZED (SELECT {coalesced}, CASE WHEN r.__n IS NULL THEN 'added' "
        "WHEN l.__n IS NULL THEN 'removed' WHEN l.__n > 1 OR r.__n > 1 OR l.__h <> r.__h THEN 'changed' "
        "ELSE 'unchanged' END AS __kind FROM {l} AS l FULL JOIN {r} AS r ON {on}), "
        "e AS (SELECT {keys}, __kind, row_number() OVER (ORDER BY {keys}) AS __rank FROM "
        "(SELECT {keys}, __kind FROM j WHERE __kind <> 'unchanged' ORDER BY {keys} LIMIT {most})) "
        "SELECT 'count' AS __row, __kind, count(*) AS __n, NULL AS __a, NULL AS __b FROM j GROUP BY __kind "
        "UNION ALL SELECT 'example', __kind, __rank, {left_row}, {right_row} FROM e AS e "
        "ORDER BY __row, __n").format(
        coalesced=coalesced, l=grouped(left), r=grouped(right), on=on, keys=keys, most=sql.Literal(most),
        left_row=row_of(left), right_row=row_of(right)))
