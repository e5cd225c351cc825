"""A build engine's Dagster resource is what the engine declares in its folder (``resource`` in
its supports.toml: a key and a dagster-free settings class); the Dagster layer makes the
resource of it, so no engine is named here. No session is started: that is
test_spark_assets'."""

from __future__ import annotations

from backfill_assets.core.supports import SUPPORTS, imported
from backfill_assets.dagster_layer.resources import EngineResource, engine_keys, engine_resource_class, engine_resources
from backfill_assets_tests.support.spec_samples import sample_mapping
from backfill_assets_tests.support.specs import make_spec


def _spark_spec(**engine: object):
    data = sample_mapping("spark", "parquet", "parquet")
    return make_spec(**{k: v for k, v in data.items() if k != "engine"}, engine={"type": "spark", **engine})


def test_the_spark_resource_is_made_of_the_settings_its_folder_declares():
    declared = SUPPORTS["spark"].resource
    settings = imported(declared["settings"])
    made = engine_resource_class("spark")
    assert made is engine_resource_class("spark") and issubclass(made, EngineResource)
    assert made.__name__ == "SparkResource" and made.settings is settings
    assert set(made.model_fields) == set(settings.model_fields)
    assert made().master == settings().master and made().conf == {}


def test_the_code_location_holds_one_resource_per_engine_from_its_first_spec():
    spark = _spark_spec(master="local[1]", conf={"spark.ui.enabled": "false"})
    other = _spark_spec(master="local[3]")
    made = engine_resources([make_spec(), spark, other])
    key = SUPPORTS["spark"].resource["key"]
    assert list(made) == [key] and engine_keys(spark) == {key}
    assert (made[key].master, made[key].conf) == ("local[1]", {"spark.ui.enabled": "false"})
    assert engine_resources([make_spec()]) == {} and engine_keys(make_spec()) == set()


def test_only_an_engine_that_declares_a_resource_gets_one():
    for engine, supports in SUPPORTS.items():
        assert set(supports.resource) in (set(), {"key", "settings"}), engine
        if supports.resource:
            assert callable(imported(supports.resource["settings"]).of)
