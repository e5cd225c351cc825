"""Pinned identities: the plan id and snapshot id of a fixed source and spec are literal
values here, so that reshaping the plan document, renaming a key of it or changing how ids
are hashed fails loudly instead of orphaning every stored plan and approval.

If one of these changes on purpose, that is a format change: bump PLAN_FORMAT or
SNAPSHOT_FORMAT and say how stored plans and approvals carry over.

History: snapshot v2 (issue 12) hashes a snapshot's rows in an order of their values that is
cheaper to sort and needs no text form for exact types (fingerprint.snapshot_rows_hash);
every snapshot id, and so every plan id, changed with it (docs/fingerprint.md says how
stored plans carry over).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backfill_assets.core.fingerprint.identity import plan_id_of
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import make_spec

WEEK = PartitionRequest("2024-01-01..2024-01-07")

# The demo data and spec (docs/cli.md's worked example prints the same ids).
DEMO_PLAN_ID = "37fbd45a3e9daa857830fba5e14e10b32964cdf83f0c7a9bf16a5b63626f2b3e"
DEMO_SNAPSHOT_ID = "copy-a7ea30bf3a93fed2"
DEMO_SNAPSHOT_FINGERPRINT = "12fc9c7310c05efafb3523bb863976de811299091cbced950c586caf7fe7c7cb"

# No moved records, an immutable source and a transform: the other parts of the document.
IMMUTABLE_PLAN_ID = "a0455b6394af603b8d31408eaa4dd243ecaafb300602631925a3ff3ca143d30d"
IMMUTABLE_SNAPSHOT_ID = "immutable-797aacf7aff696b5"
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
# its catalog, without a password.
PINS = Path(__file__).parent / "pins"
STORED_PLAN_IDS = {
    "postgres": DEMO_PLAN_ID,
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
