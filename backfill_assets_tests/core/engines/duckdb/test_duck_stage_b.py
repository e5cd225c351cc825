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
from backfill_assets_tests.support.duck_lakes import DAYS, delta_source, duck_spec


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


def test_a_stage_b_that_differs_is_kept_and_its_keys_shown(tmp_path, factory, url_env, delta_source, monkeypatch):
    spec = duck_spec(tmp_path, delta_source)
    plan_module.make_plan(spec, DAYS, factory)  # a first plan: stage B unwritten everywhere
    real = statements.build_select

    def oldest_wins_in_b(variant, relation, columns, partition_key, business_key, ordering, **kw):
        # A stage B that keeps each key's oldest version: it differs wherever a key has two.
        if variant == "b":
            ordering = [o.model_copy(update={"direction": "asc" if o.direction == "desc" else "desc"})
                        for o in ordering]
        return real(variant, relation, columns, partition_key, business_key, ordering, **kw)

    monkeypatch.setattr(statements, "build_select", oldest_wins_in_b)
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
