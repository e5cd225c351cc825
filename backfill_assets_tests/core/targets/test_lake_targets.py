"""Delta Lake and Apache Iceberg targets: the whole flow against real tables on local disk,
with the stages in a real PostgreSQL (and, for Iceberg, its SQL catalog there too)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
import yaml

from backfill_assets.core.approve import approve_plan
from backfill_assets.core.errors import ApprovalOutdatedError, SpecError, TransientDatabaseError
from backfill_assets.core.lake.delta import DeltaLakeTable, delta_predicate
from backfill_assets.core.lake.iceberg import IcebergLakeTable
from backfill_assets.core.plan import make_plan
from backfill_assets.core.store import ledger
from backfill_assets.core.store.plans import find_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.flows import ALL_DAYS, approved, run
from backfill_assets_tests.support.lakes import COLUMNS, Lake, expected_rows, lake_spec
from backfill_assets_tests.support.specs import make_spec

FORMATS = ["delta", "iceberg"]








@pytest.mark.parametrize("fmt", FORMATS)
def test_the_whole_flow_creates_fills_verifies_and_reruns_a_lake_table(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec)
    assert plan.status == "ready" and plan.document.creates_target is True
    assert plan.document.target == spec.target_name and plan.document.target_table_columns[5] == ("amount", "decimal128(12, 2)")
    result = run(spec, plan, factory)
    # The empty day is empty already (there is no table yet): nothing to write there.
    statuses = {p["partition"]: p["status"] for p in result.partitions}
    assert statuses.pop("2024-01-05") == "skipped-already-verified" and set(statuses.values()) == {"verified"}
    lake = Lake(fmt, spec, unmoved_db)
    assert lake.rows() == expected_rows(unmoved_db)
    # The ledger and each result name the version committed; the commit carries the plan.
    versions = {p["partition"]: p["target_version"] for p in result.partitions if p["status"] == "verified"}
    assert len(set(versions.values())) == len(versions)
    recorded = unmoved_db.execute(
        "SELECT partition, target_version FROM backfill_control.ledger WHERE run_id = %s AND status = 'verified'",
        (result.run_id,),
    ).fetchall()
    assert dict(recorded) == versions
    meta = lake.commit_metadata()
    assert meta["backfill_assets.plan_id"] == plan.plan_id
    assert meta["backfill_assets.partitions"] == "2024-01-07"
    assert meta["backfill_assets.content_hash"] == plan.approved("2024-01-07")["content_hash"]
    # A rerun writes nothing: every partition already carries the approved fingerprint.
    before = lake.version()
    rerun = run(spec, plan, factory)
    assert {p["status"] for p in rerun.partitions} == {"skipped-already-verified"}
    assert lake.version() == before
    assert {p["target_version"] for p in rerun.partitions} == {before}  # where each was found verified
    # A plan of the same source now finds the table, and says it will not create it.
    again = make_plan(spec, ALL_DAYS, factory)
    assert again.document.creates_target is False
    states = {r["partition"]: r for r in ledger.ledger_status(unmoved_db, spec)}
    assert states["2024-01-01"]["target_version"] == before


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_empty_stage_empties_its_partition_and_other_partitions_are_untouched(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-04"))
    run(spec, plan, factory)
    lake = Lake(fmt, spec, unmoved_db)
    schema = lake.table.open().schema().to_arrow() if fmt == "delta" else lake.table.open().schema().as_arrow()
    at = dt.datetime(2024, 1, 5, tzinfo=dt.timezone.utc)
    stale = [(dt.date(2024, 1, 5), 1, 1, at, 1, None, "stale", "x"),
             (dt.date(2024, 1, 9), 2, 2, at, 2, None, "outside", "y")]
    lake.overwrite(dt.date(2024, 1, 5), stale[:1], pa.schema(schema))
    lake.overwrite(dt.date(2024, 1, 9), stale[1:], pa.schema(schema))
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-05"))  # no source rows
    assert plan.approved("2024-01-05")["row_count"] == 0
    run(spec, plan, factory)
    assert lake.rows(dt.date(2024, 1, 5)) == []
    assert [r[6] for r in lake.rows(dt.date(2024, 1, 9))] == ["outside"]
    assert len(lake.rows(dt.date(2024, 1, 4))) > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_another_writer_of_the_same_partition_makes_our_commit_fail_and_the_rerun_refuse(
        unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    first = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    run(spec, first, factory)  # the table exists
    lake = Lake(fmt, spec, unmoved_db)
    schema = pa.schema(lake.table.open().schema().to_arrow() if fmt == "delta" else lake.table.open().schema().as_arrow())
    unmoved_db.execute("UPDATE public.orders_raw SET note = 'changed' WHERE order_date = '2024-01-02'")
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02,2024-01-03"))
    theirs = [(dt.date(2024, 1, 3), 7, 7, dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc), 7, None, "theirs", "")]

    def other_writer(step: str, labels: list[str]) -> None:
        if step == "before-commit" and labels == ["2024-01-03"]:
            lake.overwrite(dt.date(2024, 1, 3), theirs, schema)  # commits after we read the partition

    with pytest.raises(TransientDatabaseError, match="another writer"):
        run(spec, plan, factory, checkpoint=other_writer)
    assert lake.rows(dt.date(2024, 1, 3)) == theirs  # theirs stands; nothing of ours committed
    assert all(r[7] == "changed" for r in lake.rows(dt.date(2024, 1, 2)))  # the partition before stays
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(unmoved_db, spec)}
    assert states["2024-01-03"] == "failed" and states["2024-01-02"] == "verified"
    # The partition changed since the approval: the approval no longer covers it.
    with pytest.raises(ApprovalOutdatedError):
        run(spec, plan, factory)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_crash_between_partitions_resumes_to_the_rows_of_an_uninterrupted_run(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec)

    def crash(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-03"]:
            raise KeyboardInterrupt  # the process dies after the lake commit, before the ledger

    with pytest.raises(KeyboardInterrupt):
        run(spec, plan, factory, checkpoint=crash)
    rerun = run(spec, plan, factory)
    statuses = {p["partition"]: p["status"] for p in rerun.partitions}
    assert statuses["2024-01-03"] == "skipped-already-verified" and statuses["2024-01-04"] == "verified"
    assert Lake(fmt, spec, unmoved_db).rows() == expected_rows(unmoved_db)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_refused_plan_writes_nothing_to_the_lake(unmoved_db, factory, tmp_path, fmt):
    unmoved_db.execute(
        "CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$"
    )
    transform = ("SELECT order_date, order_id, customer_id + jitter() AS customer_id, updated_at, "
                 "ingest_seq, amount, status, note FROM source")
    spec = lake_spec(fmt, tmp_path, transform_sql=transform,
                     trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}])
    plan = make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert plan.status == "refused"
    with pytest.raises(Exception, match="refused"):
        approve_plan(unmoved_db, factory, spec, find_plan(unmoved_db, spec, plan.plan_id), "alice")
    assert Lake(fmt, spec, unmoved_db).table.open() is None


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_existing_table_that_disagrees_is_refused_before_anything_is_written(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    lake = Lake(fmt, spec, unmoved_db)
    schema = pa.schema([("order_date", pa.date32()), ("order_id", pa.int64()), ("customer_id", pa.int64()),
                        ("updated_at", pa.timestamp("us", tz="UTC")), ("ingest_seq", pa.int64()),
                        ("amount", pa.float64()), ("status", pa.string()), ("note", pa.string())])
    lake.table.create(schema, "order_date")
    with pytest.raises(SpecError, match=r"column amount is double but the stage's is decimal128\(12, 2\)"):
        make_plan(spec, ALL_DAYS, factory)
    assert not unmoved_db.execute("SELECT to_regnamespace('backfill_control') IS NOT NULL").fetchone()[0]


def test_types_without_an_exact_lake_form_are_refused_with_the_reason(unmoved_db, factory, tmp_path):
    transform = ("SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount::numeric AS amount, "
                 "status, note FROM source")
    spec = lake_spec("delta", tmp_path, transform_sql=transform)
    with pytest.raises(SpecError, match="amount") as err:
        make_plan(spec, ALL_DAYS, factory)
    assert "scale" in str(err.value)


def test_the_spec_shape_of_each_lake_format_is_checked():
    with pytest.raises(SpecError, match="delta target takes `location"):
        make_spec(target={"format": "delta", "table": "public.x"}, records_can_move=False)
    with pytest.raises(SpecError, match="namespace.table"):
        make_spec(target={"format": "iceberg", "table": "a.b.c", "catalog": {"type": "sql", "warehouse": "w"}},
                  records_can_move=False)
    with pytest.raises(SpecError, match="NAME of an environment variable"):
        make_spec(target={"format": "iceberg", "table": "a.b", "catalog": {
            "type": "sql", "warehouse": "w", "uri_env": "postgresql://u:secret@h/db"}}, records_can_move=False)
    with pytest.raises(SpecError, match="file:// URI"):
        make_spec(target={"format": "delta", "location": "s3://bucket/x"}, records_can_move=False)


LAKE_SCHEMA = pa.schema([
    ("order_date", pa.date32()), ("order_id", pa.int64()), ("customer_id", pa.int64()),
    ("updated_at", pa.timestamp("us", tz="UTC")), ("ingest_seq", pa.int64()), ("amount", pa.decimal128(12, 2)),
    ("status", pa.string()), ("note", pa.string()),
])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_moved_record_adds_its_partition_and_both_are_replaced_in_one_commit(demo_db, factory, tmp_path, fmt):
    from backfill_assets.cli import demo
    from backfill_assets_tests.support.flows import all_target_rows
    spec = lake_spec(fmt, tmp_path, records_can_move=True)
    lake = Lake(fmt, spec, demo_db)
    # The lake holds what the stale PostgreSQL target holds: the moved keys at their old homes.
    lake.table.create(LAKE_SCHEMA, "order_date")
    stale = demo.stale_target_rows(moved=True)
    for day in sorted({r[0] for r in stale}):
        lake.overwrite(day, [r for r in stale if r[0] == day], LAKE_SCHEMA)
    plan = approved(demo_db, factory, spec, PartitionRequest("2024-01-03"))
    assert [list(g) for g in plan.document.replace_groups] == [["2024-01-03", "2024-01-04"]]
    (added,) = plan.document.added_partitions
    assert added.partition == "2024-01-04" and "moves here from 2024-01-03" in added.reasons[0]
    result = run(spec, plan, factory)
    assert {p["status"] for p in result.partitions} == {"verified"}
    assert len({p["target_version"] for p in result.partitions}) == 1  # one commit for both
    assert lake.commit_metadata()["backfill_assets.partitions"] == "2024-01-03,2024-01-04"
    # The same plan on the PostgreSQL target gives the same rows, and the same fingerprints.
    pg_plan = approved(demo_db, factory, make_spec(), PartitionRequest("2024-01-03"))
    run(make_spec(), pg_plan, factory)
    for day in (dt.date(2024, 1, 3), dt.date(2024, 1, 4)):
        assert lake.rows(day) == all_target_rows(demo_db, day)
        assert pg_plan.approved(day.isoformat()) == plan.approved(day.isoformat())


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_key_in_two_partitions_of_the_lake_is_refused_when_records_can_move(demo_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path, records_can_move=True)
    lake = Lake(fmt, spec, demo_db)
    lake.table.create(LAKE_SCHEMA, "order_date")
    at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2)):
        lake.overwrite(day, [(day, 42, 1, at, 1, None, "twice", "")], LAKE_SCHEMA)
    with pytest.raises(Exception, match="more than one partition") as err:
        make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert "order_id=42" in str(err.value)


def test_an_iceberg_catalog_url_comes_only_from_its_variable_and_is_never_printed(
        unmoved_db, factory, url_env, password_role, tmp_path, monkeypatch, capsys):
    from backfill_assets.cli.commands import main
    from backfill_assets_tests.support.specs import CANARY
    spec = make_spec(target={"format": "iceberg", "table": "sales.orders_daily", "catalog": {
        "type": "sql", "warehouse": str(tmp_path / "warehouse"), "uri_env": "ICE_URL"}}, records_can_move=False)
    monkeypatch.setenv("ICE_URL", password_role)  # a role whose password is not CANARY
    with pytest.raises(Exception) as err:
        make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert err.value.__class__.__name__ == "ConnectionConfigError"
    assert "Iceberg catalog in $ICE_URL" in str(err.value) and "password authentication failed" in str(err.value)
    assert CANARY not in str(err.value) and err.value.__cause__ is None and err.value.__context__ is None
    # The command line says the same, exit 3, without the password.
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    code = main(["inspect", "--spec", str(path)])
    out, errtext = capsys.readouterr()
    assert code == 3 and CANARY not in out + errtext and "$ICE_URL" in errtext


def test_values_a_lake_cannot_hold_refuse_the_plan_naming_partition_and_column(unmoved_db, factory, tmp_path):
    unmoved_db.execute("UPDATE public.orders_raw SET updated_at = 'infinity' WHERE order_date = '2024-01-02'")
    transform = ("SELECT order_date, order_id, customer_id, updated_at, ingest_seq, "
                 "CASE WHEN order_date = '2024-01-03' THEN 'NaN'::numeric(12,2) ELSE amount END AS amount, "
                 "status, note FROM source")
    spec = lake_spec("delta", tmp_path, transform_sql=transform)
    plan = make_plan(spec, ALL_DAYS, factory)
    assert plan.status == "refused"
    problems = " | ".join(plan.problems)
    assert "partition 2024-01-02: column updated_at has" in problems
    assert "partition 2024-01-03: column amount has" in problems and "2024-01-01" not in problems
    assert Lake("delta", spec, unmoved_db).table.open() is None


@pytest.mark.parametrize("value", [
    "host=h password='my SECRETPW", "host=h password SECRETPW", "postgresql://u:%zzSECRETPW@h/db",
    "postgresql+psycopg://u:SECRET PW@h:notaport/db",
])
def test_a_malformed_catalog_url_is_refused_without_quoting_it(unmoved_db, url_env, tmp_path, monkeypatch, capsys, value):
    from backfill_assets.cli.commands import main
    spec = make_spec(target={"format": "iceberg", "table": "sales.orders_daily", "catalog": {
        "type": "sql", "warehouse": str(tmp_path / "warehouse"), "uri_env": "ICE_URL"}}, records_can_move=False)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True)))
    monkeypatch.setenv("ICE_URL", value)
    code = main(["inspect", "--spec", str(path)])
    out, err = capsys.readouterr()
    assert code == 3 and "$ICE_URL" in err
    assert "SECRET" not in out + err


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_existing_table_that_could_refuse_the_rows_at_commit_is_refused_at_plan(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    lake = Lake(fmt, spec, unmoved_db)
    required = pa.schema([f.with_nullable(f.name != "order_id") for f in LAKE_SCHEMA])
    lake.table.create(required, "order_date")
    if fmt == "delta":
        lake.table.open().alter.add_constraint({"positive_amount": "amount > 0"})
    with pytest.raises(SpecError) as err:
        make_plan(spec, ALL_DAYS, factory)
    assert "column order_id may not be NULL" in str(err.value)
    if fmt == "delta":
        assert "constraint positive_amount CHECK" in str(err.value)


def test_a_lake_failure_mid_run_is_recorded_and_stops_before_the_next_partition(unmoved_db, factory, tmp_path):
    spec = lake_spec("delta", tmp_path)
    run(spec, approved(unmoved_db, factory, spec, PartitionRequest("2024-01-01")), factory)  # the table exists
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02..2024-01-04"))
    lake = Lake("delta", spec, unmoved_db)

    def constrain(step: str, labels: list[str]) -> None:
        if step == "before-commit" and labels == ["2024-01-03"]:  # another writer adds a constraint
            lake.table.open().alter.add_constraint({"small": "amount < 1"})

    from backfill_assets.core.errors import BackfillError
    with pytest.raises(BackfillError) as err:
        run(spec, plan, factory, checkpoint=constrain)
    assert "2024-01-03" in str(err.value) and "Traceback" not in str(err.value)
    states = {r["partition"]: r for r in ledger.ledger_status(unmoved_db, spec)}
    assert states["2024-01-02"]["status"] == "verified" and states["2024-01-03"]["status"] == "failed"
    assert states["2024-01-04"]["status"] == "not-attempted" and states["2024-01-03"]["error"]
    assert lake.rows(dt.date(2024, 1, 3)) == []  # nothing of ours committed there


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_lake_table_missing_its_files_is_a_clear_error_before_any_write(unmoved_db, factory, tmp_path, fmt):
    from backfill_assets.core.errors import LakeTargetError
    spec = lake_spec(fmt, tmp_path)
    run(spec, approved(unmoved_db, factory, spec, PartitionRequest("2024-01-01")), factory)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-01..2024-01-02"))
    for parquet in tmp_path.rglob("*.parquet"):
        parquet.unlink()
    with pytest.raises((LakeTargetError, SpecError)) as err:
        run(spec, plan, factory)
    assert "Traceback" not in str(err.value) and "orders_daily" in str(err.value)


def test_iceberg_rows_outside_the_partition_are_refused_before_anything_is_committed(unmoved_db, tmp_path):
    from backfill_assets.core.errors import VerificationError
    spec = lake_spec("iceberg", tmp_path)
    lake = Lake("iceberg", spec, unmoved_db)
    lake.table.create(LAKE_SCHEMA, "order_date")
    at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    rows = [(dt.date(2024, 1, 1), 1, 1, at, 1, None, "in", ""), (dt.date(2024, 1, 2), 2, 2, at, 2, None, "out", "")]
    data = pa.Table.from_pylist([dict(zip(COLUMNS, r)) for r in rows], schema=LAKE_SCHEMA)
    # pyiceberg itself would write the second row into 2024-01-02 (it does not refuse rows
    # outside the overwrite filter).
    with pytest.raises(VerificationError, match="1 row\\(s\\) outside"):
        lake.table.overwrite(lake.table.open(), "order_date", [dt.date(2024, 1, 1)], data, {})
    assert lake.version() is None and lake.rows() == []


def test_a_delta_commit_that_is_not_our_overwrite_of_our_partition_fails_the_log_check(unmoved_db, tmp_path):
    from backfill_assets.core.errors import VerificationError
    from backfill_assets.core.lake.delta_log import check_commit
    from backfill_assets.core.lake.tables import META_PREFIX
    spec = lake_spec("delta", tmp_path)
    lake = Lake("delta", spec, unmoved_db)
    lake.table.create(LAKE_SCHEMA, "order_date")
    at = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
    lake.overwrite(dt.date(2024, 1, 9), [(dt.date(2024, 1, 9), 1, 1, at, 1, None, "theirs", "")], LAKE_SCHEMA)
    version = int(lake.version())
    ours = [dt.date(2024, 1, 3)]
    with pytest.raises(VerificationError, match="touching 2024-01-09"):
        check_commit(lake.table.path, lake.table.name, version, "order_date", ours,
                     delta_predicate("order_date", ours), {META_PREFIX + "plan_id": "p" * 64})


def test_a_plan_names_one_delta_table_wherever_apply_runs(unmoved_db, factory, tmp_path, monkeypatch):
    from backfill_assets.core.errors import ApprovalError
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    spec = make_spec(target={"format": "delta", "location": "lake/orders"}, records_can_move=False)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-01"))
    assert plan.document.target == f"delta:{tmp_path / 'a' / 'lake' / 'orders'}"
    monkeypatch.chdir(tmp_path / "b")  # the same spec, run from elsewhere, names another table
    with pytest.raises(ApprovalError, match="target"):
        run(spec, plan, factory)
    assert not (tmp_path / "b" / "lake").exists() and not (tmp_path / "a" / "lake").exists()


def test_an_empty_text_partition_is_refused_for_delta_before_anything_is_written():
    with pytest.raises(SpecError, match="stores '' as a NULL partition value"):
        delta_predicate("region", [""])
    assert delta_predicate("region", ["it's"]) == '"region" = \'it\'\'s\''


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_writer_right_after_our_create_fails_our_first_commit_and_keeps_its_rows(
        unmoved_db, factory, tmp_path, fmt, monkeypatch):
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-03"))
    cls = DeltaLakeTable if fmt == "delta" else IcebergLakeTable
    create = cls.create
    at = dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc)
    theirs = [(dt.date(2024, 1, 3), 7, 7, at, 7, None, "theirs", "")]

    def create_then_another_writer(self, schema, partition_key, windowing=None):
        created = create(self, schema, partition_key, windowing)
        Lake(fmt, spec, unmoved_db).overwrite(dt.date(2024, 1, 3), theirs, LAKE_SCHEMA)
        return created

    monkeypatch.setattr(cls, "create", create_then_another_writer)
    with pytest.raises(TransientDatabaseError, match="right after this run created it"):
        run(spec, plan, factory)
    assert Lake(fmt, spec, unmoved_db).rows(dt.date(2024, 1, 3)) == theirs


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_check_after_commit_reads_our_version_whatever_was_committed_since(unmoved_db, factory, tmp_path, fmt):
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02..2024-01-03"))
    lake = Lake(fmt, spec, unmoved_db)
    at = dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc)
    theirs = [(dt.date(2024, 1, 3), 7, 7, at, 7, None, "theirs", "")]
    versions = []

    def later_writer(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-03"]:  # after our commit, before our check
            versions.append(lake.version())
            lake.overwrite(dt.date(2024, 1, 3), theirs, LAKE_SCHEMA)

    result = run(spec, plan, factory, checkpoint=later_writer)
    ours = {p["partition"]: p for p in result.partitions}["2024-01-03"]
    assert ours["status"] == "verified" and ours["target_version"] == versions[0] != lake.version()
    assert lake.rows(dt.date(2024, 1, 3)) == theirs


def test_an_iceberg_table_with_snapshot_isolation_is_refused(unmoved_db, factory, tmp_path):
    spec = lake_spec("iceberg", tmp_path)
    lake = Lake("iceberg", spec, unmoved_db)
    lake.table.create(LAKE_SCHEMA, "order_date")
    with lake.table.open().transaction() as txn:
        txn.set_properties({"write.delete.isolation-level": "snapshot"})
    with pytest.raises(SpecError, match="write.delete.isolation-level = snapshot"):
        make_plan(spec, ALL_DAYS, factory)


def test_a_delta_column_invariant_is_refused(unmoved_db, factory, tmp_path):
    import json
    spec = lake_spec("delta", tmp_path)
    invariant = json.dumps({"expression": {"expression": "ingest_seq < 5"}})
    schema = pa.schema([f.with_metadata({"delta.invariants": invariant}) if f.name == "ingest_seq" else f
                        for f in LAKE_SCHEMA])
    Lake("delta", spec, unmoved_db).table.create(schema, "order_date")
    with pytest.raises(SpecError, match="invariant on column ingest_seq"):
        make_plan(spec, ALL_DAYS, factory)


def test_an_iceberg_plan_names_its_catalog_and_a_sqlite_catalog_works(unmoved_db, factory, tmp_path, monkeypatch):
    from backfill_assets.core.errors import ApprovalError
    spec = make_spec(target={"format": "iceberg", "table": "sales.orders_daily", "catalog": {
        "type": "sql", "warehouse": str(tmp_path / "warehouse"), "uri_env": "ICE_URL"}}, records_can_move=False)
    monkeypatch.setenv("ICE_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    assert plan.document.creates_target and "staging.db" in plan.document.target_catalog
    monkeypatch.setenv("ICE_URL", f"sqlite:///{tmp_path / 'prod.db'}")  # another catalog, same names
    with pytest.raises(ApprovalError, match="target_catalog"):
        run(spec, plan, factory)
    monkeypatch.setenv("ICE_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    assert {p["status"] for p in run(spec, plan, factory).partitions} == {"verified"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_diff_against_a_lake_target_is_exact_key_by_key(unmoved_db, factory, tmp_path, fmt):
    from backfill_assets.core.approve import review
    from backfill_assets.core.diff import diff_plan
    spec = lake_spec(fmt, tmp_path)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    before = diff_plan(spec, plan.plan_id, factory).partitions[0]  # no table yet: every key is added
    assert (before.added, before.removed, before.changed, before.unchanged) == (plan.approved("2024-01-02")["row_count"], 0, 0, 0)
    run(spec, plan, factory)
    lake = Lake(fmt, spec, unmoved_db)
    rows = lake.rows(dt.date(2024, 1, 2))
    first, second = rows[0], rows[1]
    at = dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc)
    edited = [first[:7] + (first[7] + "!",), *rows[2:], (dt.date(2024, 1, 2), 1, 1, at, 1, None, "extra", "")]
    lake.overwrite(dt.date(2024, 1, 2), edited, LAKE_SCHEMA)  # second removed; one changed; one extra
    (part,) = diff_plan(spec, plan.plan_id, factory).partitions
    assert (part.added, part.removed, part.changed, part.unchanged) == (1, 1, 1, len(rows) - 2)
    kinds = {(e.kind, e.key["order_id"]): e for e in part.examples}
    assert kinds[("changed", str(first[1]))].values == {"note": [first[7], first[7] + "!"]}
    assert ("added", str(second[1])) in kinds and ("removed", "1") in kinds
    with factory() as conn:
        assert review(conn, factory, spec, plan.plan_id).changes == {
            "2024-01-02": {"added": 1, "removed": 1, "changed": 1, "unchanged": len(rows) - 2}}


def test_diff_against_a_lake_keeps_values_a_stage_type_would_trim_and_counts_a_repeated_key_once(
        unmoved_db, factory, tmp_path):
    from backfill_assets.core.approve import review
    from backfill_assets.core.diff import diff_plan
    transform = ("SELECT order_date, order_id, customer_id, updated_at::timestamptz(0) AS updated_at, ingest_seq, "
                 "amount, status::varchar(9) AS status, note FROM source")
    spec = lake_spec("delta", tmp_path, transform_sql=transform)
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    run(spec, plan, factory)
    lake = Lake("delta", spec, unmoved_db)
    rows = lake.rows(dt.date(2024, 1, 2))
    a, b, c = rows[0], rows[1], rows[2]
    schema = pa.schema([f if f.name != "updated_at" else pa.field("updated_at", pa.timestamp("us", tz="UTC"))
                        for f in LAKE_SCHEMA])
    edited = [
        a[:6] + (a[6] + " ",) + a[7:],  # a trailing space varchar(9) would keep, but...
        b[:6] + ("much longer than nine",) + b[7:],  # ...too long for varchar(9)
        c[:3] + (c[3] + dt.timedelta(microseconds=123456),) + c[4:],  # rounded by timestamptz(0)
        *rows[3:], rows[3],  # and one key twice
    ]
    lake.overwrite(dt.date(2024, 1, 2), edited, schema)
    (part,) = diff_plan(spec, plan.plan_id, factory, limit=10).partitions
    assert (part.added, part.removed, part.changed, part.unchanged) == (0, 0, 4, len(rows) - 4)
    changed = {e.key["order_id"]: e.columns for e in part.examples}
    assert changed[str(a[1])] == ["status"] and changed[str(b[1])] == ["status"]
    assert changed[str(c[1])] == ["updated_at"] and str(rows[3][1]) in changed
    with factory() as conn:
        assert review(conn, factory, spec, plan.plan_id).changes["2024-01-02"]["changed"] == 4


# --- With records_can_move, a business key keeps one home across the lake table -----------------


def one_home_setup(unmoved_db, factory, tmp_path, fmt):
    """A lake table with its first day replaced, and an approved plan of 2024-01-02 with
    records_can_move; its first row (a key the plan writes), and the test's Lake."""
    spec = lake_spec(fmt, tmp_path, records_can_move=True)
    run(spec, approved(unmoved_db, factory, spec, PartitionRequest("2024-01-01")), factory)  # the table exists
    plan = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    ours = next(r for r in expected_rows(unmoved_db) if r[0] == dt.date(2024, 1, 2))
    return spec, plan, ours, Lake(fmt, spec, unmoved_db)


