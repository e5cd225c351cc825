"""A sample of every source and target format and of every option and engine setting, as a
spec's YAML gives them; the spec's tests and the capability table's build specs from them."""

from __future__ import annotations

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets_tests.support.specs import DEMO_SPEC

PARALLEL = {"max_partitions_per_run": 2, "max_concurrent_builds": 2}
CATALOG = {"type": "sql", "warehouse": "warehouse"}
SOURCES = {
    "postgres": {"format": "postgres", "table": "public.orders_raw", "snapshot": "copy"},
    "delta": {"format": "delta", "location": "lake/orders_raw"},
    "iceberg": {"format": "iceberg", "table": "lake.orders_raw", "catalog": CATALOG},
    "parquet": {"format": "parquet", "location": "lake/orders_raw"},
    "jdbc": {"format": "jdbc", "table": "public.orders_raw", "url_env": "BFA_TEST_JDBC_URL"},
    "spark_table": {"format": "spark_table", "table": "lake.orders_raw"},
}
TARGETS = {
    "postgres": {"format": "postgres", "table": "public.orders_daily"},
    "delta": {"format": "delta", "location": "lake/orders_daily"},
    "iceberg": {"format": "iceberg", "table": "lake.orders_daily", "catalog": CATALOG},
    "parquet": {"format": "parquet", "location": "lake/orders_daily"},
    "spark_table": {"format": "spark_table", "table": "lake.orders_daily"},
}
OPTION_VALUES = {"records_can_move": True, "parallel": {**PARALLEL, "max_concurrent_builds": 1}, "replace_batch_rows": 1000,
                 "trusted_functions": [{"name": "public.f", "reason": "its result depends on its argument alone"}],
                 "partition_window": {"every": "day", "time_zone": "UTC"},
                 "inputs": {"customers": {"table": "public.customers"}}}
SETTING_VALUES = {"database": "stages.duckdb", "memory_limit": "1GB", "threads": 2, "master": "local[1]",
                  "conf": {"spark.ui.enabled": "false"}, "staging": "staging"}


def sample_mapping(engine: str, source: str, target: str, **changes: object) -> dict[str, object]:
    """The demo spec on ``engine``, reading the sample ``source`` into the sample ``target``
    (with time windows, its Dagster partitions are those windows; with other inputs, a
    transform joins one)."""
    windows = {"partitions": {"type": "window", "start": "2024-01-01"}} if changes.get("partition_window") else {}
    # Other inputs are read by a transform, in the source's exported snapshot.
    inputs = {"transform_sql": "SELECT s.* FROM source AS s JOIN customers AS c USING (customer_id)"} \
        if changes.get("inputs") else {}
    given = {**SOURCES[source], "snapshot": "exported"} if inputs and source == "postgres" else SOURCES[source]
    return {**DEMO_SPEC, "records_can_move": False, "engine": {"type": engine}, "source": given,
            "target": TARGETS[target], **windows, **inputs, **changes}


def refused_with(data: dict[str, object]) -> str | None:
    """The message a spec mapping is refused with (None: it loads)."""
    try:
        spec_from_mapping(data)
    except SpecError as err:
        return str(err)
    return None
