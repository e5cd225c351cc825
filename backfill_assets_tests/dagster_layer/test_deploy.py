"""The instance files in deploy/ are valid for Dagster 1.13.27: each is loaded as the daemon
loads it (Dagster's instance schema and its concurrency rules), and the configurable classes it
names (the QueuedRunCoordinator, dagster-k8s's K8sRunLauncher) check their own config against
their config schema, as Dagster does before it builds them."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.ref import InstanceRef

from backfill_assets_tests.support.specs import REPO

K8S = REPO / "deploy" / "k8s" / "dagster.yaml"
LOCAL = REPO / "deploy" / "dagster.yaml"
# What the pods' environment provides (ConfigMap dagster-pg-env, Secret dagster-postgresql-secret).
POD_ENV = {"DAGSTER_PG_USERNAME": "dagster", "DAGSTER_PG_PASSWORD": "not-a-secret", "DAGSTER_PG_HOST": "pg",
           "DAGSTER_PG_DB": "dagster", "DAGSTER_PG_URL": "postgresql://dagster@pg/dagster"}


def load_instance(source: Path, home: Path) -> InstanceRef:
    """The instance reference Dagster builds from ``$DAGSTER_HOME/dagster.yaml``, after its
    schema and concurrency checks; raises DagsterInvalidConfigError."""
    home.mkdir(exist_ok=True)
    shutil.copyfile(source, home / "dagster.yaml")
    return InstanceRef.from_dir(str(home))


def class_config_errors(data) -> list[str]:
    """The errors of a configurable class's config against the class's own schema."""
    cls = getattr(importlib.import_module(data.module_name), data.class_name)
    result = process_config(resolve_to_config_type(cls.config_type()), data.config_dict)
    return [] if result.success else [e.message for e in result.errors]


@pytest.fixture
def pod_env(monkeypatch):
    for name, value in POD_ENV.items():
        monkeypatch.setenv(name, value)


def test_the_kubernetes_instance_is_valid_with_a_queued_coordinator_pools_and_the_k8s_launcher(tmp_path, pod_env):
    ref = load_instance(K8S, tmp_path / "home")
    assert (ref.run_coordinator_data.module_name, ref.run_coordinator_data.class_name) == ("dagster", "QueuedRunCoordinator")
    assert (ref.run_launcher_data.module_name, ref.run_launcher_data.class_name) == ("dagster_k8s", "K8sRunLauncher")
    assert class_config_errors(ref.run_coordinator_data) == []
    assert class_config_errors(ref.run_launcher_data) == []
    assert ref.settings["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}
    assert ref.storage_data.module_name == "dagster_postgres"


def test_the_kubernetes_instance_names_variables_and_secrets_never_their_values():
    settings = yaml.safe_load(K8S.read_text(encoding="utf-8"))
    assert settings["storage"]["postgres"]["postgres_db"] == {
        "username": {"env": "DAGSTER_PG_USERNAME"}, "password": {"env": "DAGSTER_PG_PASSWORD"},
        "hostname": {"env": "DAGSTER_PG_HOST"}, "db_name": {"env": "DAGSTER_PG_DB"}, "port": 5432,
    }
    launcher = settings["run_launcher"]["config"]
    assert launcher["postgres_password_secret"] == "dagster-postgresql-secret"  # a Secret's name
    assert "postgresql://" not in K8S.read_text(encoding="utf-8")


def test_a_misspelt_launcher_setting_is_refused_by_the_k8s_schema(tmp_path, pod_env):
    settings = yaml.safe_load(K8S.read_text(encoding="utf-8"))
    settings["run_launcher"]["config"]["job_namespce"] = settings["run_launcher"]["config"].pop("job_namespace")
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(settings), encoding="utf-8")
    errors = class_config_errors(load_instance(broken, tmp_path / "home").run_launcher_data)
    assert any("job_namespce" in e for e in errors), errors


def test_pools_and_run_queue_limits_in_two_places_are_refused_by_dagster(tmp_path, pod_env):
    settings = yaml.safe_load(K8S.read_text(encoding="utf-8"))
    settings["run_coordinator"]["config"] = {"max_concurrent_runs": 5}
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(settings), encoding="utf-8")
    with pytest.raises(DagsterInvalidConfigError, match="max_concurrent_runs"):
        load_instance(broken, tmp_path / "home")


def test_the_local_instance_is_valid_and_queues_runs_per_pool(tmp_path, pod_env):
    ref = load_instance(LOCAL, tmp_path / "home")
    assert ref.storage_data.module_name == "dagster_postgres"
    assert ref.settings["concurrency"]["pools"] == {"granularity": "run", "default_limit": 1}
    assert class_config_errors(ref.run_coordinator_data) == []
