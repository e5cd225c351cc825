"""replace_batch_rows: consecutive small partitions replaced in one transaction, each still
verified on its own, a failure rolling back its whole batch and stopping the run."""

from __future__ import annotations

import pytest

from backfill_assets.core.apply import MAX_BATCH_PARTITIONS, apply_plan, batched
from backfill_assets.core.errors import SpecError, VerificationError
from backfill_assets.core.store import ledger
from backfill_assets_tests.support.duck_lakes import duck_spec
from backfill_assets_tests.support.flows import DAYS8, approved, run, target_day_hashes
from backfill_assets_tests.support.specs import make_spec


def test_a_batch_is_one_transaction_and_each_partition_is_verified(demo_db, factory):
    spec = make_spec(replace_batch_rows=1_000_000)
    plan = approved(demo_db, factory, spec)
    seen = []
    result = run(spec, plan, factory, checkpoint=lambda step, labels: seen.append((step, list(labels))))
    assert [p["status"] for p in result.partitions] == ["verified"] * 8
    # One lock, one write and one commit for the eight partitions.
    assert [s for s, _ in seen] == ["locked", "deleted", "inserted", "before-commit", "committed", "verified"]
    assert seen[0][1] == [d.isoformat() for d in DAYS8]
    hashes = target_day_hashes(demo_db)
    assert all(hashes[p["partition"]] == p["content_hash"] for p in result.partitions)
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(demo_db, spec)}
    assert states == {d.isoformat(): "verified" for d in DAYS8}


def test_a_failure_rolls_back_its_whole_batch_and_stops_before_the_next(demo_db, factory):
    rows = {p.partition: p.stage_a.row_count for p in approved(demo_db, factory, make_spec()).document.partitions}
    # Batches of about half the rows: the first holds 2024-01-01 and 2024-01-02.
    spec = make_spec(replace_batch_rows=rows["2024-01-01"] + rows["2024-01-02"])
    plan = approved(demo_db, factory, spec)
    before = target_day_hashes(demo_db)
    demo_db.execute(
        "CREATE FUNCTION public.skew() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.order_date = '2024-01-02' THEN NEW.amount := NEW.amount + 0.01; END IF; RETURN NEW; END $$")
    demo_db.execute("CREATE TRIGGER skew BEFORE INSERT ON public.orders_daily FOR EACH ROW EXECUTE FUNCTION public.skew()")
    with pytest.raises(VerificationError) as err:
        run(spec, plan, factory)
    # The failing partition is named; its batch, 2024-01-01 included, is rolled back.
    assert err.value.partition == "2024-01-02" and err.value.step == "verification before commit"
    assert target_day_hashes(demo_db) == before
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(demo_db, spec)}
    assert states["2024-01-01"] == states["2024-01-02"] == "failed"
    assert {states[d.isoformat()] for d in DAYS8[2:]} == {"not-attempted"}


def test_batches_follow_the_plan_order_and_their_limits():
    class Plan:
        def __init__(self, rows):
            self.rows = rows

        def approved(self, label):
            return {"row_count": self.rows[label]}

    plan = Plan({"a": 5, "b": 5, "c": 20, "d": 1, "e": 1})
    groups = [["a"], ["b"], ["c"], ["d", "e"]]
    assert batched(groups, plan, 0) == groups
    assert batched(groups, plan, 10) == [["a", "b"], ["c"], ["d", "e"]]  # a group larger than a batch stands alone
    assert batched(groups, plan, 100) == [["a", "b", "c", "d", "e"]]
    many = Plan({str(n): 1 for n in range(MAX_BATCH_PARTITIONS + 1)})
    assert [len(b) for b in batched([[str(n)] for n in range(MAX_BATCH_PARTITIONS + 1)], many, 10**6)] == [
        MAX_BATCH_PARTITIONS, 1]


def test_replace_batch_rows_is_refused_where_a_partition_is_its_own_commit(tmp_path):
    from backfill_assets_tests.support.spark_lakes import spark_spec
    with pytest.raises(SpecError, match="replace_batch_rows is not supported on engine spark"):
        spark_spec(tmp_path, {"format": "parquet", "location": str(tmp_path / "src")}, replace_batch_rows=1000)
    with pytest.raises(SpecError, match="replace_batch_rows"):
        make_spec(replace_batch_rows=-1)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_small_lake_partitions_are_replaced_in_one_commit_each_verified(tmp_path, factory, url_env, monkeypatch, fmt):
    """engine duckdb: three small partitions in one batch are one lake commit; each is verified
    at that commit, and a rerun finds them all in place."""
    from backfill_assets.core.approve import approve_plan
    from backfill_assets.core.plan import make_plan
    from backfill_assets_tests.support.duck_lakes import DAYS, LakeSource, source_table
    source = LakeSource("delta", tmp_path, monkeypatch)
    source.write(source_table())
    spec = duck_spec(tmp_path, source.spec, target=fmt, replace_batch_rows=100_000)
    plan = make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    assert len({p["target_version"] for p in result.partitions}) == 1  # one commit for the batch
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
