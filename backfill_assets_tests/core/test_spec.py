"""Spec validation and partition parsing: every bad input is a clear SpecError."""

from __future__ import annotations

import datetime as dt

import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import load_spec
from backfill_assets.core.vocabulary import PartitionRequest, parse_table_name, partition_label
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


PARALLEL = {"max_partitions_per_run": 2, "max_concurrent_builds": 2}


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
