"""The demo spec and the names the tests share: the variable the test specs name, a password
that must never appear in any output, the repository root."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill_assets.core.spec import Spec, spec_from_mapping

CANARY = "canary-Pw-7f3e91"  # a password that must never appear in any output


URL_ENV = "BFA_TEST_DATABASE_URL"  # the variable the test specs name
CONTROL_URL_ENV = "BFA_TEST_CONTROL_URL"  # the variable naming a control store of its own


DEMO_SPEC = {
    "name": "orders_daily",
    "database_url_env": URL_ENV,
    "source": {"table": "public.orders_raw", "snapshot": "copy"},
    "target": {"table": "public.orders_daily"},
    "partition_key": "order_date",
    "business_key": ["order_id"],
    "ordering": [
        {"column": "updated_at", "direction": "desc"},
        {"column": "ingest_seq", "direction": "desc"},
    ],
    "columns": ["order_date", "order_id", "customer_id", "updated_at", "ingest_seq", "amount", "status", "note"],
    "total": "amount",
    "records_can_move": True,
    "transform_version": "v1",
    "partitions": {"type": "daily", "start": "2024-01-01", "end": "2024-01-09"},
}


def make_spec(**changes: object) -> Spec:
    """The demo spec with some keys changed (None removes a key)."""
    data = {**DEMO_SPEC, **changes}
    return spec_from_mapping({k: v for k, v in data.items() if v is not None})


REPO = Path(__file__).resolve().parents[2]


def engine_params(names: list[str]) -> list:
    """Parameters of a test run on each engine or target named, those of Spark marked `spark`
    (the test starts its JVM through ``request.getfixturevalue("spark")``, which a marker
    applied from the fixtures it names cannot see)."""
    return [pytest.param(n, marks=pytest.mark.spark) if n.startswith("spark") else n for n in names]