ELSEWHERE = dt.date(2024, 1, 6)  # a partition the plan does not write


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_key_of_ours_put_into_another_partition_after_the_plan_refuses_the_write(unmoved_db, factory, tmp_path, fmt):
    from backfill_assets.core.errors import KeysElsewhereError
    spec, plan, ours, lake = one_home_setup(unmoved_db, factory, tmp_path, fmt)
    lake.overwrite(ELSEWHERE, [(ELSEWHERE, *ours[1:])], LAKE_SCHEMA)  # another writer: our key, elsewhere
    before = lake.version()
    with pytest.raises(KeysElsewhereError) as err:
        run(spec, plan, factory)
    # Nothing committed: the table is at the other writer's version, our partition still empty.
    assert lake.version() == before and lake.rows(dt.date(2024, 1, 2)) == []
    assert isinstance(err.value, ApprovalOutdatedError) and err.value.exit_code == 6 and not err.value.retryable
    assert err.value.elsewhere == ("2024-01-06",) and err.value.count == 1 and err.value.version == before
    assert err.value.partitions == ("2024-01-02",) and list(err.value.reasons) == ["2024-01-02"]
    text = str(err.value)
    assert f"order_id={ours[1]} in 2024-01-06" in text and "Plan again" in text and "Nothing was written" in text
    states = {r["partition"]: r for r in ledger.ledger_status(unmoved_db, spec)}
    assert states["2024-01-02"]["status"] == "failed" and "2024-01-06" in states["2024-01-02"]["error"]
    # Planning again moves the key: its partition joins the write, and the key has one home.
    again = approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02"))
    assert [list(g) for g in again.document.replace_groups] == [["2024-01-02", "2024-01-06"]]
    assert {p["status"] for p in run(spec, again, factory).partitions} == {"verified"}
    assert [r for r in lake.rows() if r[1] == ours[1]] == [ours]


