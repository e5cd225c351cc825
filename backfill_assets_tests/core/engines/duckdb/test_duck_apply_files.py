"""Apply on DuckDB into a Delta table, as files: DuckDB writes each partition's Parquet file
from stage A and fingerprints it, delta-rs commits exactly those files, and the committed
version's files are proved by their bytes (core.engines.duckdb.target). Real tables on disk,
a real DuckDB, the real control store; the data of the other DuckDB tests."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from backfill_assets.core import plan as plan_module
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.duck_lakes import (
    COLUMNS,
    DAYS,
    LABELS,
    REWRITES,
    delta_rows,
    delta_source,
    duck_spec,
    newest,
    one_row_short,
    source_table,
    write_delta,
)


def _approved(spec: Any, factory: Any, request: PartitionRequest = DAYS) -> Any:
    plan = plan_module.make_plan(spec, request, factory)
    assert plan.status == "ready", plan.problems
    with factory() as conn:
        approve_plan(conn, factory, spec, plan, "tester")
    return plan


def _log(table: Path) -> list[list[dict[str, Any]]]:
    """Every commit of a Delta table's log, as its actions, oldest first."""
    commits = sorted((table / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
            for p in commits]


def _target_rows(spec: Any, factory: Any, tmp_path: Path) -> pa.Table:
    """The target's rows as its own library reads them."""
    if spec.target.format == "delta":
        from deltalake import DeltaTable
        return DeltaTable(str(tmp_path / "orders_daily")).to_pyarrow_table()
    from pyiceberg.catalog.sql import SqlCatalog

    from backfill_assets.core.lake.iceberg_catalog import catalog_url
    with factory() as conn:
        catalog = SqlCatalog("default", uri=catalog_url(conn, spec), warehouse=f"file://{tmp_path / 'warehouse'}",
                             init_catalog_tables="false")
    return catalog.load_table("sales.orders_daily").scan().to_arrow()


def _data_files(table: Path) -> set[str]:
    return {str(p.relative_to(table)) for p in table.rglob("*.parquet")}


def test_each_partition_is_the_file_duckdb_wrote_committed_as_it_was_fingerprinted(tmp_path, factory, url_env):
    spec = duck_spec(tmp_path, delta_source(tmp_path))
    plan = _approved(spec, factory)
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    target = tmp_path / "orders_daily"
    commits = _log(target)[1:]  # after the table's creation: one commit per partition
    assert len(commits) == 3
    added = []
    for label, actions in zip(LABELS, commits):
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        assert info["operation"] == "WRITE" and info["operationParameters"]["mode"] == "Overwrite"
        assert info["backfill_assets.plan_id"] == plan.plan_id
        assert not [a for a in actions if "metaData" in a or "protocol" in a]  # the table's schema untouched
        adds = [a["add"] for a in actions if "add" in a]
        assert len(adds) == 1 and adds[0]["partitionValues"] == {"order_date": label}
        assert re.fullmatch(rf"order_date={label}/part-00000-{plan.plan_id[:16]}-[0-9a-f-]{{36}}\.c000\.parquet",
                            adds[0]["path"])
        assert json.loads(adds[0]["stats"])["numRecords"] == plan.document.partitions[LABELS.index(label)].stage_a.row_count
        added.append(adds[0]["path"])
    assert _data_files(target) == set(added)  # nothing written that was not committed
    # The files carry no partition column (the log does), and delta-rs reads them as the rows.
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert delta_rows(target, day) == newest(rows, day)
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
    assert len(_log(target)) == 4


def test_a_run_stopped_after_the_files_are_written_leaves_none_behind_and_the_rerun_converges(tmp_path, factory,
                                                                                          url_env):
    spec = duck_spec(tmp_path, delta_source(tmp_path))
    plan = _approved(spec, factory)
    target = tmp_path / "orders_daily"

    def stop(step: str, labels: list[str]) -> None:
        if step == "before-commit" and labels == ["2024-01-02"]:
            raise KeyboardInterrupt  # after the file of 2024-01-02 was written and fingerprinted

    with pytest.raises(KeyboardInterrupt):
        apply_plan(spec, plan.plan_id, factory, run_id="run-1", checkpoint=stop)
    from deltalake import DeltaTable
    table = DeltaTable(str(target))
    assert _data_files(target) == {uri.removeprefix(f"{target}/") for uri in table.file_uris()}
    assert {r["order_date"] for r in table.to_pyarrow_table().to_pylist()} == {dt.date(2024, 1, 1)}
    rerun = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in rerun.partitions] == ["skipped-already-verified", "verified", "verified"]


