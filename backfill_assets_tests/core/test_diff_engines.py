"""``diff`` on every engine: the same rows approved and applied on PostgreSQL (to a Delta
target), on DuckDB (Delta to Delta) and on Spark (Parquet folder to Parquet folder), the same
differences planted in each target (``-0`` against ``0``, NULL against ``''``, a trailing
space, a changed decimal digit, a key moved to another partition, a unicode row gone), and the
same answer from each engine, exact on the canonical text, down to its --json.

The first tests here of a double column on DuckDB and Spark: they found DuckDB turning stage
B's -0.0 into 0.0 (core.duck) and Spark's tie check refusing to render a double inside an
aggregate (core.engines.spark.snapshot), each of which refused a plan that was right."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
import yaml

from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import approve_plan
from backfill_assets.core.diff import diff_plan
from backfill_assets.core.errors import ApprovalError
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import URL_ENV, engine_params

SCHEMA = pa.schema([("d", pa.date32()), ("k", pa.int64()), ("f", pa.float64()), ("n", pa.decimal128(12, 2)),
                    ("t", pa.string()), ("seq", pa.int64())])
D1, D2 = dt.date(2024, 1, 1), dt.date(2024, 1, 2)
DAYS = PartitionRequest("2024-01-01..2024-01-02")
UNICODE = "ü\tline\n\x01 ☕"


def _n(text: str) -> decimal.Decimal:
    return decimal.Decimal(text)


ROWS = [
    (D1, 1, 9.0, _n("9.00"), "old", 0),  # an older version: newest wins
    (D1, 1, 0.0, _n("1.50"), "x", 1),
    (D1, 2, 1.0, _n("2.00"), "", 1),
    (D1, 3, -0.0, _n("1.50"), "same", 1),
    (D1, 4, 2.5, _n("3.00"), "tail", 1),
    (D1, 6, 3.0, _n("4.00"), UNICODE, 1),
    (D1, 7, None, None, "x" * 5000, 1),
    (D2, 5, 1.0, _n("1.00"), "moves", 1),
    (D2, 8, 1.0, _n("1.00"), "stays", 1),
]


def _mapping(**changes: Any) -> dict[str, Any]:
    return {"name": "vals", "database_url_env": URL_ENV, "partition_key": "d", "business_key": ["k"],
            "ordering": [{"column": "seq", "direction": "desc"}], "columns": ["d", "k", "f", "n", "t"],
            "total": "n", "transform_version": "v1", **changes}


def _source(tmp_path: Path) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in ROWS], schema=SCHEMA)


def _on_postgres(tmp_path: Path, conn: Any) -> dict[str, Any]:
    conn.execute("CREATE TABLE public.vals_src (d date, k bigint, f float8, n numeric(12,2), t text, seq bigint)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.vals_src VALUES (%s, %s, %s, %s, %s, %s)", ROWS)
    conn.commit()
    return _mapping(source={"table": "public.vals_src", "snapshot": "copy"},
                    target={"format": "delta", "location": str(tmp_path / "target")})


def _on_duckdb(tmp_path: Path, conn: Any) -> dict[str, Any]:
    from deltalake import write_deltalake
    write_deltalake(str(tmp_path / "source"), _source(tmp_path), partition_by=["d"])
    return _mapping(engine={"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
                    source={"format": "delta", "location": str(tmp_path / "source")},
                    target={"format": "delta", "location": str(tmp_path / "target")})


def _on_spark(tmp_path: Path, conn: Any) -> dict[str, Any]:
    pads.write_dataset(_source(tmp_path), tmp_path / "source", format="parquet", partitioning=["d"],
                       partitioning_flavor="hive")
    return _mapping(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                    source={"format": "parquet", "location": str(tmp_path / "source")},
                    target={"format": "parquet", "location": str(tmp_path / "target")})


def _plant(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The target's rows with the differences planted."""
    out = []
    for r in rows:
        r = dict(r)
        if r["k"] == 1:
            r["f"] = -0.0  # -0 against 0
        elif r["k"] == 2:
            r["t"] = None  # NULL against ''
        elif r["k"] == 3:
            r["n"] = _n("1.51")  # a changed decimal digit
        elif r["k"] == 4:
            r["t"] = "tail "  # a trailing space
        elif r["k"] == 5:
            r["d"] = D1  # moved to another partition
        elif r["k"] == 6:
            continue  # the unicode row is gone
        out.append(r)
    return out


def _plant_delta(location: Path) -> None:
    from deltalake import DeltaTable, write_deltalake
    data = DeltaTable(str(location)).to_pyarrow_table()
    write_deltalake(str(location), pa.Table.from_pylist(_plant(data.to_pylist()), schema=data.schema),
                    mode="overwrite", partition_by=["d"])


def _plant_folder(location: Path) -> None:
    data = pads.dataset(location, format="parquet", partitioning="hive").to_table()
    rows = [{**r, "d": dt.date.fromisoformat(str(r["d"]))} for r in data.to_pylist()]
    planted = _plant(rows)
    for day in (D1, D2):
        folder = location / f"d={day.isoformat()}"
        shutil.rmtree(folder)
        folder.mkdir()
        part = [{k: v for k, v in r.items() if k != "d"} for r in planted if r["d"] == day]
        pq.write_table(pa.Table.from_pylist(part, schema=data.schema.remove(data.schema.get_field_index("d"))),
                       folder / "part-planted.parquet")


