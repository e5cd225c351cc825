"""Run as ``python -m backfill_assets_tests.support.cluster_flow '<spec as JSON>' [planned]``:
plan the spec's partitions 2024-01-01..2024-01-03, approve, apply, apply again (``planned``:
plan and approve only), in this process (its own Spark driver, on the spec's engine.master);
print what happened as one JSON line."""

from __future__ import annotations

import json
import sys
import uuid

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.pg.db import connection_factory
from backfill_assets.core.pg.embedded import spec_url
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest


def main() -> int:
    spec = spec_from_mapping(json.loads(sys.argv[1]))
    factory = connection_factory(spec_url(spec), spec.limits)
    plan = plan_module.make_plan(spec, PartitionRequest("2024-01-01..2024-01-03"), factory)
    out: dict = {"status": plan.status, "problems": list(plan.problems), "plan_id": plan.plan_id,
                 "hashes": {p.partition: p.stage_a.content_hash for p in plan.document.partitions}}
    if plan.status == "ready":
        with factory() as conn:
            approve_plan(conn, factory, spec, plan, "tester")
    if plan.status == "ready" and sys.argv[2:] != ["planned"]:
        out["applied"] = [p["status"] for p in apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex).partitions]
        out["again"] = [p["status"] for p in apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex).partitions]
        from pyspark.sql import SparkSession
        active = SparkSession.getActiveSession()
        out["master"] = None if active is None else active.conf.get("spark.master", None)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
