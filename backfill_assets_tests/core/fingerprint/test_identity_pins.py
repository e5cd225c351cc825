"""Pinned identities: the plan id and snapshot id of a fixed source and spec are literal
values here, so that reshaping the plan document, renaming a key of it or changing how ids
are hashed fails loudly instead of orphaning every stored plan and approval.

If one of these changes on purpose, that is a format change: bump PLAN_FORMAT or
SNAPSHOT_FORMAT and say how stored plans and approvals carry over.

History: snapshot v2 (issue 12) hashes a snapshot's rows in an order of their values that is
cheaper to sort and needs no text form for exact types (fingerprint.snapshot_rows_hash);
every snapshot id, and so every plan id, changed with it (docs/fingerprint.md says how
stored plans carry over). Fingerprint format 3 (issue 21) changes every content hash, and so
every snapshot and plan id; plans say ``fingerprint_format: 3``, and a plan made before it is
refused with "plan again" (the stored plans in pins/ are such plans).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.fingerprint.identity import plan_id_of
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store import control
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import make_spec

WEEK = PartitionRequest("2024-01-01..2024-01-07")

# The demo data and spec (docs/cli.md's worked example prints the same ids).
DEMO_PLAN_ID = "850fa9cd176d97aa648e5c4e989a0fd88fbe38b471b89fe5de6a09539ff159b9"
DEMO_SNAPSHOT_ID = "copy-1561eec6c4f13358"
DEMO_SNAPSHOT_FINGERPRINT = "8da91574b2019c9ceb29c37413ee01354d687da713a5b96f18b581da33646f0b"

# No moved records, an immutable source and a transform: the other parts of the document.
IMMUTABLE_PLAN_ID = "9c994fae38d02db8a9a8fcb757bac3b377cc39e45b411f1b8ecb987a7e0b007c"
IMMUTABLE_SNAPSHOT_ID = "immutable-3e7dffd6965eaccf"
TRANSFORM = (
    "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
    "upper(status) AS status, note FROM source"
)


def test_the_demo_plan_and_snapshot_ids_are_pinned(demo_db, factory):
    plan = make_plan(make_spec(), WEEK, factory)
    assert plan.status == "ready"
    assert plan.as_json()["snapshot"]["id"] == DEMO_SNAPSHOT_ID
    assert plan.as_json()["snapshot"]["fingerprint"] == DEMO_SNAPSHOT_FINGERPRINT
    assert plan.plan_id == DEMO_PLAN_ID


def test_an_immutable_source_with_a_transform_has_pinned_ids(unmoved_db, factory):
    spec = make_spec(records_can_move=False, source={"table": "public.orders_raw", "snapshot": "immutable"},
                     transform_sql=TRANSFORM, transform_version="upper-v1")
    plan = make_plan(spec, WEEK, factory)
    assert plan.status == "ready"
    assert plan.as_json()["snapshot"]["id"] == IMMUTABLE_SNAPSHOT_ID
    assert plan.plan_id == IMMUTABLE_PLAN_ID


# Stored plans, one per kind of target, pinned without a server: the documents (as plan
# stores them) and their literal ids. A change to the plan document's model, its JSON or how
# ids are hashed fails here in a second. The Delta plan names a fixed path; the Iceberg plan
# its catalog, without a password. They were made before fingerprint format 3 (the postgres
# one is the demo's plan then): they read back whole, and find_plan refuses them.
PINS = Path(__file__).parent / "pins"
STORED_PLAN_IDS = {
    "postgres": "37fbd45a3e9daa857830fba5e14e10b32964cdf83f0c7a9bf16a5b63626f2b3e",
    "delta": "203acbe63f4293e70316120c64adf2b647742e72f985bca531c2eeec7fe1e808",
    "iceberg": "6552fc2d62c3beaf06e9704098cdb3c118e110c104e29348f0bc7586e3f4f97b",
}


@pytest.mark.parametrize("kind", sorted(STORED_PLAN_IDS))
def test_a_stored_plan_reads_back_whole_and_keeps_its_pinned_id(kind):
    stored = json.loads((PINS / f"{kind}_plan.json").read_text(encoding="utf-8"))
    plan = Plan.from_json(stored)  # refuses a document that no longer hashes to its id
    assert plan.plan_id == STORED_PLAN_IDS[kind]
    assert plan.as_json() == stored  # every key, as stored
    document = {k: v for k, v in stored.items() if k not in ("plan_id", "status", "problems")}
    assert plan_id_of(document) == STORED_PLAN_IDS[kind]
    assert plan.document.target == {"postgres": "public.orders_daily", "delta": "delta:/pinned/lake/orders_daily",
                                    "iceberg": "iceberg:default:sales.orders_daily"}[kind]


def test_plans_say_their_fingerprint_format_and_an_older_plan_is_refused_plan_again(demo_db, factory):
    spec = make_spec()
    plan = make_plan(spec, WEEK, factory)
    assert plan.as_json()["fingerprint_format"] == 3
    # The same plan as a version before format 3 stored it: no fingerprint_format, and so
    # another id. It still reads back whole, but nothing it pins can be checked any more.
    older = {k: v for k, v in plan.as_json().items() if k not in ("plan_id", "status", "problems", "fingerprint_format")}
    older_id = plan_id_of(older)
    control.record_plan(demo_db, spec.control_schema, plan_id=older_id, spec_name=spec.name,
                        target_table=spec.target_name, status="ready", snapshot_id=plan.as_json()["snapshot"]["id"],
                        plan={"plan_id": older_id, "status": "ready", "problems": [], **older},
                        created_at=plan_created(demo_db, spec, plan.plan_id))
    assert find_plan(demo_db, spec, plan.plan_id).plan_id == plan.plan_id
    with pytest.raises(ApprovalError, match="made with fingerprint format older than 3.*plan again"):
        find_plan(demo_db, spec, older_id)


def test_a_snapshot_taken_before_format_3_is_neither_found_nor_used(demo_db, factory):
    from psycopg import sql

    from backfill_assets.core.engines.postgres.snapshot import load_snapshot
    from backfill_assets.core.errors import SnapshotError
    from backfill_assets.core.plan import snapshot_covering

    spec = make_spec()
    plan = make_plan(spec, WEEK, factory)
    snapshot_id = plan.as_json()["snapshot"]["id"]
    assert snapshot_covering(demo_db, spec, ["2024-01-01"]) == snapshot_id
    # As a version before format 3 recorded it: no format.
    demo_db.execute(sql.SQL("UPDATE {} SET fingerprint_format = NULL").format(
        sql.Identifier(spec.control_schema, "snapshots")))
    with pytest.raises(SnapshotError, match="taken with fingerprint format older than 3.*take a snapshot again"):
        load_snapshot(demo_db, spec, snapshot_id)
    with pytest.raises(SnapshotError, match="has no snapshot yet"):
        snapshot_covering(demo_db, spec, ["2024-01-01"])


def plan_created(conn, spec, plan_id):
    from psycopg import sql

    return conn.execute(sql.SQL("SELECT created_at FROM {} WHERE plan_id = %(id)s").format(
        sql.Identifier(spec.control_schema, "plans")), {"id": plan_id}).fetchone()[0]
