"""Each engine declared in its folder: its ``engine`` settings are its own class (a variant of
EngineSpec told apart by ``type``), its rules on the options it takes are data in its
supports.toml (a rule may name the target's format or bound a field of the option), and its
label is its own."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import load_spec
from backfill_assets.core.supports import DEFAULT_ENGINE, SUPPORTS, Rule, capability_table, rule_problems
from backfill_assets_tests.support.spec_samples import PARALLEL, refused_with, sample_mapping


def _written(tmp_path, data: dict[str, object]):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("engine, source, settings", [
    ("postgres", "postgres", {}),
    ("duckdb", "delta", {"database": "stages.duckdb", "memory_limit": "1GB", "threads": 2}),
    ("spark", "parquet", {"master": "local[1]", "conf": {"spark.ui.enabled": "false"}, "staging": "staging"}),
])
def test_a_spec_file_parses_its_engine_into_that_engines_own_class(tmp_path, engine, source, settings):
    data = sample_mapping(engine, source, SUPPORTS[engine].targets[0])
    spec = load_spec(_written(tmp_path, {**data, "engine": {"type": engine, **settings}}))
    assert type(spec.engine) is SUPPORTS[engine].settings_spec
    assert spec.engine.model_dump(exclude_defaults=True) == ({"type": engine, **settings} if settings else {})
    others = {name for e in SUPPORTS.values() if e.engine != engine for name in e.settings}
    assert not others & set(type(spec.engine).model_fields)


def test_a_spec_without_engine_is_on_the_default_engines_class(tmp_path):
    data = sample_mapping("postgres", "postgres", "postgres")
    del data["engine"]
    assert type(load_spec(_written(tmp_path, data)).engine) is SUPPORTS[DEFAULT_ENGINE].settings_spec


def test_a_setting_of_another_engine_in_a_spec_file_is_refused_naming_the_setting_and_its_engine(tmp_path):
    data = {**sample_mapping("duckdb", "delta", "delta"), "engine": {"type": "duckdb", "threads": 2, "master": "local[2]"}}
    with pytest.raises(SpecError) as err:
        load_spec(_written(tmp_path, data))
    assert str(err.value).endswith(
        "is invalid: engine: engine duckdb takes the settings database, memory_limit and threads, not master "
        "(master, conf and staging are settings of `type: spark`)")


def test_a_setting_no_engine_takes_is_refused_as_an_unknown_key():
    refusal = refused_with({**sample_mapping("spark", "parquet", "parquet"), "engine": {"type": "spark", "cores": 4}})
    assert refusal is not None and refusal.endswith("is invalid: engine.cores: Extra inputs are not permitted")


def test_a_rule_naming_the_target_refuses_the_option_with_that_target_only():
    assert refused_with(sample_mapping("spark", "parquet", "parquet", records_can_move=True)) is None
    refusal = refused_with(sample_mapping("spark", "parquet", "spark_table", records_can_move=True))
    rule, = SUPPORTS["spark"].options["records_can_move"].rules
    assert rule.target == "spark_table" and refusal is not None and refusal.endswith(f"spec: {rule.refused}")
    assert rule.refused.startswith("records_can_move needs a Parquet folder target on engine spark: ")


def test_a_rule_bounding_a_field_of_the_option_refuses_it_above_the_bound():
    one, two = ({**PARALLEL, "max_concurrent_builds": n} for n in (1, 2))
    assert refused_with(sample_mapping("duckdb", "delta", "delta", parallel=one)) is None
    refusal = refused_with(sample_mapping("duckdb", "delta", "delta", parallel=two))
    assert refusal is not None and "spec: parallel.max_concurrent_builds must be 1 on engine duckdb: " in refusal


def test_a_rule_added_to_an_engines_allow_list_refuses_what_it_names():
    """The direction of the rule format: a new rule in a supports.toml is all it takes."""
    duckdb = SUPPORTS["duckdb"]
    option = duckdb.options["replace_batch_rows"]
    ruled = dataclasses.replace(option, rules=(Rule(refused="no batches into Iceberg here", target="iceberg"),))
    engine = dataclasses.replace(duckdb, options={**duckdb.options, "replace_batch_rows": ruled})
    assert rule_problems(engine, "iceberg", {"replace_batch_rows": 1000}) == ["no batches into Iceberg here"]
    assert rule_problems(engine, "delta", {"replace_batch_rows": 1000}) == []
    assert rule_problems(engine, "iceberg", {}) == []


def test_the_capability_table_names_each_engine_by_its_own_label():
    header = capability_table().splitlines()[0]
    assert header == "| | " + " | ".join(e.label for e in SUPPORTS.values()) + " |"
    assert header == "| | PostgreSQL | DuckDB | Spark |"
