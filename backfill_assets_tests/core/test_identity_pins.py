"""Pinned identities: the plan id and snapshot id of a fixed source and spec are literal
values here, so that reshaping the plan document, renaming a key of it or changing how ids
are hashed fails loudly instead of orphaning every stored plan and approval.

If one of these changes on purpose, that is a format change: bump PLAN_FORMAT or
SNAPSHOT_FORMAT and say how stored plans and approvals carry over.
"""

from __future__ import annotations

from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import PartitionRequest
from backfill_assets_tests.conftest import make_spec

WEEK = PartitionRequest("2024-01-01..2024-01-07")

# The demo data and spec (README's worked example prints the same ids).
DEMO_PLAN_ID = "fb7a9c17c7b85f5f300e7166d44ffca0b88c56fa1e829b85d7c7543679a93b72"
DEMO_SNAPSHOT_ID = "copy-7519995fda8b30f3"
DEMO_SNAPSHOT_FINGERPRINT = "ff8dfb59f4dda16ecfe7767e93be2173a5333a511055a6230e217c5e6463e514"

# No moved records, an immutable source and a transform: the other parts of the document.
IMMUTABLE_PLAN_ID = "82fd125f8f1fd4fda170712113b3fd47a937cf16c8bec90a6191ae945f602d94"
IMMUTABLE_SNAPSHOT_ID = "immutable-68d1879fd789b46d"
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