ENGINES = {"postgres": (_on_postgres, _plant_delta), "duckdb": (_on_duckdb, _plant_delta),
           "spark": (_on_spark, _plant_folder)}


def _expected(values: dict[int, dict[str, list[str | None]]]) -> dict[str, Any]:
    return {"against": "target", "partitions": [
        {"partition": "2024-01-01", "added": 1, "removed": 1, "changed": 4, "unchanged": 1, "examples": [
            {"key": {"k": "1"}, "kind": "changed", "columns": ["f"], "values": {"f": ["0", "-0"]}},
            {"key": {"k": "2"}, "kind": "changed", "columns": ["t"], "values": {"t": ["", None]}},
            {"key": {"k": "3"}, "kind": "changed", "columns": ["n"], "values": {"n": ["1.50", "1.51"]}},
            {"key": {"k": "4"}, "kind": "changed", "columns": ["t"], "values": {"t": ["tail", "tail "]}},
            {"key": {"k": "5"}, "kind": "removed", "columns": ["d", "k", "f", "n", "t"], "values": values[5]},
            {"key": {"k": "6"}, "kind": "added", "columns": ["d", "k", "f", "n", "t"], "values": values[6]},
        ]},
        {"partition": "2024-01-02", "added": 1, "removed": 0, "changed": 0, "unchanged": 1, "examples": [
            {"key": {"k": "5"}, "kind": "added", "columns": ["d", "k", "f", "n", "t"],
             "values": {"d": ["2024-01-02", None], "k": ["5", None], "f": ["1", None], "n": ["1.00", None],
                        "t": ["moves", None]}},
        ]},
    ]}


@pytest.mark.parametrize("engine", engine_params(list(ENGINES)))
def test_every_engine_finds_the_same_planted_differences(engine, tmp_path, factory, url_env, conn, request,
                                                         capsys):
    if engine == "spark":
        request.getfixturevalue("spark")
    build, plant = ENGINES[engine]
    mapping = build(tmp_path, conn)
    spec = spec_from_mapping(mapping)
    plan = make_plan(spec, DAYS, factory)
    assert plan.status == "ready", plan.problems
    clean = diff_plan(spec, plan.plan_id, factory)  # nothing written yet: every key is added
    assert [(p.added, p.removed, p.changed) for p in clean.partitions] == [(6, 0, 0), (2, 0, 0)]
    assert [e.key for e in clean.partitions[0].examples] == [{"k": str(k)} for k in (1, 2, 3, 4, 6, 7)]
    same = diff_plan(spec, plan.plan_id, factory, against="stage_b")
    assert [(p.unchanged, p.differs) for p in same.partitions] == [(6, False), (2, False)]
    with factory() as c:
        approve_plan(c, factory, spec, plan, "tester")
    apply_plan(spec, plan.plan_id, factory, run_id="run-1")
    assert not any(p.differs for p in diff_plan(spec, plan.plan_id, factory).partitions)
    plant(tmp_path / "target")
    result = diff_plan(spec, plan.plan_id, factory)
    got = result.as_json()
    assert got.pop("plan_id") == plan.plan_id
    assert got == _expected({
        5: {"d": [None, "2024-01-01"], "k": [None, "5"], "f": [None, "1"], "n": [None, "1.00"], "t": [None, "moves"]},
        6: {"d": ["2024-01-01", None], "k": ["6", None], "f": ["3", None], "n": ["4.00", None], "t": [UNICODE, None]},
    })
    limited = diff_plan(spec, plan.plan_id, factory, limit=2, request=PartitionRequest("2024-01-01"))
    assert [e.key["k"] for p in limited.partitions for e in p.examples] == ["1", "2"]
    # The command line gives the same, as text and as JSON.
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(mapping))
    from backfill_assets.cli.commands import main
    assert main(["diff", "--spec", str(path), "--plan", plan.plan_id[:12], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == result.as_json()
    assert main(["diff", "--spec", str(path), "--plan", plan.plan_id[:12]]) == 0
    text = capsys.readouterr().out
    assert "changed  (k=4)" in text and "'tail' -> 'tail '" in text


@pytest.mark.parametrize("engine", engine_params(["duckdb", "spark"]))
def test_a_changed_stage_is_refused_rather_than_diffed(engine, tmp_path, factory, url_env, conn, request):
    if engine == "spark":
        request.getfixturevalue("spark")
    spec = spec_from_mapping(ENGINES[engine][0](tmp_path, conn))
    plan = make_plan(spec, DAYS, factory)
    if engine == "duckdb":
        import duckdb
        with duckdb.connect(str(tmp_path / "stages.duckdb")) as con:
            con.execute("UPDATE vals__stage_a SET t = 'y' WHERE k = 8")
    else:
        folder = next((tmp_path / "staging" / "stage_a").glob("d=2024-01-02"))
        (file,) = folder.glob("*.parquet")
        data = pq.read_table(file)
        pq.write_table(data.set_column(data.schema.get_field_index("t"), "t", pa.array(["y"] * data.num_rows)), file)
    with pytest.raises(ApprovalError, match=r"no longer holds plan .* partition\(s\) 2024-01-02; plan again"):
        diff_plan(spec, plan.plan_id, factory)