@pytest.mark.parametrize("other_key", [None, 999_999], ids=["no-other-writer", "a-key-not-ours"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_guarded_write_applies_when_no_key_of_ours_lies_elsewhere(
        unmoved_db, factory, tmp_path, fmt, other_key, monkeypatch):
    spec, plan, ours, lake = one_home_setup(unmoved_db, factory, tmp_path, fmt)
    if other_key is not None:  # another writer, elsewhere, with a key the plan does not write
        lake.overwrite(ELSEWHERE, [(ELSEWHERE, other_key, *ours[2:])], LAKE_SCHEMA)
    before = lake.version()
    cls = DeltaLakeTable if fmt == "delta" else IcebergLakeTable
    reads, keys_elsewhere = [], cls.keys_elsewhere
    monkeypatch.setattr(cls, "keys_elsewhere", lambda self, *a: reads.append(a) or keys_elsewhere(self, *a))
    result = run(spec, plan, factory)
    assert [p["status"] for p in result.partitions] == ["verified"] and lake.version() != before
    # One read of the keys, before the commit: the commit followed that version directly, so
    # there is nothing to read again after it.
    assert len(reads) == 1
    assert lake.rows(dt.date(2024, 1, 2)) == [r for r in expected_rows(unmoved_db) if r[0] == dt.date(2024, 1, 2)]
    assert [r[1] for r in lake.rows(ELSEWHERE)] == ([] if other_key is None else [other_key])


def _writer_before_our_commit(monkeypatch, fmt, act, rebase=False):
    """Run ``act`` (another writer) right before our overwrite commits: after the key check.
    ``rebase``: stand for an engine that rebases our commit over theirs all the same."""
    cls = DeltaLakeTable if fmt == "delta" else IcebergLakeTable
    overwrite = cls.overwrite

    def another_writer_first(self, handle, column, values, data, metadata, exclusive=False):
        act()
        return overwrite(self, handle, column, values, data, metadata, exclusive and not rebase)

    monkeypatch.setattr(cls, "overwrite", another_writer_first)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_commit_to_another_partition_between_the_key_check_and_ours_fails_ours(
        unmoved_db, factory, tmp_path, fmt, monkeypatch):
    from backfill_assets.core.errors import KeysElsewhereError
    spec, plan, ours, lake = one_home_setup(unmoved_db, factory, tmp_path, fmt)
    versions = []

    def theirs() -> None:
        lake.overwrite(ELSEWHERE, [(ELSEWHERE, *ours[1:])], LAKE_SCHEMA)
        versions.append(lake.version())

    _writer_before_our_commit(monkeypatch, fmt, theirs)
    # Both engines would rebase our commit over theirs (another partition); exclusive, it fails.
    with pytest.raises(TransientDatabaseError, match="had to follow directly"):
        run(spec, plan, factory)
    assert lake.version() == versions[0] and lake.rows(dt.date(2024, 1, 2)) == []
    monkeypatch.undo()
    with pytest.raises(KeysElsewhereError, match="2024-01-06"):  # the retry finds their key
        run(spec, plan, factory)
    assert lake.version() == versions[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_engine_that_rebased_our_commit_all_the_same_is_caught_after_the_commit(
        unmoved_db, factory, tmp_path, fmt, monkeypatch):
    from backfill_assets.core.errors import VerificationError
    spec, plan, ours, lake = one_home_setup(unmoved_db, factory, tmp_path, fmt)
    theirs = [(ELSEWHERE, *ours[1:])]
    _writer_before_our_commit(monkeypatch, fmt, lambda: lake.overwrite(ELSEWHERE, theirs, LAKE_SCHEMA), rebase=True)
    with pytest.raises(VerificationError, match="business key check after the commit") as err:
        run(spec, plan, factory)
    # Committed (the engine rebased it), and said loudly: the partition failed, naming the key.
    assert f"order_id={ours[1]} in 2024-01-06" in str(err.value) and "Plan again" in str(err.value)
    assert sorted(r[0] for r in lake.rows() if r[1] == ours[1]) == [dt.date(2024, 1, 2), ELSEWHERE]
    states = {r["partition"]: r["status"] for r in ledger.ledger_status(unmoved_db, spec)}
    assert states["2024-01-02"] == "failed"


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_key_check_reads_keys_in_a_null_partition_and_every_key_column(tmp_path, fmt):
    from sqlalchemy.engine import make_url

    from backfill_assets.core.lake.tables import keys_found
    table = (DeltaLakeTable(str(tmp_path / "t")) if fmt == "delta" else
             IcebergLakeTable("s.t", "default", str(tmp_path / "w"), make_url(f"sqlite:///{tmp_path / 'c.db'}")))
    schema = pa.schema([("p", pa.string()), ("a", pa.int64()), ("b", pa.string())])
    table.create(schema, "p")
    assert keys_found(table.keys_elsewhere(table.open(), "p", ["x"], pa.table({"a": [1], "b": ["k"]})), "p",
                      ["a", "b"]) is None  # an empty table
    rows = pa.table({"p": ["x", None, "y", "z", "y"], "a": [1, 2, 3, 1, 9], "b": ["k", "k", "k", "j", "zz"]},
                    schema=schema)
    if fmt == "delta":
        from deltalake import write_deltalake
        write_deltalake(table.path, rows, mode="append")
    else:
        table.open().append(rows)
    keys = pa.table({"a": pa.array([1, 2, 3, 9], pa.int64()), "b": ["k", "k", "q", "zz"]})
    found = keys_found(table.keys_elsewhere(table.open(), "p", ["x"], keys), "p", ["a", "b"])
    # (1, k) lies only in x (ours); (2, k) in the NULL partition; (3, q) nowhere; (1, j) is
    # not ours; (9, zz) in y, at the top of both key ranges.
    assert found is not None and found.partitions == ["NULL", "y"] and found.count == 2
    assert found.examples == ["a=2, b=k in NULL", "a=9, b=zz in y"]
    table.close()


# --- The Iceberg catalog name -------------------------------------------------------------------


def iceberg_spec(tmp_path, name: str | None = None, warehouse: str = "warehouse", **catalog: Any):
    named = {"name": name} if name is not None else {}
    return make_spec(target={"format": "iceberg", "table": "sales.orders_daily", "catalog": {
        "type": "sql", "warehouse": str(tmp_path / warehouse), **named, **catalog}}, records_can_move=False)


def test_a_table_the_tool_creates_is_found_by_pyiceberg_given_the_catalog_uri_alone(
        unmoved_db, factory, tmp_path, monkeypatch):
    from pyiceberg.catalog import load_catalog
    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    monkeypatch.setenv("ICE_URL", uri)
    spec = iceberg_spec(tmp_path, uri_env="ICE_URL")
    run(spec, approved(unmoved_db, factory, spec, PartitionRequest("2024-01-02")), factory)
    catalog = load_catalog(uri=uri)  # no name: pyiceberg's own default
    data = catalog.load_table("sales.orders_daily").scan().to_arrow().select(COLUMNS)
    assert sorted((tuple(r.values()) for r in data.to_pylist()), key=lambda r: r[1]) == [
        r for r in expected_rows(unmoved_db) if r[0] == dt.date(2024, 1, 2)]
    assert catalog.name == "default" and spec.target_name == "iceberg:default:sales.orders_daily"


def test_a_table_under_another_catalog_name_is_refused_not_created_again_beside_it(unmoved_db, factory, tmp_path):
    former = iceberg_spec(tmp_path, name="backfill_assets")  # the name this tool used to default to
    run(former, approved(unmoved_db, factory, former, PartitionRequest("2024-01-02")), factory)
    with pytest.raises(SpecError, match="under the catalog name 'backfill_assets', not under 'default'") as err:
        make_plan(iceberg_spec(tmp_path), PartitionRequest("2024-01-02"), factory)
    assert "target.catalog.name: backfill_assets" in str(err.value)
    assert not Lake("iceberg", iceberg_spec(tmp_path), unmoved_db).table.catalog().table_exists("sales.orders_daily")
    # The name set in the spec still finds it; another warehouse is another table.
    assert make_plan(former, PartitionRequest("2024-01-02"), factory).document.creates_target is False
    assert make_plan(iceberg_spec(tmp_path, warehouse="other"), PartitionRequest("2024-01-02"),
                     factory).document.creates_target is True
