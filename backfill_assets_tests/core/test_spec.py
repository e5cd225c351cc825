"""Spec validation and partition parsing: every bad input is a clear SpecError."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import subprocess
import sys
import typing

import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import AnySourceSpec, EngineSpec, Spec, TargetSpec, load_spec
from backfill_assets.core.supports import OPTIONS, SUPPORTS, Supports, engine_problems
from backfill_assets.core.vocabulary import PartitionRequest, parse_table_name, partition_label
from backfill_assets_tests.support.spec_samples import (
    OPTION_VALUES,
    PARALLEL,
    SETTING_VALUES,
    SOURCES,
    TARGETS,
    refused_with,
    sample_mapping,
)
from backfill_assets_tests.support.specs import DEMO_SPEC, REPO, make_spec


def test_the_shipped_demo_spec_loads():
    spec = load_spec(REPO / "backfills" / "orders_daily.yaml")
    assert spec.name == "orders_daily"
    assert spec.source_ref.schema == "public" and spec.source_ref.name == "orders_raw"
    assert [o.column for o in spec.ordering] == ["updated_at", "ingest_seq"]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"name": "Orders"}, "name"),
        ({"name": "x" * 41}, "name"),
        ({"database_url_env": "postgresql://u:pw@h/db"}, "NAME of an environment variable"),
        ({"source": {"table": "a.b.c", "snapshot": "copy"}}, "schema.table"),
        ({"source": {"table": "public.orders_raw", "snapshot": "sometimes"}}, "source.snapshot"),
        ({"target": {"table": "public." + "t" * 64}}, "longer than 63 bytes"),
        ({"partition_key": ""}, "may not be empty"),
        ({"partition_key": "order\x00date"}, "NUL"),
        ({"business_key": []}, "business_key"),
        ({"business_key": ["order_id", "order_id"]}, "business_key lists a column twice"),
        ({"business_key": ["order_date"]}, "must not include partition_key"),
        ({"business_key": ["missing"]}, "must be in columns"),
        ({"ordering": []}, "ordering"),
        ({"ordering": [{"column": "updated_at"}]}, "direction"),
        ({"ordering": [{"column": "order_id", "direction": "desc"}]}, "part of the key"),
        ({"columns": ["order_id", "order_id"]}, "columns lists a column twice"),
        ({"columns": ["order_id", "amount"]}, "partition_key 'order_date' must be one of columns"),
        ({"total": "nope"}, "total 'nope' must be one of columns"),
        ({"transform_sql": "  "}, "transform_sql is empty"),
        ({"transform_version": ""}, "transform_version"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
        ({"lock_timeout_ms": 0}, "lock_timeout_ms"),
    ],
)
def test_bad_spec_is_refused_with_a_message_naming_the_problem(changes, message):
    with pytest.raises(SpecError) as err:
        make_spec(**changes)
    assert message in str(err.value)


def test_spec_error_never_echoes_the_value_of_a_misplaced_url():
    with pytest.raises(SpecError) as err:
        make_spec(database_url_env="postgresql://user:s3cret-canary@host/db")
    assert "s3cret-canary" not in str(err.value)


def test_spec_file_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"not valid YAML at line \d+"):
        load_spec(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n", encoding="utf-8")
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        load_spec(scalar)


def test_table_names_default_to_public():
    ref = parse_table_name("orders")
    assert (ref.schema, ref.name) == ("public", "orders")


def test_input_columns_add_ordering_only_columns_after_the_target_columns():
    spec = make_spec(columns=["order_date", "order_id", "amount"], total=None)
    assert spec.input_columns == ["order_date", "order_id", "amount", "updated_at", "ingest_seq"]


def test_date_ranges_are_inclusive_sorted_and_distinct():
    got = PartitionRequest("2024-01-03..2024-01-05, 2024-01-01,2024-01-04").resolve("date")
    assert [partition_label(d) for d in got] == ["2024-01-01", "2024-01-03", "2024-01-04", "2024-01-05"]
    assert PartitionRequest("2024-02-28..2024-03-01").resolve("date")[1] == dt.date(2024, 2, 29)


def test_integer_and_text_partitions():
    assert PartitionRequest("3..5,1").resolve("integer") == [1, 3, 4, 5]
    assert PartitionRequest("eu, us").resolve("text") == ["eu", "us"]


@pytest.mark.parametrize(
    "text, kind, message",
    [
        ("", "date", "empty"),
        ("2024-01-01,,2024-01-02", "date", "empty item"),
        ("2024-13-01", "date", "is not a date"),
        ("2024-01-05..2024-01-01", "date", "ends before it starts"),
        ("1..x", "integer", "is not an integer"),
        ("a..c", "text", "ranges need a date or integer"),
        ("0..100000", "integer", "at most"),
    ],
)
def test_malformed_partitions_are_refused(text, kind, message):
    with pytest.raises(SpecError, match=message):
        PartitionRequest(text).resolve(kind)


def test_the_tests_demo_spec_matches_the_shipped_file():
    shipped = load_spec(REPO / "backfills" / "orders_daily.yaml").model_dump()
    ours = make_spec().model_dump()
    shipped.pop("database_url_env"), ours.pop("database_url_env")
    assert shipped == ours and DEMO_SPEC["name"] == "orders_daily"


@pytest.mark.parametrize(
    "parallel, message",
    [
        ({**PARALLEL, "max_partitions_per_run": 0}, "parallel.max_partitions_per_run: Input should be greater than or equal to 1"),
        ({**PARALLEL, "max_partitions_per_run": 201}, "parallel.max_partitions_per_run: Input should be less than or equal to 200"),
        ({**PARALLEL, "max_partitions_per_run": "2"}, "parallel.max_partitions_per_run: Input should be a valid integer"),
        ({**PARALLEL, "max_concurrent_builds": True}, "parallel.max_concurrent_builds: Input should be a valid integer"),
        ({**PARALLEL, "max_concurrent_builds": 17}, "parallel.max_concurrent_builds: Input should be less than or equal to 16"),
        ({"max_partitions_per_run": 2}, "parallel.max_concurrent_builds: Field required"),
        ({**PARALLEL, "pool": "mine"}, "parallel.pool: Extra inputs are not permitted"),
        (4, "parallel: Input should be a valid dictionary"),
    ],
)
def test_bad_parallel_settings_are_refused_naming_the_field(parallel, message):
    with pytest.raises(SpecError) as err:
        make_spec(records_can_move=None, parallel=parallel)
    assert message in str(err.value)


def test_parallel_with_moving_records_is_refused_saying_what_to_do():
    with pytest.raises(SpecError) as err:
        make_spec(parallel=PARALLEL)  # the demo spec: records_can_move
    assert "parallel cannot be combined with records_can_move" in str(err.value)
    assert "remove `parallel` (one run) or records_can_move" in str(err.value)


def test_parallel_is_optional_and_read_as_declared():
    assert make_spec().parallel is None
    spec = make_spec(records_can_move=None, parallel=PARALLEL)
    assert (spec.parallel.max_partitions_per_run, spec.parallel.max_concurrent_builds) == (2, 2)


# One valid mapping of every source and target format: the walks below take every format the
# spec knows, so a new format needs a line here (test_every_format_has_a_sample).
def _formats(union: object) -> set[str]:
    """The formats a discriminated union of the spec tells apart (its tags)."""
    variants = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(v)[1].tag for v in variants}


def test_every_format_has_a_sample():
    assert _formats(AnySourceSpec) == set(SOURCES)
    assert _formats(TargetSpec) == set(TARGETS)
    assert set(OPTION_VALUES) == set(OPTIONS) and set(SETTING_VALUES) == _settings(EngineSpec)


def _settings(union: object) -> set[str]:
    """Every engine's settings: the fields besides ``type`` of each variant of EngineSpec."""
    variants = typing.get_args(typing.get_args(union)[0])
    return {name for v in variants for name in typing.get_args(v)[0].model_fields} - {"type"}


