"""The control schema: snapshots (and the seals of their copies), plans, approvals, the
stage builds, the ledger and the audits.

It lives in the same database as the target, so a plan, its stages and the target can be
read in one transaction.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from backfill_assets.core.errors import SnapshotError
from backfill_assets.core.fingerprint.identity import PartitionDigest, ScopeDocument
from backfill_assets.core.fingerprint.rows import FORMAT as FINGERPRINT_FORMAT
from backfill_assets.core.fingerprint.rows import Reading
from backfill_assets.core.pg import sqlbuild

# The index of the ledger by approval (see _DDL), in the control schema.
LEDGER_APPROVAL_INDEX = "ledger_by_approval"

_DDL = (
    sql.SQL("CREATE SCHEMA IF NOT EXISTS {schema}"),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.snapshots ("
        "snapshot_id text PRIMARY KEY, source_table text NOT NULL, mode text NOT NULL, "
        "snapshot_table text, partition_key text NOT NULL, partitions jsonb NOT NULL, "
        "fingerprint text NOT NULL, created_at timestamptz NOT NULL)"
    ),
    # Added later: the scope; when last taken (the same snapshot again, of a source that went
    # A -> B -> A, keeps its id and created_at but is the newest again); its hashes' fingerprint
    # format (core.fingerprint.rows.FORMAT; NULL: before format 3, never used); the spec's other
    # inputs as it read them (core.store.inputs; NULL: none).
    sql.SQL("ALTER TABLE {schema}.snapshots ADD COLUMN IF NOT EXISTS scope jsonb, ADD COLUMN IF NOT EXISTS "
            "taken_at timestamptz, ADD COLUMN IF NOT EXISTS fingerprint_format integer, "
            "ADD COLUMN IF NOT EXISTS inputs jsonb"),
    # The seal of each snapshot copy: every row was written by one transaction (writer_xid,
    # the rows' xmin), so a later change to any row, or a new or missing row, shows.
    # writer_txid: the same transaction's 64-bit id, to tell when its 32-bit xmin could have
    # been reused (after 2^31 more transactions the seal is no longer trusted).
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.snapshot_copies ("
        "snapshot_table text PRIMARY KEY, fingerprint text NOT NULL, writer_xid text, "
        "writer_txid bigint, row_count bigint NOT NULL, columns jsonb NOT NULL, "
        "copied_at timestamptz NOT NULL)"
    ),
    sql.SQL("ALTER TABLE {schema}.snapshot_copies ADD COLUMN IF NOT EXISTS writer_txid bigint"),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.stage_builds ("
        "spec_name text NOT NULL, variant text NOT NULL, partition text NOT NULL, "
        "snapshot_id text NOT NULL, readings jsonb NOT NULL, built_at timestamptz NOT NULL, "
        "PRIMARY KEY (spec_name, variant, partition))"
    ),
    # The transaction that built each stage partition (its rows' xmin): the stage's seal.
    sql.SQL("ALTER TABLE {schema}.stage_builds ADD COLUMN IF NOT EXISTS writer_xid text"),  # added later
    # The same transaction's 64-bit id: a seal older than plan.SEAL_HORIZON is not trusted.
    sql.SQL("ALTER TABLE {schema}.stage_builds ADD COLUMN IF NOT EXISTS writer_txid bigint"),  # added later
    # false: the build's rows were hashed as they were built and not written (stage B equal
    # to stage A); NULL (an older version) or true: they are in the stage.
    sql.SQL("ALTER TABLE {schema}.stage_builds ADD COLUMN IF NOT EXISTS kept boolean"),  # added later
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.plans ("
        "plan_id text PRIMARY KEY, spec_name text NOT NULL, target_table text NOT NULL, "
        "status text NOT NULL CHECK (status IN ('ready', 'refused')), "
        "snapshot_id text NOT NULL REFERENCES {schema}.snapshots (snapshot_id), "
        "plan jsonb NOT NULL, created_at timestamptz NOT NULL)"
    ),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.approvals ("
        "approval_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
        "plan_id text NOT NULL REFERENCES {schema}.plans (plan_id), spec_name text NOT NULL, "
        "target_table text NOT NULL, partitions jsonb NOT NULL, approved_by text NOT NULL, "
        "approved_at timestamptz NOT NULL)"
    ),
    # What an approval was given against: each partition's target readings when it was
    # approved (NULL: recorded by an older version, which apply refuses).
    sql.SQL("ALTER TABLE {schema}.approvals ADD COLUMN IF NOT EXISTS target_readings jsonb"),  # added later
    # The review the approver was shown (core.preview): its id, when it was made, and what it
    # said the replacement changes (NULL: recorded before reviews were recorded).
    sql.SQL("ALTER TABLE {schema}.approvals ADD COLUMN IF NOT EXISTS review jsonb"),  # added later
    # The newest change preview of each ready plan (core.preview): the target's readings it was
    # made against and what it showed, so that an approval can require the target unchanged
    # since, and the dashboard can mark it stale.
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.previews ("
        "plan_id text PRIMARY KEY REFERENCES {schema}.plans (plan_id), spec_name text NOT NULL, "
        "review_id text NOT NULL, target_readings jsonb NOT NULL, changes jsonb, "
        "made_at timestamptz NOT NULL)"
    ),
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.ledger ("
        "run_id text NOT NULL, plan_id text NOT NULL, approval_id bigint NOT NULL, "
        "snapshot_id text NOT NULL, target_table text NOT NULL, partition text NOT NULL, "
        "transform_version text NOT NULL, row_count bigint, total text, content_hash text, "
        "status text NOT NULL CHECK (status IN ('pending', 'started', 'verified', "
        "'skipped-already-verified', 'failed', 'not-attempted')), "
        "run_started_at timestamptz NOT NULL, started_at timestamptz, finished_at timestamptz, "
        "error text, PRIMARY KEY (run_id, partition))"
    ),
    # Added later: the lake version (Delta) or snapshot id (Iceberg) a verified partition was
    # committed and read back at (NULL for a PostgreSQL target); a time window's instants beside
    # its label (NULL for a value: start <= the column < end).
    sql.SQL("ALTER TABLE {schema}.ledger ADD COLUMN IF NOT EXISTS target_version text, "
            "ADD COLUMN IF NOT EXISTS window_start timestamptz, ADD COLUMN IF NOT EXISTS window_end timestamptz"),
    # Every audit of every partition (core.audit): what it was compared with (the verified
    # run), by which signal, what was found, the readings read and what changed.
    sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.audits ("
        "audit_id text NOT NULL, spec_name text NOT NULL, target_table text NOT NULL, "
        "partition text NOT NULL, audited_at timestamptz NOT NULL, "
        "result text NOT NULL CHECK (result IN ('holds', 'drifted', 'never verified')), "
        "signal text NOT NULL, signal_value text, verified_run_id text, readings jsonb, changes jsonb, "
        "PRIMARY KEY (audit_id, partition))"
    ),
    sql.SQL("CREATE INDEX IF NOT EXISTS audits_by_partition ON {schema}.audits (target_table, partition, audited_at)"),
)

_SNAPSHOT_ROW = sql.SQL(
    "SELECT snapshot_id, snapshot_table, fingerprint, mode, partitions, scope, fingerprint_format "
    "FROM {schema}.snapshots WHERE snapshot_id = %(snapshot_id)s"
)
_INSERT_SNAPSHOT = sql.SQL(
    "INSERT INTO {schema}.snapshots (snapshot_id, source_table, mode, snapshot_table, "
    "partition_key, partitions, fingerprint, scope, created_at, taken_at, fingerprint_format) VALUES (%(snapshot_id)s, "
    "%(source_table)s, %(mode)s, %(snapshot_table)s, %(partition_key)s, %(partitions)s, "
    "%(fingerprint)s, %(scope)s, %(created_at)s, %(created_at)s, %(format)s) ON CONFLICT (snapshot_id) "
    "DO UPDATE SET taken_at = greatest({schema}.snapshots.taken_at, EXCLUDED.taken_at)"
)
_UPSERT_BUILD = sql.SQL(
    "INSERT INTO {schema}.stage_builds (spec_name, variant, partition, snapshot_id, readings, "
    "writer_xid, writer_txid, kept, built_at) VALUES (%(spec_name)s, %(variant)s, %(partition)s, "
    "%(snapshot_id)s, %(readings)s, %(writer_xid)s, %(writer_txid)s, %(kept)s, %(built_at)s) "
    "ON CONFLICT (spec_name, variant, partition) "
    "DO UPDATE SET snapshot_id = EXCLUDED.snapshot_id, readings = EXCLUDED.readings, "
    "writer_xid = EXCLUDED.writer_xid, writer_txid = EXCLUDED.writer_txid, kept = EXCLUDED.kept, "
    "built_at = EXCLUDED.built_at"
)
_UNKEPT_BUILDS = sql.SQL(
    "SELECT partition, readings FROM {schema}.stage_builds WHERE spec_name = %(spec_name)s "
    "AND variant = %(variant)s AND partition = ANY(%(partitions)s) AND kept IS FALSE"
)
_BUILDS = sql.SQL(
    "SELECT partition, readings, writer_xid, "
    "txid_snapshot_xmax(txid_current_snapshot()) - writer_txid FROM {schema}.stage_builds "
    "WHERE spec_name = %(spec_name)s AND variant = %(variant)s AND partition = ANY(%(partitions)s)"
)
_INSERT_PLAN = sql.SQL(
    "INSERT INTO {schema}.plans (plan_id, spec_name, target_table, status, snapshot_id, plan, "
    "created_at) VALUES (%(plan_id)s, %(spec_name)s, %(target_table)s, %(status)s, "
    "%(snapshot_id)s, %(plan)s, %(created_at)s) ON CONFLICT (plan_id) DO NOTHING"
)


def ensure_control_schema(conn: psycopg.Connection, schema: str) -> None:
    """Create the control schema and its tables if missing, in the caller's transaction.

    An advisory transaction lock keeps two first runs from racing on CREATE.
    """
    conn.execute(*sqlbuild.advisory_xact_lock(f"backfill_assets:control:{schema}"))
    for ddl in _DDL:
        conn.execute(ddl.format(schema=sql.Identifier(schema)))


class SnapshotRow(TypedDict):
    """A recorded snapshot (``scope`` None: recorded before scopes; ``fingerprint_format`` None: before format 3)."""

    snapshot_id: str
    snapshot_table: str | None
    fingerprint: str
    mode: str
    partitions: list[PartitionDigest]
    scope: ScopeDocument | None
    fingerprint_format: int | None


def find_snapshot(conn: psycopg.Connection, schema: str, snapshot_id: str) -> SnapshotRow | None:
    """A recorded snapshot, or None."""
    row = conn.execute(
        _SNAPSHOT_ROW.format(schema=sql.Identifier(schema)), {"snapshot_id": snapshot_id}
    ).fetchone()
    if row is None:
        return None
    keys = ("snapshot_id", "snapshot_table", "fingerprint", "mode", "partitions", "scope", "fingerprint_format")
    return cast(SnapshotRow, dict(zip(keys, row)))


def record_snapshot(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record a snapshot (idempotent: the id is derived from its content and scope; taking
    the same snapshot again only moves its ``taken_at``, so it is the newest again)."""
    fields = {**fields, "partitions": Jsonb(fields["partitions"]), "scope": Jsonb(fields["scope"]),
              "format": FINGERPRINT_FORMAT}
    conn.execute(_INSERT_SNAPSHOT.format(schema=sql.Identifier(schema)), fields)


