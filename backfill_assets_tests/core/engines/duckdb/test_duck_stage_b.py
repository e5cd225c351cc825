"""Stage B on DuckDB, hashed as it is built against a real Delta source and the real control
store: not written while it equals stage A, and built again from the same pin and kept where
it differs, so that the differing keys can be shown; the stage checks read it either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.engines.duckdb import statements
from backfill_assets.core.stages import read_stages
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import DAYS, LakeSource, delta_source, duck_spec, source_table


@pytest.fixture(name="delta_source")
def _delta_source(tmp_path: Path) -> dict[str, Any]:
    return delta_source(tmp_path)


def _stage_rows(tmp_path: Path, variant: str) -> dict[str, int]:
    import duckdb
    with duckdb.connect(str(tmp_path / "stages.duckdb")) as con:
        found = con.execute(f"SELECT CAST(order_date AS VARCHAR), count(*) FROM orders_daily__stage_{variant} "
                            "GROUP BY order_date").fetchall()
        return dict(found)


def _kept(conn, variant: str) -> dict[str, bool | None]:
    return dict(conn.execute(
        "SELECT partition, kept FROM backfill_control.stage_builds WHERE spec_name = 'orders_daily' "
        "AND variant = %s", (variant,)).fetchall())


def test_stages_that_agree_leave_stage_b_unwritten_and_the_stage_checks_match(tmp_path, factory, url_env, delta_source):
    spec = duck_spec(tmp_path, delta_source)
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    assert _stage_rows(tmp_path, "b") == {}
    assert _stage_rows(tmp_path, "a") == {p.partition: p.stage_a.row_count for p in plan.document.partitions}
    with factory() as conn:
        assert set(_kept(conn, "b").values()) == {False} and set(_kept(conn, "a").values()) == {True}
    states = read_stages(spec, plan.labels, factory)
    assert all(s.match and s.plan_id == plan.plan_id for s in states), [s.problems for s in states]
    assert [s.b for s in states] == [p.stage_b for p in plan.document.partitions]


def _oldest_wins_in_b(monkeypatch) -> None:
    """A stage B that keeps each key's oldest version: it differs wherever a key has two."""
    real = statements.build_select

    def reversed_in_b(variant, relation, columns, partition_key, business_key, ordering, **kw):
        if variant == "b":
            ordering = [o.model_copy(update={"direction": "asc" if o.direction == "desc" else "desc"})
                        for o in ordering]
        return real(variant, relation, columns, partition_key, business_key, ordering, **kw)

    monkeypatch.setattr(statements, "build_select", reversed_in_b)


def test_a_moved_key_s_stage_b_is_rebuilt_from_every_partition_of_the_scope(tmp_path, factory, url_env, monkeypatch):
    """records_can_move: a key's version is chosen across the scope's partitions, so the
    rebuild that keeps a differing stage B partition reads all of them, as the hashed build
    did, and shows only the keys that differ. Order 5's newest version is on day 2, an older
    one on day 3; stage B alone changes order 7 (day 3): only day 3 differs, and a rebuild
    that read day 3 alone would put order 5 there and name it too."""
    import datetime as dt
    import decimal

    from psycopg import sql
    t0, t1 = (dt.datetime(2024, 1, d, 8, tzinfo=dt.timezone.utc) for d in (1, 5))

    def row(day: int, key: int, when: dt.datetime, seq: int) -> tuple:
        return (dt.date(2024, 1, day), key, 1, when, seq, decimal.Decimal("1.00"), "s", None)

    source = LakeSource("delta", tmp_path, monkeypatch)
    source.write(source_table([row(1, 6, t0, 1), row(3, 5, t0, 2), row(2, 5, t1, 3), row(3, 7, t0, 4)]))
    spec = duck_spec(tmp_path, source.spec, records_can_move=True)
    real = statements.build_select

    def order_7_changed_in_b(variant, relation, columns, partition_key, business_key, ordering, **kw):
        if variant == "b":
            relation = sql.SQL(
                "(SELECT order_date, order_id, customer_id + CASE WHEN order_id = 7 THEN 1 ELSE 0 END AS customer_id, "
                "updated_at, ingest_seq, amount, status, note FROM {} AS x)").format(relation)
        return real(variant, relation, columns, partition_key, business_key, ordering, **kw)

    monkeypatch.setattr(statements, "build_select", order_7_changed_in_b)
    plan = plan_module.make_plan(spec, PartitionRequest("2024-01-01..2024-01-03"), factory)
    assert plan.status == "refused"
    assert [p.partition for p in plan.document.partitions if not p.match] == ["2024-01-03"]
    (shown,) = [p for p in plan.problems if p.startswith("partition 2024-01-03: first differing key(s)")]
    assert shown.endswith("stage A against stage B: order_id=7"), shown


def test_a_stage_b_that_differs_is_kept_and_its_keys_shown(tmp_path, factory, url_env, delta_source, monkeypatch):
    spec = duck_spec(tmp_path, delta_source)
    plan_module.make_plan(spec, DAYS, factory)  # a first plan: stage B unwritten everywhere
    _oldest_wins_in_b(monkeypatch)
    plan = plan_module.make_plan(spec, DAYS, factory)
    assert plan.status == "refused"
    differing = [p.partition for p in plan.document.partitions if not p.match]
    assert differing, "the reversed order should differ where a key has several versions"
    shown = " ".join(plan.problems)
    for label in differing:
        assert f"partition {label}: first differing key(s), stage A against stage B: order_id=" in shown
    with factory() as conn:
        kept = _kept(conn, "b")
    assert {label for label, k in kept.items() if k} == set(differing)
    # The refused plan removed the differing partitions from both stages; the rest of B was never written.
    assert _stage_rows(tmp_path, "b") == {}