def test_the_allow_lists_name_only_what_the_spec_knows():
    for engine, supports in SUPPORTS.items():
        assert supports.engine == engine
        assert set(supports.sources) <= set(SOURCES) and set(supports.targets) <= set(TARGETS)
        assert set(supports.options) <= set(OPTIONS)
        assert set(supports.settings) <= _settings(EngineSpec)
        assert supports.settings_spec.model_fields["type"].annotation == typing.Literal[engine]
        for option in supports.options.values():
            assert set(option.needs) <= set(supports.sources)
    assert set(OPTIONS) <= set(Spec.model_fields)


@pytest.mark.parametrize("engine, source, target", list(itertools.product(SUPPORTS, SOURCES, TARGETS)))
def test_exactly_the_combinations_in_supports_load(engine, source, target):
    supports = SUPPORTS[engine]
    refusal = refused_with(sample_mapping(engine, source, target))
    if source in supports.sources and target in supports.targets:
        assert refusal is None
        return
    assert refusal is not None and f"engine {engine}" in refusal
    if source not in supports.sources:
        assert f"source.format is {_listed(supports.sources)}, not {source}" in refusal
    if target not in supports.targets:
        assert f"target.format is {_listed(supports.targets)}, not {target}" in refusal


def _listed(formats: tuple[str, ...]) -> str:
    return formats[0] if len(formats) == 1 else f"{', '.join(formats[:-1])} or {formats[-1]}"