_SNAPSHOT_RECORD = sql.SQL(
    "SELECT snapshot_id, source_table, mode, snapshot_table, partition_key, partitions, fingerprint, "
    "scope, created_at, taken_at, fingerprint_format FROM {schema}.snapshots WHERE snapshot_id = %(snapshot_id)s"
)
_COPY_SNAPSHOT_RECORD = sql.SQL(
    "INSERT INTO {schema}.snapshots (snapshot_id, source_table, mode, snapshot_table, partition_key, "
    "partitions, fingerprint, scope, created_at, taken_at, fingerprint_format) VALUES (%(snapshot_id)s, "
    "%(source_table)s, %(mode)s, %(snapshot_table)s, %(partition_key)s, %(partitions)s, %(fingerprint)s, "
    "%(scope)s, %(created_at)s, %(taken_at)s, %(fingerprint_format)s) ON CONFLICT (snapshot_id) "
    "DO UPDATE SET taken_at = greatest({schema}.snapshots.taken_at, EXCLUDED.taken_at)"
)


def copy_snapshot_record(data: psycopg.Connection, control: psycopg.Connection, schema: str, snapshot_id: str) -> None:
    """Record a snapshot taken in the data database in a control store of its own too, as the
    plans made from it there refer to it (its rows and copies stay with the data)."""
    target = sql.Identifier(schema)
    with data.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SNAPSHOT_RECORD.format(schema=target), {"snapshot_id": snapshot_id}).fetchone()
    if row is None:
        raise SnapshotError(f"snapshot {snapshot_id[:16]} is not recorded in the data database; plan again")
    row = {**row, "partitions": Jsonb(row["partitions"]), "scope": Jsonb(row["scope"])}
    control.execute(_COPY_SNAPSHOT_RECORD.format(schema=target), row)


