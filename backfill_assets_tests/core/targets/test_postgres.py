"""The engine seam: apply's protocol is written once against core.context.Target. These tests
drive it through the PostgreSQL target, wrapped to record (or damage) what the engine does,
on a real database."""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import sys

import pytest

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.engines.postgres.target import PostgresTarget
from backfill_assets.core.errors import VerificationError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.flows import target_hashes
from backfill_assets_tests.support.specs import REPO, make_spec

SPEC = make_spec(records_can_move=False)
DAYS = PartitionRequest("2024-01-01..2024-01-02")


class Recording:
    """A target that records the protocol's calls and may damage what it reads back."""

    def __init__(self, inner: PostgresTarget, calls: list[str], damage_committed: bool = False) -> None:
        self.inner, self.calls, self.damage = inner, calls, damage_committed

    def readings(self, labels):
        return self.inner.readings(labels)

    @contextlib.contextmanager
    def locked(self, labels):
        self.calls.append(f"lock {','.join(labels)}")
        with self.inner.locked(labels):
            yield
        self.calls.append("unlock")

    @contextlib.contextmanager
    def writing(self, labels):
        self.calls.append("begin")
        with self.inner.writing(labels) as write:
            yield _RecordingWrite(write, self.calls)
        self.calls.append("commit")

    def committed_readings(self, labels):
        self.calls.append("read committed")
        found = self.inner.committed_readings(labels)
        if self.damage:
            found = {label: {**r, "content_hash": "0" * 64} for label, r in found.items()}
        return found

    def committed_version(self, labels):
        return self.inner.committed_version(labels)

    def close(self):
        self.calls.append("close")
        self.inner.close()


class _RecordingWrite:
    def __init__(self, write, calls):
        self.write, self.calls = write, calls

    def readings(self, labels):
        self.calls.append("read")
        return self.write.readings(labels)

    def replace(self, labels, note=None):
        self.calls.append("replace")
        self.write.replace(labels, note)


def _approved(conn, factory):
    plan = make_plan(SPEC, DAYS, factory)
    approve_plan(conn, factory, SPEC, find_plan(conn, SPEC, plan.plan_id), "alice")
    return plan


def test_apply_drives_the_target_through_one_protocol_per_partition(unmoved_db, factory):
    plan = _approved(unmoved_db, factory)
    calls: list[str] = []
    result = apply_plan(SPEC, plan.plan_id, factory, run_id="seam",
                        make_target=lambda *a: Recording(PostgresTarget(*a), calls))
    assert [p["status"] for p in result.partitions] == ["verified", "verified"]
    one = ["begin", "read", "replace", "read", "commit", "read committed", "unlock"]
    assert calls == ["lock 2024-01-01", *one, "lock 2024-01-02", *one, "close"]
    # A rerun finds the approved rows under the lock and writes nothing.
    calls.clear()
    apply_plan(SPEC, plan.plan_id, factory, run_id="again", make_target=lambda *a: Recording(PostgresTarget(*a), calls))
    assert "replace" not in calls and calls.count("begin") == 2


def test_a_target_that_reads_back_other_rows_after_its_commit_stops_the_run(unmoved_db, factory):
    plan = _approved(unmoved_db, factory)
    calls: list[str] = []
    with pytest.raises(VerificationError, match="2024-01-01: verification after commit failed"):
        apply_plan(SPEC, plan.plan_id, factory, run_id="damaged",
                   make_target=lambda *a: Recording(PostgresTarget(*a), calls, damage_committed=True))
    assert "lock 2024-01-02" not in calls  # stopped before the next partition
    statuses = dict(unmoved_db.execute(
        "SELECT partition, status FROM backfill_control.ledger WHERE run_id = 'damaged'").fetchall())
    assert statuses == {"2024-01-01": "failed", "2024-01-02": "not-attempted"}
    # The commit itself stands (the engine committed it); the ledger says it failed verification.
    assert target_hashes(unmoved_db, [dt.date(2024, 1, 1)])["2024-01-01"] == plan.approved("2024-01-01")["content_hash"]


def test_the_committed_read_survives_its_connection_dropped_while_idle(unmoved_db, factory):
    """Apply reads committed partitions on one second connection; if the server dropped it
    between two partitions (idle_session_timeout, a proxy), the read opens a new one."""
    from backfill_assets.core.engines.postgres.resolve import resolve

    spec = make_spec(records_can_move=False)
    with factory() as conn:
        ctx = resolve(conn, spec, PartitionRequest("2024-01-01..2024-01-02"))
        target = PostgresTarget(conn, conn, factory, ctx)
        first = target.committed_readings(["2024-01-01"])
        reader = target._reader
        assert reader is not None
        unmoved_db.execute("SELECT pg_terminate_backend(%s)", (reader.info.backend_pid,))
        assert target.committed_readings(["2024-01-01"]) == first
        assert target._reader is not reader
        target.close()


def test_a_postgres_spec_never_loads_the_lake_libraries():
    """The engines are imported when a spec names one: the command line and a PostgreSQL
    spec's engine stay free of pyarrow and the lake libraries (about 50 MiB a process)."""
    probe = ("import sys\nfrom backfill_assets.cli.commands import main\n"
             "from backfill_assets.core.targets import engine_for\n"
             "from backfill_assets_tests.support.specs import make_spec\n"
             "engine = engine_for(make_spec())\n"
             "print(type(engine).__name__, sorted(m for m in ('pyarrow', 'deltalake', 'pyiceberg') if m in sys.modules))")
    found = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert found.stdout.split() == ["PostgresEngine", "[]"]
