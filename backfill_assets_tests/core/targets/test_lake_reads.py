"""A lake partition is read from its own files, and a version read back is loaded once: the
cost of reading one partition does not grow with the table. Real Delta and Iceberg tables
on disk (an SQLite catalog for Iceberg, as pyiceberg ships)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from backfill_assets.core.lake.delta import DeltaLakeTable, delta_predicate
from backfill_assets.core.lake.iceberg import IcebergLakeTable

pytestmark = pytest.mark.lake

DAYS = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(30)]
SCHEMA = pa.schema([("d", pa.date32()), ("k", pa.int64()), ("note", pa.string())])


def day_rows(day: dt.date, n: int = 3, note: str = "v1") -> pa.Table:
    return pa.table({"d": [day] * n, "k": list(range(n)), "note": [f"{note} {day}"] * n}, schema=SCHEMA)


def delta_table(tmp_path) -> DeltaLakeTable:
    from deltalake import write_deltalake
    table = DeltaLakeTable(str(tmp_path / "t"))
    table.create(SCHEMA, "d")
    for day in DAYS:  # one commit and one file per day, then a second version of every day
        write_deltalake(table.path, day_rows(day), mode="append")
    for day in DAYS:
        write_deltalake(table.path, day_rows(day, note="v2"), mode="overwrite", predicate=delta_predicate("d", [day]))
    return table


def delta_loads(monkeypatch) -> list:
    """The versions every DeltaLakeTable loads from now on (None: the newest), in order."""
    loads: list = []
    original = DeltaLakeTable._load

    def spy(self, v=None):
        loads.append(v)
        return original(self, v)

    monkeypatch.setattr(DeltaLakeTable, "_load", spy)
    return loads


def test_a_delta_partition_is_read_from_its_own_files_only(tmp_path, monkeypatch):
    table = delta_table(tmp_path)
    handle = table.open()
    built = []
    original = type(handle).to_pyarrow_dataset

    def spy(self, *args, **kwargs):
        dataset = original(self, *args, **kwargs)
        built.append(len(dataset.files))
        return dataset

    monkeypatch.setattr(type(handle), "to_pyarrow_dataset", spy)
    data = table.read(handle, "d", [DAYS[7]])
    assert data.num_rows == 3 and set(data.column("note").to_pylist()) == {f"v2 {DAYS[7]}"}
    assert built == [1]  # one day's one live file, not a fragment per file of the table
    two = table.read(handle, "d", [DAYS[0], DAYS[29]])
    assert two.num_rows == 6 and built[-1] == 2


def test_a_delta_version_read_back_is_loaded_once_for_all_its_partitions(tmp_path, monkeypatch):
    table = delta_table(tmp_path)
    version = table.version(table.open())
    loads = delta_loads(monkeypatch)
    for day in DAYS:
        assert table.read_version(version, "d", [day]).num_rows == 3
    assert loads == [int(version)]
    older = str(int(version) - 1)  # the last day's first version: another version, loaded anew
    assert set(table.read_version(older, "d", [DAYS[29]]).column("note").to_pylist()) == {f"v1 {DAYS[29]}"}
    assert loads == [int(version), int(older)]


def test_an_iceberg_snapshot_read_back_is_loaded_once_for_all_its_partitions(tmp_path, monkeypatch):
    from sqlalchemy.engine import make_url
    table = IcebergLakeTable("s.t", "default", str(tmp_path / "w"), make_url(f"sqlite:///{tmp_path / 'c.db'}"))
    table.create(SCHEMA, "d")
    table.open().append(pa.concat_tables([day_rows(day) for day in DAYS[:10]]))
    first = table.version(table.open())
    table.open().append(day_rows(DAYS[10]))
    second = table.version(table.open())
    loads = []
    original = IcebergLakeTable._load

    def spy(self):
        loads.append(1)
        return original(self)

    monkeypatch.setattr(IcebergLakeTable, "_load", spy)
    for day in DAYS[:10]:
        assert table.read_version(second, "d", [day]).num_rows == 3
    assert len(loads) == 1
    assert table.read_version(first, "d", [DAYS[10]]).num_rows == 0  # an older snapshot it knows: no load
    assert len(loads) == 1
    table.open().append(day_rows(DAYS[11]))
    third = table.version(table.open())
    loads.clear()
    assert table.read_version(third, "d", [DAYS[11]]).num_rows == 3  # a snapshot made since: loaded anew
    assert len(loads) == 1
    table.close()


def test_a_delta_table_is_loaded_again_only_when_its_log_moved(tmp_path, monkeypatch):
    import shutil

    from deltalake import write_deltalake
    table = delta_table(tmp_path)
    loads = delta_loads(monkeypatch)
    first = table.open()
    assert table.open() is first and len(loads) == 1  # nothing committed since
    other = DeltaLakeTable(table.path)  # another writer
    write_deltalake(other.path, day_rows(DAYS[3], note="v3"), mode="overwrite", predicate=delta_predicate("d", [DAYS[3]]))
    moved = table.open()
    assert len(loads) == 2 and set(table.read(moved, "d", [DAYS[3]]).column("note").to_pylist()) == {f"v3 {DAYS[3]}"}
    # Deleted and made again up to the same version: other files, so loaded again.
    version = moved.version()
    shutil.rmtree(table.path)
    again = DeltaLakeTable(table.path)
    again.create(SCHEMA, "d")
    while int(again.version(again.open())) < version:
        write_deltalake(again.path, day_rows(DAYS[0], note="new"), mode="overwrite", predicate=delta_predicate("d", [DAYS[0]]))
    loads.clear()
    fresh = table.open()
    assert loads == [None] and table.read(fresh, "d", [DAYS[3]]).num_rows == 0