_UPSERT_COPY = sql.SQL(
    "INSERT INTO {schema}.snapshot_copies (snapshot_table, fingerprint, writer_xid, writer_txid, "
    "row_count, columns, copied_at) VALUES (%(snapshot_table)s, %(fingerprint)s, %(writer_xid)s, "
    "txid_current(), %(row_count)s, %(columns)s, %(copied_at)s) ON CONFLICT (snapshot_table) "
    "DO UPDATE SET fingerprint = EXCLUDED.fingerprint, writer_xid = EXCLUDED.writer_xid, "
    "writer_txid = EXCLUDED.writer_txid, row_count = EXCLUDED.row_count, "
    "columns = EXCLUDED.columns, copied_at = EXCLUDED.copied_at"
)
_COPY_SEAL = sql.SQL(
    "SELECT fingerprint, writer_xid, row_count, columns, "
    "txid_snapshot_xmax(txid_current_snapshot()) - writer_txid "
    "FROM {schema}.snapshot_copies WHERE snapshot_table = %(snapshot_table)s"
)


def record_copy(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record the seal of a snapshot copy just made (replacing an earlier copy's)."""
    fields = {**fields, "columns": Jsonb(fields["columns"])}
    conn.execute(_UPSERT_COPY.format(schema=sql.Identifier(schema)), fields)


def copy_seal(conn: psycopg.Connection, schema: str, snapshot_table: str) -> dict[str, Any] | None:
    """The recorded seal of a snapshot copy (fingerprint, writer_xid, row_count, columns, and
    transactions_since: how many transaction ids were assigned since the copy was made)."""
    row = conn.execute(
        _COPY_SEAL.format(schema=sql.Identifier(schema)), {"snapshot_table": snapshot_table}
    ).fetchone()
    keys = ("fingerprint", "writer_xid", "row_count", "columns", "transactions_since")
    return None if row is None else dict(zip(keys, row))


def record_build(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record the readings of one stage partition as built from a snapshot, and the
    transaction that wrote its rows (``writer_xid``, its rows' xmin, and ``writer_txid``, the
    same transaction's 64-bit id), and whether they were ``kept`` in the stage (default
    true); latest wins."""
    fields = {"kept": True, **fields, "readings": Jsonb(fields["readings"])}
    conn.execute(_UPSERT_BUILD.format(schema=sql.Identifier(schema)), fields)


def builds(
    conn: psycopg.Connection, schema: str, spec_name: str, variant: str, partitions: list[str]
) -> dict[str, tuple[Reading, str | None, int | None]]:
    """partition -> (readings, writer_xid, transactions_since) of the latest build of one
    stage; transactions_since counts the transaction ids assigned since the build (None for a
    build recorded by an older version)."""
    rows = conn.execute(
        _BUILDS.format(schema=sql.Identifier(schema)),
        {"spec_name": spec_name, "variant": variant, "partitions": partitions},
    ).fetchall()
    return {r[0]: (r[1], r[2], None if r[3] is None else int(r[3])) for r in rows}


def unkept_builds(
    conn: psycopg.Connection, schema: str, spec_name: str, variant: str, partitions: list[str]
) -> dict[str, Reading]:
    """partition -> readings of the latest builds of one stage that were hashed as they were
    built but not written (see core.engines.postgres.stages)."""
    rows = conn.execute(
        _UNKEPT_BUILDS.format(schema=sql.Identifier(schema)),
        {"spec_name": spec_name, "variant": variant, "partitions": partitions},
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def record_plan(conn: psycopg.Connection, schema: str, **fields: Any) -> None:
    """Record a plan (idempotent: the id is derived from its content)."""
    fields = {**fields, "plan": Jsonb(fields["plan"])}
    conn.execute(_INSERT_PLAN.format(schema=sql.Identifier(schema)), fields)


_PLANS_BY_PREFIX = sql.SQL(
    "SELECT plan_id, status, plan FROM {schema}.plans WHERE plan_id LIKE %(pattern)s "
    "ORDER BY plan_id LIMIT 2"
)
# The columns added to the control schema after its tables (table's name in _SCHEMA_STATE, column):
# a schema without one of them was made by an older version, and is brought up to date.
_ADDED_COLUMNS = (("snapshots", "scope"), ("snapshots", "taken_at"), ("snapshots", "fingerprint_format"),
                  ("snapshots", "inputs"), ("builds", "writer_xid"), ("copies", "writer_txid"),
                  ("builds", "writer_txid"), ("builds", "kept"), ("approvals", "target_readings"),
                  ("approvals", "review"), ("ledger", "target_version"), ("ledger", "window_start"),
                  ("ledger", "window_end"))
_SCHEMA_STATE = sql.SQL(
    "SELECT to_regclass(%(plans)s) IS NOT NULL, "
    "to_regclass(%(ledger)s) IS NOT NULL AND to_regclass(%(builds)s) IS NOT NULL "
    "AND to_regclass(%(copies)s) IS NOT NULL AND to_regclass(%(previews)s) IS NOT NULL "
    "AND to_regclass(%(audits)s) IS NOT NULL AND {}"
).format(sql.SQL(" AND ").join(
    sql.SQL("EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass({}) AND attname = {} "
            "AND NOT attisdropped)").format(sql.Placeholder(table), sql.Literal(column))
    for table, column in _ADDED_COLUMNS))


def control_ready(conn: psycopg.Connection, schema: str) -> bool:
    """Whether the control schema exists (a first plan creates it). A schema made by an
    older version is brought up to date here, in its own transaction."""
    names = {k: sql.Identifier(schema, k).as_string(conn) for k in ("plans", "ledger", "snapshots", "approvals")}
    names["builds"] = sql.Identifier(schema, "stage_builds").as_string(conn)
    names["copies"] = sql.Identifier(schema, "snapshot_copies").as_string(conn)
    names["previews"] = sql.Identifier(schema, "previews").as_string(conn)
    names["audits"] = sql.Identifier(schema, "audits").as_string(conn)
    row = conn.execute(_SCHEMA_STATE, names).fetchone()
    if not row or not row[0]:
        return False
    if not row[1]:
        with conn.transaction():
            ensure_control_schema(conn, schema)
    return True


# The ledger read by approval: what an approval's own runs did (status, the approval sensor,
# apply's stop after a failure). Without it each of those reads the whole ledger, which grows
# by a row per partition per run, once per approval it judges.
_LEDGER_INDEX_EXISTS = sql.SQL("SELECT to_regclass(%(index)s) IS NOT NULL")
_CREATE_LEDGER_INDEX = sql.SQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {ledger} (approval_id)")


def ensure_ledger_index(conn: psycopg.Connection, schema: str) -> None:
    """Index the ledger by approval if it is not yet (a schema made before the index, or a new
    one). Built CONCURRENTLY, outside any transaction, so that other runs keep writing the
    ledger meanwhile; apply calls it before its first write (read-only commands never build
    it, and work without it, only slower). ``conn`` must not be in a transaction."""
    index = sql.Identifier(schema, LEDGER_APPROVAL_INDEX)
    (exists,) = conn.execute(_LEDGER_INDEX_EXISTS, {"index": index.as_string(conn)}).fetchone()
    if not exists:
        conn.execute(_CREATE_LEDGER_INDEX.format(index=sql.Identifier(LEDGER_APPROVAL_INDEX),
                                                  ledger=sql.Identifier(schema, "ledger")))


def plans_by_prefix(conn: psycopg.Connection, schema: str, prefix: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Up to two stored plans whose id starts with ``prefix`` (hex, validated by the caller)."""
    rows = conn.execute(
        _PLANS_BY_PREFIX.format(schema=sql.Identifier(schema)), {"pattern": prefix + "%"}
    ).fetchall()
    return [(r[0], r[1], r[2] if isinstance(r[2], dict) else json.loads(r[2])) for r in rows]


_PLANS_WITH = sql.SQL(
    "SELECT e ->> 'partition', p.plan_id, e -> 'stage_a', e -> 'stage_b' "
    "FROM {schema}.plans AS p, jsonb_array_elements(p.plan -> 'partitions') AS e "
    "WHERE p.spec_name = %(spec_name)s AND e ->> 'partition' = ANY(%(partitions)s) "
    "ORDER BY p.created_at DESC, p.plan_id"
)
_LATEST_SNAPSHOTTED = sql.SQL(
    "SELECT DISTINCT ON (e ->> 'partition') e ->> 'partition', e ->> 'content_hash' "
    "FROM {schema}.snapshots AS s, jsonb_array_elements(s.partitions) AS e "
    "WHERE s.source_table = %(source_table)s AND s.fingerprint_format = %(format)s "
    "ORDER BY e ->> 'partition', coalesce(s.taken_at, s.created_at) DESC"
)


def plans_with(
    conn: psycopg.Connection, schema: str, spec_name: str, partitions: list[str]
) -> dict[str, list[tuple[str, Reading, Reading]]]:
    """partition -> (plan_id, stage_a readings, stage_b readings) of every plan of a spec that
    includes it, newest first."""
    rows = conn.execute(
        _PLANS_WITH.format(schema=sql.Identifier(schema)), {"spec_name": spec_name, "partitions": partitions}
    ).fetchall()
    out: dict[str, list[tuple[str, Reading, Reading]]] = {}
    for label, plan_id, a, b in rows:
        out.setdefault(label, []).append((plan_id, a, b))
    return out


def latest_snapshotted(conn: psycopg.Connection, schema: str, source_table: str) -> dict[str, str]:
    """partition -> source content hash in the newest snapshot of each partition of a source."""
    rows = conn.execute(
        _LATEST_SNAPSHOTTED.format(schema=sql.Identifier(schema)), {"source_table": source_table, "format": FINGERPRINT_FORMAT}
    ).fetchall()
    return {r[0]: r[1] for r in rows}


_NEWEST_SNAPSHOTS = sql.SQL(
    "SELECT DISTINCT ON (e ->> 'partition') e ->> 'partition', s.snapshot_id, e ->> 'content_hash' "
    "FROM {schema}.snapshots AS s, jsonb_array_elements(s.partitions) AS e "
    "WHERE s.source_table = %(source_table)s AND s.partition_key = %(partition_key)s "
    "AND s.fingerprint_format = %(format)s AND e ->> 'partition' = ANY(%(partitions)s) "
    "ORDER BY e ->> 'partition', coalesce(s.taken_at, s.created_at) DESC, s.snapshot_id"
)
# The newest snapshot holding every given partition with the given source content hash.
_SNAPSHOT_WITH = sql.SQL(
    "SELECT s.snapshot_id FROM {schema}.snapshots AS s "
    "WHERE s.source_table = %(source_table)s AND s.partition_key = %(partition_key)s "
    "AND s.fingerprint_format = %(format)s "
    "AND NOT EXISTS (SELECT 1 FROM jsonb_each_text(%(hashes)s) AS w(partition, content_hash) "
    "WHERE NOT EXISTS (SELECT 1 FROM jsonb_array_elements(s.partitions) AS e "
    "WHERE e ->> 'partition' = w.partition AND e ->> 'content_hash' = w.content_hash)) "
    "ORDER BY coalesce(s.taken_at, s.created_at) DESC, s.snapshot_id LIMIT 1"
)


def newest_snapshots(
    conn: psycopg.Connection, schema: str, source_table: str, partition_key: str, partitions: list[str]
) -> dict[str, tuple[str, str]]:
    """partition -> (snapshot_id, source content hash) of the newest snapshot holding each of
    ``partitions`` (partitions never snapshotted are absent)."""
    rows = conn.execute(
        _NEWEST_SNAPSHOTS.format(schema=sql.Identifier(schema)),
        {"source_table": source_table, "partition_key": partition_key, "partitions": partitions,
         "format": FINGERPRINT_FORMAT},
    ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


def snapshot_with(
    conn: psycopg.Connection, schema: str, source_table: str, partition_key: str, hashes: dict[str, str]
) -> str | None:
    """The newest snapshot holding every partition of ``hashes`` (partition -> source
    content hash) with that content, or None."""
    row = conn.execute(
        _SNAPSHOT_WITH.format(schema=sql.Identifier(schema)),
        {"source_table": source_table, "partition_key": partition_key, "hashes": Jsonb(hashes),
         "format": FINGERPRINT_FORMAT},
    ).fetchone()
    return None if row is None else row[0]