@pytest.mark.parametrize("engine, option", list(itertools.product(SUPPORTS, OPTIONS)))
def test_an_option_loads_exactly_where_its_engine_supports_it(engine, option):
    supports = SUPPORTS[engine]
    taken = supports.options.get(option)
    for source in supports.sources:
        refusal = refused_with(sample_mapping(engine, source, supports.targets[0], **{option: OPTION_VALUES[option]}))
        if taken is not None and not taken.refused and (not taken.needs or source in taken.needs):
            assert refusal is None
        elif taken is not None and taken.refused:
            assert refusal is not None and f"{option} is not supported on engine {engine}" in refusal
            assert taken.refused in refusal
        else:
            assert refusal is not None and f"{option} needs" in refusal and f"on engine {engine}, not {source}" in refusal


@pytest.mark.parametrize("engine, setting", list(itertools.product(SUPPORTS, SETTING_VALUES)))
def test_an_engine_setting_loads_only_on_its_engine(engine, setting):
    supports = SUPPORTS[engine]
    data = sample_mapping(engine, supports.sources[0], supports.targets[0])
    refusal = refused_with({**data, "engine": {"type": engine, setting: SETTING_VALUES[setting]}})
    if setting in supports.settings:
        assert refusal is None
    else:
        owner = next(e for e in SUPPORTS.values() if setting in e.settings)
        assert refusal is not None and f"engine {engine}" in refusal and f"not {setting} (" in refusal
        assert f"settings of `type: {owner.engine}`" in refusal or f"a setting of `type: {owner.engine}`" in refusal


def test_an_unknown_engine_is_refused_naming_the_engines():
    refusal = refused_with({**DEMO_SPEC, "engine": {"type": "polars"}})
    assert refusal is not None and "engine.type: must be postgres (the default), duckdb or spark" in refusal


def test_a_format_missing_from_an_engines_allow_list_is_refused():
    """The direction of the rule: what an engine's Supports does not name is refused, with what
    it does name; a new format is refused everywhere until an engine declares it."""
    without_iceberg = dataclasses.replace(SUPPORTS["duckdb"], targets=("delta",))
    engines = {**SUPPORTS, "duckdb": without_iceberg}
    assert engine_problems(without_iceberg, "delta", "iceberg", (), engines) == [
        ("engine duckdb writes a lake target: target.format is delta, not iceberg (an Iceberg target is written by "
         "the postgres engine: remove `engine`)")]
    assert engine_problems(without_iceberg, "delta", "delta", (), engines) == []
    assert engine_problems(SUPPORTS["duckdb"], "csv", "delta", (), SUPPORTS) == [
        "engine duckdb reads a lake source: source.format is delta, iceberg or parquet, not csv"]


def test_a_new_engine_is_its_allow_list():
    polars = Supports(engine="polars", builds="polars_engine:PolarsBuildEngine", sources=("parquet", "csv"),
                      targets=("delta",), reads="a file source",
                      writes="a Delta table")
    assert engine_problems(polars, "csv", "delta", (), SUPPORTS) == []
    assert engine_problems(polars, "jdbc", "iceberg", ["parallel"], SUPPORTS) == [
        ("engine polars reads a file source: source.format is parquet or csv, not jdbc (a JDBC source is read by "
         "`engine: {type: spark}`)"),
        ("engine polars writes a Delta table: target.format is delta, not iceberg (an Iceberg target is written by "
         "`engine: {type: duckdb}`, or by the postgres engine: remove `engine`)"),
        "parallel is not supported on engine polars: remove it"]


def test_the_spec_imports_no_engine_library():
    heavy = ["pyspark", "duckdb", "pyarrow", "deltalake", "psycopg", "pyiceberg"]
    code = ("import sys, backfill_assets.core.spec; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_every_engine_folder_declares_what_it_supports_and_names_a_whole_build_engine():
    import importlib
    import inspect

    from backfill_assets.core.build import BuildEngine
    from backfill_assets.core.supports import ENGINE_TYPES

    folders = sorted(p.parent.name for p in (REPO / "backfill_assets/core/engines").glob("*/supports.toml"))
    assert folders == sorted(ENGINE_TYPES) == sorted(SUPPORTS)
    asked = {n for n, v in vars(BuildEngine).items() if inspect.isfunction(v) and not n.startswith("_")}
    for engine in ENGINE_TYPES:
        module, _, name = SUPPORTS[engine].builds.partition(":")
        cls = getattr(importlib.import_module(module), name)
        assert asked <= {n for n in dir(cls) if not n.startswith("_")}, engine
        assert callable(cls.opened) and isinstance(cls.REFUSES, dict)
