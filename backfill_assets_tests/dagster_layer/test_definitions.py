"""The code location loads: from workspace.yaml, from BACKFILL_SPECS, with one partitions definition."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from backfill_assets.core.errors import SpecError
from backfill_assets.dagster_layer.definitions import build_definitions, load_specs
from backfill_assets.dagster_layer.partitions import contiguous_segments, partitions_def
from backfill_assets_tests.support.specs import DEMO_SPEC, REPO, make_spec


def test_dagster_definitions_validate_passes_on_the_workspace():
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "BACKFILL_SPECS": "backfills"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All code locations passed validation" in done.stdout + done.stderr


def test_every_asset_of_a_spec_shares_one_partitions_definition():
    defs = build_definitions([make_spec()])
    graph = defs.resolve_asset_graph()
    names = ("snapshot", "stage_a", "stage_b", "target")
    parts = {graph.get(dg.AssetKey(["orders_daily", n])).partitions_def for n in names}
    assert len(parts) == 1 and parts.pop().get_partition_keys()[-1] == "2024-01-08"
    checks = {k.name for k in graph.asset_check_keys}
    assert checks == {"stages_match", "business_key_unique_and_not_null", "target_matches_approved_plan",
                      "target_change_preview", "target_still_verified"}
    assert {j.name for j in defs.jobs} >= {"approve_backfill", "orders_daily__build_stages", "orders_daily__replace_target",
                                           "orders_daily__audit_target"}
    assert {s.name for s in defs.sensors} == {"approval_sensor", "source_snapshot_sensor", "approvals_board"}
    assert {s.name for s in defs.schedules} == {"orders_daily__audit_schedule"}


def test_every_job_runs_its_steps_in_the_run_s_own_process():
    """A run's steps are a chain: one process per run, not one per step (docs/dagster.md)."""
    defs = build_definitions([make_spec()])
    jobs = [defs.resolve_implicit_global_asset_job_def(), *(defs.resolve_job_def(j.name) for j in defs.jobs)]
    assert {j.executor_def.name for j in jobs} == {"in_process"}


def test_specs_load_from_files_and_folders_and_names_must_be_unique(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.yaml").write_text(yaml.safe_dump(DEMO_SPEC))
    other = tmp_path / "two.yaml"
    other.write_text(yaml.safe_dump({**DEMO_SPEC, "name": "orders_again"}))
    specs = load_specs(os.pathsep.join([str(tmp_path / "a"), str(other)]))
    assert [s.name for s in specs] == ["orders_daily", "orders_again"]
    assert len(build_definitions(specs).resolve_asset_graph().get_all_asset_keys()) == 12  # six per spec: source, snapshot, two stages, target, approvals
    with pytest.raises(SpecError, match="two specs share a name"):
        load_specs(os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "a" / "one.yaml")]))
    with pytest.raises(SpecError, match="names .*missing, which does not exist"):
        load_specs(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match="no spec files found"):
        load_specs(str(tmp_path / "empty"))


@pytest.mark.parametrize(
    "partitions, first, last",
    [
        ({"type": "daily", "start": "2024-01-01", "end": "2024-01-04"}, "2024-01-01", "2024-01-03"),
        ({"type": "monthly", "start": "2024-01-01", "end": "2024-04-01"}, "2024-01-01", "2024-03-01"),
        ({"type": "static", "values": ["eu", "us"]}, "eu", "us"),
    ],
)
def test_partitions_definitions_from_the_spec(partitions, first, last):
    keys = partitions_def(make_spec(partitions=partitions)).get_partition_keys()
    assert (keys[0], keys[-1]) == (first, last)


@pytest.mark.parametrize(
    "partitions, message",
    [
        ({"type": "daily"}, "take a `start` date"),
        ({"type": "static", "values": []}, "non-empty `values`"),
        ({"type": "static", "values": ["a", "a"]}, "distinct"),
        ({"type": "monthly", "start": "2024-01-15"}, "first day of a month"),
        ({"type": "daily", "start": "2024-01-05", "end": "2024-01-01"}, "must come after"),
        ({"type": "hourly", "start": "2024-01-01"}, "partitions.type"),
    ],
)
def test_bad_partitions_sections_are_refused(partitions, message):
    with pytest.raises(SpecError, match=message):
        make_spec(partitions=partitions)


def test_a_spec_without_partitions_cannot_become_assets():
    with pytest.raises(SpecError, match="has no `partitions` section"):
        partitions_def(make_spec(partitions=None))


def test_contiguous_segments_follow_the_definition_order():
    parts = partitions_def(make_spec())
    assert contiguous_segments(parts, ["2024-01-05", "2024-01-01", "2024-01-02", "2024-01-08"]) == [
        ["2024-01-01", "2024-01-02"], ["2024-01-05"], ["2024-01-08"]]
    with pytest.raises(SpecError, match="outside the Dagster partitions"):
        contiguous_segments(parts, ["2024-02-01"])