@pytest.mark.parametrize("how", REWRITES)
def test_the_committed_files_are_proved_by_their_bytes_and_one_rewritten_after_the_commit_is_caught(
        tmp_path, factory, url_env, monkeypatch, how):
    """The files the log commits are the files DuckDB wrote and fingerprinted: the verification
    after the commit proves them by their names, sizes and SHA-256, without reading a row again.
    A committed file another writer rewrites before that verification (removed and written
    anew under its name, or written over) has other bytes: its rows are fingerprinted, and the
    verification fails."""
    from backfill_assets.core.engines.duckdb.target import DuckLakeTarget
    from backfill_assets.core.errors import VerificationError
    spec = duck_spec(tmp_path, delta_source(tmp_path))
    plan = _approved(spec, factory)
    fingerprinted: list[list[str]] = []
    real = DuckLakeTarget.files_readings

    def recorded(self, files):
        fingerprinted.extend(list(paths) for paths in files.values())
        return real(self, files)

    monkeypatch.setattr(DuckLakeTarget, "files_readings", recorded)
    first = apply_plan(spec, plan.plan_id, factory, run_id="run-1", only=["2024-01-01"])
    assert [p["status"] for p in first.partitions] == ["verified"]
    written = [paths for paths in fingerprinted if paths]
    assert len(written) == 1  # the file written, before the commit; not again after it
    fingerprinted.clear()
    target = tmp_path / "orders_daily"

    def rewrite(step: str, labels: list[str]) -> None:
        if step == "committed":
            victim, = (target / "order_date=2024-01-02").glob("*.parquet")
            one_row_short(victim, how)

    with pytest.raises(VerificationError, match="verification after commit"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-2", only=["2024-01-02"], checkpoint=rewrite)
    assert len([paths for paths in fingerprinted if paths]) == 2  # before the commit, and after it by rows


@pytest.mark.parametrize("target", ["delta", "iceberg"])
def test_awkward_text_partition_values_make_folders_every_reader_finds(tmp_path, factory, url_env, target):
    """A text partition key whose values need escaping in a folder name and in the log's URI."""
    from deltalake import write_deltalake
    regions = ["a b", "x:y", "100%", "é/ü", "it's", "%41"]
    base = source_table().filter(pa.compute.is_valid(source_table()["order_id"]))
    parts = []
    for i, region in enumerate(regions):
        part = base.slice(i * 3, 3)
        parts.append(part.append_column("region", pa.array([region] * part.num_rows)))
    data = pa.concat_tables(parts)
    write_deltalake(str(tmp_path / "orders_raw"), data, partition_by=["region"])
    spec = duck_spec(tmp_path, {"format": "delta", "location": str(tmp_path / "orders_raw")},
                     partition_key="region", columns=["region", *COLUMNS[1:]],
                     partitions={"type": "static", "values": regions}, target=target)
    plan = _approved(spec, factory, PartitionRequest(",".join(regions)))
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert {p["status"] for p in result.partitions} == {"verified"}
    written = _target_rows(spec, factory, tmp_path)
    for region in regions:
        got = sorted(r["order_id"] for r in written.to_pylist() if r["region"] == region)
        want = sorted({r["order_id"] for r in data.to_pylist() if r["region"] == region})
        assert got == want, region
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert {p["status"] for p in again.partitions} == {"skipped-already-verified"}


def test_a_table_with_a_change_feed_is_written_through_delta_rs(tmp_path, factory, url_env):
    """Plain files would leave a change feed without its changes: such a table goes through
    delta-rs's own writer, which writes them, and is still verified."""
    from deltalake import DeltaTable
    spec = duck_spec(tmp_path, delta_source(tmp_path))
    plan = _approved(spec, factory)
    schema = pa.schema([(f.name, f.type) for f in source_table().schema])
    DeltaTable.create(str(tmp_path / "orders_daily"), schema, partition_by=["order_date"],
                      configuration={"delta.enableChangeDataFeed": "true"})
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    commits = _log(tmp_path / "orders_daily")[1:]
    infos = [next(a["commitInfo"] for a in actions if "commitInfo" in a) for actions in commits]
    # write_deltalake's overwrite by a predicate, not a commit of our files.
    assert len(infos) == 3 and all(i["operationParameters"].get("predicate") for i in infos), infos


def _iceberg_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, evolve: str | None) -> dict[str, Any]:
    """The test's rows in an Iceberg table; ``evolve``: its ``note`` column renamed from an older
    name, or its ``customer_id`` promoted from int, after the files were written."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.types import LongType
    catalog = SqlCatalog("default", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/src_wh")
    catalog.create_namespace("raw")
    data = source_table()
    if evolve == "renamed":
        data = data.rename_columns([("remark" if c == "note" else c) for c in data.column_names])
    if evolve == "promoted":
        data = data.set_column(2, pa.field("customer_id", pa.int32()), data["customer_id"].cast(pa.int32()))
    table = catalog.create_table("raw.orders_raw", schema=data.schema)
    table.append(data)
    if evolve == "renamed":
        with table.update_schema() as update:
            update.rename_column("remark", "note")
    if evolve == "promoted":
        with table.update_schema() as update:
            update.update_column("customer_id", LongType())
    monkeypatch.setenv("BFA_TEST_ICEBERG_SOURCE", f"sqlite:///{tmp_path}/cat.db")
    return {"format": "iceberg", "table": "raw.orders_raw",
            "catalog": {"type": "sql", "uri_env": "BFA_TEST_ICEBERG_SOURCE", "warehouse": str(tmp_path / "src_wh")}}


@pytest.mark.parametrize("evolve", [None, "renamed", "promoted"])
def test_an_iceberg_source_gives_the_rows_of_its_snapshot_whether_duckdb_or_pyiceberg_reads_it(
        tmp_path, factory, url_env, monkeypatch, evolve):
    """DuckDB reads an Iceberg snapshot's files itself when they are the rows as they stand; a
    column renamed or promoted since the files were written is read by pyiceberg's scan. Both
    give the fingerprints of the same rows read from a Delta table."""
    from backfill_assets.core.pinned import iceberg as sources
    read_by = []
    plain = sources.plain_iceberg_files

    def watched(*args: Any) -> list[str] | None:
        found = plain(*args)
        read_by.append("duckdb" if found is not None else "pyiceberg")
        return found

    monkeypatch.setattr(sources, "plain_iceberg_files", watched)
    (tmp_path / "ice").mkdir()
    (tmp_path / "dl").mkdir()
    from_iceberg = plan_module.make_plan(duck_spec(tmp_path / "ice", _iceberg_source(tmp_path, monkeypatch, evolve)),
                                         DAYS, factory)
    from_delta = plan_module.make_plan(duck_spec(tmp_path / "dl", delta_source(tmp_path / "dl")), DAYS, factory)
    assert from_iceberg.status == "ready", from_iceberg.problems
    assert set(read_by) == {"duckdb" if evolve is None else "pyiceberg"}
    assert [(p.partition, p.stage_a.as_dict()) for p in from_iceberg.document.partitions] == \
        [(p.partition, p.stage_a.as_dict()) for p in from_delta.document.partitions]


def test_a_stage_change_its_seal_misses_is_caught_before_the_commit(tmp_path, factory, url_env, monkeypatch):
    """The seal is a 64-bit sum, not proof against a forged change: with every seal taken as
    holding, a change made to stage A under the partition lock is still refused, by the
    fingerprint of the file written from it, before anything is committed."""
    from backfill_assets.core.engines.duckdb import database
    from backfill_assets.core.engines.duckdb import engine as duck_engine
    from backfill_assets.core.errors import VerificationError
    spec = duck_spec(tmp_path, delta_source(tmp_path))
    plan = _approved(spec, factory)
    monkeypatch.setattr(duck_engine, "seals_hold", lambda *args: [])  # a seal that always holds
    target = tmp_path / "orders_daily"

    def forge(step: str, labels: list[str]) -> None:
        if step == "locked" and labels == ["2024-01-02"]:
            (db, _), = database._opened.values()
            db.cursor().execute("UPDATE orders_daily__stage_a SET note = upper(note) WHERE order_id = 900001")

    with pytest.raises(VerificationError, match="verification before commit"):
        apply_plan(spec, plan.plan_id, factory, run_id="run-1", checkpoint=forge)
    from deltalake import DeltaTable
    table = DeltaTable(str(target))
    assert {r["order_date"] for r in table.to_pyarrow_table().to_pylist()} == {dt.date(2024, 1, 1)}
    assert _data_files(target) == {uri.removeprefix(f"{target}/") for uri in table.file_uris()}


def test_an_iceberg_partition_is_the_file_duckdb_wrote_added_in_one_commit(tmp_path, factory, url_env):
    from pyiceberg.catalog.sql import SqlCatalog
    spec = duck_spec(tmp_path, delta_source(tmp_path), target="iceberg")
    plan = _approved(spec, factory)
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    from backfill_assets.core.lake.iceberg_catalog import catalog_url
    with factory() as conn:
        catalog = SqlCatalog("default", uri=catalog_url(conn, spec), warehouse=f"file://{tmp_path / 'warehouse'}",
                             init_catalog_tables="false")
    table = catalog.load_table("sales.orders_daily")
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert len(files) == 3 and all(
        re.search(rf"/data/order_date=2024-01-0[123]/00000-{plan.plan_id[:16]}-[0-9a-f-]{{36}}\.parquet$", f)
        for f in files), files
    # One append snapshot per partition (nothing to delete in a new table), each carrying the plan.
    plans = [s.summary.additional_properties.get("backfill_assets.plan_id") for s in table.snapshots()]
    assert plans == [plan.plan_id] * 3
    rows = [tuple(r[c] for c in COLUMNS) for r in source_table().to_pylist()]
    got = table.scan().to_arrow().select(COLUMNS).to_pylist()
    for day in (dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)):
        assert sorted((tuple(r[c] for c in COLUMNS) for r in got if r["order_date"] == day),
                      key=lambda r: r[1]) == newest(rows, day)
    again = apply_plan(spec, plan.plan_id, factory, run_id="run-2")
    assert [p["status"] for p in again.partitions] == ["skipped-already-verified"] * 3
    # A later version of the source replaces one partition: its file deleted, the new one added.
    late = (dt.date(2024, 1, 2), 900001, 5, dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), 9, None, "late", "x")
    write_delta(tmp_path / "orders_raw", source_table([late]), mode="append")
    second = _approved(spec, factory, PartitionRequest("2024-01-02"))
    assert [p["status"] for p in apply_plan(spec, second.plan_id, factory, run_id="run-3").partitions] == ["verified"]
    table = catalog.load_table("sales.orders_daily")
    now = [task.file.file_path for task in table.scan().plan_files()]
    assert len(now) == 3 and len(set(now) - set(files)) == 1 and second.plan_id[:16] in (set(now) - set(files)).pop()
    got = {r["order_id"]: r["status"] for r in table.scan().to_arrow().to_pylist() if r["order_date"] == late[0]}
    assert got[900001] == "late" and len(got) == len(newest(rows + [late], late[0]))


def test_an_iceberg_target_whose_name_mapping_disagrees_is_written_by_pyiceberg(tmp_path, factory, url_env):
    """Files with column names are read through the table's name mapping: one that maps a name
    to another field id would have readers see NULLs where our check saw values, so such a
    table is written by pyiceberg's own overwrite (field ids in its files)."""
    import json as json_module

    from pyiceberg.catalog.sql import SqlCatalog

    from backfill_assets.core.lake.iceberg_catalog import catalog_url
    spec = duck_spec(tmp_path, delta_source(tmp_path), target="iceberg")
    plan = _approved(spec, factory)
    with factory() as conn:
        catalog = SqlCatalog("default", uri=catalog_url(conn, spec), warehouse=f"file://{tmp_path / 'warehouse'}")
    catalog.create_namespace("sales")
    from pyiceberg.transforms import IdentityTransform
    table = catalog.create_table("sales.orders_daily", schema=source_table().schema)
    with table.update_spec() as update:
        update.add_field("order_date", IdentityTransform(), "order_date")
    ids = {f.name: f.field_id for f in table.schema().fields}
    stale = [{"field-id": ids[n] if n != "note" else 999, "names": [n]} for n in ids]
    with table.transaction() as txn:
        txn.set_properties(**{"schema.name-mapping.default": json_module.dumps(stale)})
    result = apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert [p["status"] for p in result.partitions] == ["verified"] * 3
    table = catalog.load_table("sales.orders_daily")
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert files and not [f for f in files if plan.plan_id[:16] in f]
    notes = {r["order_id"]: r["note"] for r in table.scan().to_arrow().to_pylist()}
    assert notes[900003] == "x" * 5000
