"""``audit`` on every engine and target: the same rows backfilled into a PostgreSQL table, a
Delta table and an Iceberg table (engine postgres), a Delta table (engine duckdb), a Parquet
folder and a Spark catalog table (engine spark); nothing touched, every partition holds, and where the target has a
sound metadata signal without a row read; then the same drift planted in each, as another
writer would (a row updated, a row deleted, a stray row appended, a partition rewritten with
the same rows, a partition dropped), and the audit names each exactly, down to its --json and
its exit code."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import yaml

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.audit import audit_spec
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import URL_ENV, engine_params

SCHEMA = pa.schema([("d", pa.date32()), ("k", pa.int64()), ("f", pa.float64()), ("n", pa.decimal128(12, 2)),
                    ("t", pa.string()), ("seq", pa.int64())])
TARGET = pa.schema([f for f in SCHEMA if f.name != "seq"])
DAYS = [dt.date(2024, 1, d) for d in range(1, 6)]
D1, D2, D3, D4, D5 = DAYS
LABELS = [d.isoformat() for d in DAYS]
UNICODE = "ü\tline\n\x01 ☕"


def _n(text: str) -> decimal.Decimal:
    return decimal.Decimal(text)


ROWS = [
    (D1, 1, 0.0, _n("1.50"), "x", 1),
    (D1, 1, 9.0, _n("9.00"), "older", 0),  # newest wins
    (D1, 2, None, None, UNICODE, 1),
    (D1, 3, -0.0, _n("2.00"), "x" * 5000, 1),
    (D2, 4, 1.0, _n("1.00"), "", 1),
    (D2, 5, 1.0, _n("1.00"), None, 1),
    (D3, 6, 2.0, _n("2.00"), "alone", 1),
    (D4, 7, 3.0, _n("3.00"), "a", 1),
    (D4, 8, 4.0, _n("4.00"), "b", 1),
    (D5, 9, 5.0, _n("5.00"), "dropped later", 1),
]


def _mapping(**changes: Any) -> dict[str, Any]:
    return {"name": "vals", "database_url_env": URL_ENV, "partition_key": "d", "business_key": ["k"],
            "ordering": [{"column": "seq", "direction": "desc"}], "columns": ["d", "k", "f", "n", "t"],
            "total": "n", "transform_version": "v1", **changes}


def _postgres_source(conn: Any) -> dict[str, Any]:
    conn.execute("CREATE TABLE public.vals_src (d date, k bigint, f float8, n numeric(12,2), t text, seq bigint)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.vals_src VALUES (%s, %s, %s, %s, %s, %s)", ROWS)
    conn.commit()
    return {"table": "public.vals_src", "snapshot": "copy"}


def _source_table() -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in ROWS], schema=SCHEMA)


def on_postgres(tmp_path: Path, conn: Any) -> dict[str, Any]:
    conn.execute("CREATE TABLE public.vals (d date, k bigint, f float8, n numeric(12,2), t text, UNIQUE (d, k))")
    return _mapping(source=_postgres_source(conn), target={"table": "public.vals"})


def on_delta(tmp_path: Path, conn: Any) -> dict[str, Any]:
    return _mapping(source=_postgres_source(conn), target={"format": "delta", "location": str(tmp_path / "target")})


def on_iceberg(tmp_path: Path, conn: Any) -> dict[str, Any]:
    return _mapping(source=_postgres_source(conn), target={
        "format": "iceberg", "table": "sales.vals", "catalog": {"type": "sql", "warehouse": str(tmp_path / "wh")}})


def on_duckdb(tmp_path: Path, conn: Any) -> dict[str, Any]:
    from deltalake import write_deltalake
    write_deltalake(str(tmp_path / "source"), _source_table(), partition_by=["d"])
    return _mapping(engine={"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
                    source={"format": "delta", "location": str(tmp_path / "source")},
                    target={"format": "delta", "location": str(tmp_path / "target")})


def on_spark(tmp_path: Path, conn: Any) -> dict[str, Any]:
    pads.write_dataset(_source_table(), tmp_path / "source", format="parquet", partitioning=["d"],
                       partitioning_flavor="hive")
    return _mapping(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                    source={"format": "parquet", "location": str(tmp_path / "source")},
                    target={"format": "parquet", "location": str(tmp_path / "target")})


def on_spark_table(tmp_path: Path, conn: Any) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    spark = SparkSession.getActiveSession()
    table = f"vals_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {table} (k BIGINT, f DOUBLE, n DECIMAL(12,2), t STRING, d DATE) USING parquet "
              f"PARTITIONED BY (d) LOCATION '{tmp_path / table}'")
    return {**on_spark(tmp_path, conn), "target": {"format": "spark_table", "table": table}}


class Writer:
    """Another writer of the target: what it does to one partition's rows."""

    def rows(self, day: dt.date) -> list[dict[str, Any]]:
        raise NotImplementedError

    def put(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        """The partition's files replaced by new ones holding ``rows``."""
        raise NotImplementedError

    def append(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def plant(self) -> None:
        self.put(D1, [{**r, "t": "edited"} if r["k"] == 2 else r for r in self.rows(D1)])  # a row updated
        self.put(D2, [r for r in self.rows(D2) if r["k"] != 5])  # a row deleted
        self.append(D3, [{"d": D3, "k": 60, "f": 1.0, "n": _n("1.00"), "t": "stray"}])  # a stray append
        self.put(D4, self.rows(D4))  # rewritten, the same rows
        self.put(D5, [])  # dropped


class PostgresWriter(Writer):
    def __init__(self, url: str) -> None:
        self.url = url

    def plant(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("UPDATE public.vals SET t = 'edited' WHERE k = 2")
            c.execute("DELETE FROM public.vals WHERE k = 5")
            c.execute("INSERT INTO public.vals VALUES ('2024-01-03', 60, 1.0, 1.00, 'stray')")
            c.execute("DELETE FROM public.vals WHERE d = '2024-01-05'")
            c.execute("VACUUM FULL public.vals")  # every row rewritten as it was (D4 among them)


class DeltaWriter(Writer):
    def __init__(self, location: Path) -> None:
        self.location = str(location)

    def rows(self, day: dt.date) -> list[dict[str, Any]]:
        from deltalake import DeltaTable
        data = DeltaTable(self.location).to_pyarrow_dataset().to_table(filter=pads.field("d") == day)
        return data.select(TARGET.names).to_pylist()

    def put(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        from deltalake import write_deltalake

        from backfill_assets.core.lake.delta import delta_predicate
        write_deltalake(self.location, pa.Table.from_pylist(rows, schema=TARGET), mode="overwrite",
                        predicate=delta_predicate("d", [day]), partition_by=["d"])

    def append(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        from deltalake import write_deltalake
        write_deltalake(self.location, pa.Table.from_pylist(rows, schema=TARGET), mode="append", partition_by=["d"])


class IcebergWriter(Writer):
    def __init__(self, spec: Any, conn: Any) -> None:
        from backfill_assets.core.targets import engine_for
        self.table = engine_for(spec).table(conn)

    def rows(self, day: dt.date) -> list[dict[str, Any]]:
        return self.table.read(self.table.open(), "d", [day]).select(TARGET.names).to_pylist()

    def _data(self, rows: list[dict[str, Any]]) -> pa.Table:
        schema = self.table.open().schema().as_arrow()
        return pa.Table.from_pylist(rows, schema=pa.schema([schema.field(n) for n in TARGET.names]))

    def put(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        from pyiceberg.expressions import EqualTo
        handle = self.table.open()
        if rows:
            handle.overwrite(self._data(rows), overwrite_filter=EqualTo("d", day.isoformat()))
        else:
            handle.delete(EqualTo("d", day.isoformat()))

    def append(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        self.table.open().append(self._data(rows))


class FolderWriter(Writer):
    def __init__(self, location: Path) -> None:
        self.location = location

    def _dir(self, day: dt.date) -> Path:
        return self.location / f"d={day.isoformat()}"

    def rows(self, day: dt.date) -> list[dict[str, Any]]:
        data = pads.dataset(self._dir(day), format="parquet").to_table()
        return [{**r, "d": day} for r in data.to_pylist()]

    def _write(self, day: dt.date, rows: list[dict[str, Any]], name: str) -> None:
        schema = pa.schema([f for f in TARGET if f.name != "d"])
        pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "d"} for r in rows], schema=schema),
                       self._dir(day) / name)

    def put(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        shutil.rmtree(self._dir(day))
        if rows:
            self._dir(day).mkdir()
            self._write(day, rows, "part-rewritten.parquet")

    def append(self, day: dt.date, rows: list[dict[str, Any]]) -> None:
        self._write(day, rows, "part-stray.parquet")


class SparkTableWriter(FolderWriter):
    """A Spark catalog table's partitions, at the locations its catalog gives them now."""

    def __init__(self, spec: Any) -> None:
        from pyspark.sql import SparkSession

        from backfill_assets.core.engines.spark.spark_table import SparkCatalogTable
        self.table = SparkCatalogTable(SparkSession.getActiveSession(), spec.target.table, "d")

    def _dir(self, day: dt.date) -> Path:
        location, _ = self.table.open().of(day)
        return Path(location)


ENGINES = {
    # name: (build, the signal of an untouched target, whether its first audit needs no row read)
    "postgres": (on_postgres, "table counters", False),
    "delta": (on_delta, "log files", True),
    "iceberg": (on_iceberg, "manifest files", True),
    "duckdb": (on_duckdb, "log files", True),
    "spark": (on_spark, "file listing", False),
    "spark_table": (on_spark_table, "catalog location and files", False),
}


def _writer(engine: str, spec: Any, tmp_path: Path, conn: Any, url: str) -> Writer:
    if engine == "postgres":
        return PostgresWriter(url)
    if engine == "iceberg":
        return IcebergWriter(spec, conn)
    if engine == "spark":
        return FolderWriter(tmp_path / "target")
    if engine == "spark_table":
        return SparkTableWriter(spec)
    return DeltaWriter(tmp_path / "target")


def counters_settled(url: str, inserted: int) -> None:
    """Wait until PostgreSQL's statistics show the rows apply inserted (a session's counters are
    published when it goes idle or ends, not at its commit)."""
    with psycopg.connect(url, autocommit=True) as c:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = c.execute("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relid = 'public.vals'::regclass").fetchone()
            if row and row[0] >= inserted:
                return
            time.sleep(0.1)
    raise AssertionError("the target's counters never showed apply's inserts")


def _results(result) -> dict[str, tuple[str, str]]:
    return {p.partition: (p.result, p.signal) for p in result.partitions}


@pytest.mark.parametrize("engine", engine_params(list(ENGINES)))
def test_every_engine_names_each_planted_drift_and_an_untouched_target_holds_by_its_signal(
        engine, tmp_path, factory, url_env, conn, db_url, request, capsys):
    if engine.startswith("spark"):
        request.getfixturevalue("spark")
    build, cheap, first_is_cheap = ENGINES[engine]
    mapping = build(tmp_path, conn)
    spec = spec_from_mapping(mapping)
    plan = make_plan(spec, PartitionRequest("2024-01-01..2024-01-05"), factory)
    assert plan.status == "ready", plan.problems
    with factory() as c:
        approve_plan(c, factory, spec, plan, "tester")
    apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    if engine == "postgres":
        counters_settled(db_url.reveal(), 9)

    # Nothing touched: every partition holds. A lake that keeps versions holds by its files
    # from the first audit (against the version apply verified); the others read the rows
    # once, then hold by their signal.
    first = audit_spec(spec, factory)
    assert _results(first) == dict.fromkeys(LABELS, ("holds", cheap if first_is_cheap else "fingerprint"))
    assert [p.verified["content_hash"] for p in first.partitions] == [
        plan.approved(label)["content_hash"] for label in LABELS]
    second = audit_spec(spec, factory)
    assert _results(second) == dict.fromkeys(LABELS, ("holds", cheap))
    assert all(p.now is None for p in second.partitions)  # no row was read
    full = audit_spec(spec, factory, full=True)
    assert _results(full) == dict.fromkeys(LABELS, ("holds", "fingerprint"))

    # Another writer changes the target.
    _writer(engine, spec, tmp_path, conn, db_url.reveal()).plant()
    result = audit_spec(spec, factory, request=PartitionRequest("2024-01-01..2024-01-06"))
    got = {p.partition: p for p in result.partitions}
    assert {label: p.result for label, p in got.items()} == {
        "2024-01-01": "drifted", "2024-01-02": "drifted", "2024-01-03": "drifted", "2024-01-04": "holds",
        "2024-01-05": "drifted", "2024-01-06": "never verified"}
    assert got["2024-01-04"].signal == "fingerprint"  # its files changed, its rows did not
    changes = {label: (p.changes["keys"], [(e["kind"], e["key"], e["columns"] if e["kind"] == "changed" else None)
                                           for e in p.changes["first"]])
               for label, p in got.items() if p.result == "drifted"}
    assert changes == {
        "2024-01-01": ({"added": 0, "removed": 0, "changed": 1, "unchanged": 2}, [("changed", {"k": "2"}, ["t"])]),
        "2024-01-02": ({"added": 0, "removed": 1, "changed": 0, "unchanged": 1}, [("removed", {"k": "5"}, None)]),
        "2024-01-03": ({"added": 1, "removed": 0, "changed": 0, "unchanged": 1}, [("added", {"k": "60"}, None)]),
        "2024-01-05": ({"added": 0, "removed": 1, "changed": 0, "unchanged": 0}, [("removed", {"k": "9"}, None)]),
    }
    assert got["2024-01-05"].now["row_count"] == 0 and got["2024-01-05"].verified["row_count"] == 1
    if engine in ("delta", "iceberg", "duckdb"):  # the commits after the verified one that touched each
        touched = {label: p.since["commits_since_verified"] for label, p in got.items() if p.result == "drifted"}
        assert all(touched.values()) and len({v for vs in touched.values() for v in vs}) == sum(
            len(vs) for vs in touched.values()), touched  # each its own writes (an Iceberg overwrite: two)
        if engine != "iceberg":
            assert all(len(vs) == 1 for vs in touched.values()), touched  # one commit each
    else:
        assert all("commits_since_verified" not in p.since for p in got.values())
    assert got["2024-01-01"].since["last_seen_holding"] == full.audited_at

    # The command line: the same answer as JSON, and exit code 9 for a scheduler.
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(mapping))
    from backfill_assets.cli.commands import main
    assert main(["audit", "--spec", str(path), "--json", "--limit", "1"]) == 9
    out = json.loads(capsys.readouterr().out)
    assert {p["partition"]: p["result"] for p in out["partitions"]} == {
        label: r for label, r in {label: p.result for label, p in got.items()}.items() if label != "2024-01-06"}
    assert out["counts"] == {"holds": 1, "drifted": 4, "never verified": 0}
    assert UNICODE not in json.dumps(out) and "edited" not in json.dumps(out)  # keys and column names only
    assert main(["audit", "--spec", str(path), "--partitions", "2024-01-04"]) == 0
    assert "2024-01-04   holds" in capsys.readouterr().out

    # Every audit is in the control store, partition by partition.
    with factory() as c:
        kept = c.execute("SELECT count(DISTINCT audit_id), count(*) FROM backfill_control.audits").fetchone()
    assert kept == (6, 5 + 5 + 5 + 6 + 5 + 1)
