"""Format 3 in Apache Spark, in a real local session: the golden rows render to the same texts
and hashes, and give the same readings, as the Python reference, PostgreSQL and DuckDB, in any
session time zone and row order."""

from __future__ import annotations

import pyarrow as pa
import pytest

from backfill_assets.core.engines.spark import fingerprint as spark_digest
from backfill_assets.core.fingerprint import rows
from backfill_assets.core.fingerprint.kinds import lake_schema
from backfill_assets_tests.core.fingerprint import golden

FILE = golden.load()


def _frame(session, reverse: bool = False):
    cols = golden.columns("portable")
    values = [[golden.decode(v) for v in r["values"]] for r in FILE["portable"]["rows"]]
    if reverse:
        values = values[::-1]
    schema = lake_schema(cols)
    table = pa.table({c.name: pa.array([r[i] for r in values], schema.field(c.name).type)
                      for i, c in enumerate(cols)}, schema=schema)
    return session.createDataFrame(table), cols


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_spark_gives_the_golden_texts_and_hashes(spark, zone):
    from pyspark.sql import functions as F  # noqa: N812
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        frame, cols = _frame(spark)
        text = spark_digest.row_text([(c.name, rows.kind_of(c)) for c in cols])
        got = [(r["t"], r["h"]) for r in frame.select(text.alias("t"), F.sha2(text, 256).alias("h")).collect()]
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert [t for t, _ in got] == [r["text"] for r in FILE["portable"]["rows"]]
    assert [h for _, h in got] == [r["hash"] for r in FILE["portable"]["rows"]]


@pytest.mark.parametrize("reverse", [False, True])
def test_spark_gives_the_golden_readings(spark, reverse):
    from pyspark.sql import functions as F  # noqa: N812
    frame, cols = _frame(spark, reverse)
    found = spark_digest.readings(frame.withColumn("__all", F.lit(1)), cols, ["k"], "__all", "amount")
    assert found[1].as_dict() == FILE["portable"]["readings"]


@pytest.mark.parametrize("bits", ["fff8000000000000", "7ff0000000000001", "fff0000000000abc"])
def test_every_nan_renders_as_the_canonical_one(spark, bits):
    """A NaN of any sign or payload (a lake file may hold any) renders as 7ff8000000000000, as
    the specification says, not as its raw bits."""
    import struct
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    frame = spark.createDataFrame(pa.table({"x": pa.array([value, -0.0, 0.0, None], pa.float64())}))
    got = [r[0] for r in frame.select(spark_digest.row_text([("x", "double")])).collect()]
    assert got == [rows.NAN_BITS, "8000000000000000", "0000000000000000", rows.NULL]


def test_a_partition_past_the_digest_s_64_bit_sums_is_refused(spark, monkeypatch):
    """Each 60-bit slice is summed as two 30-bit halves in bigint, exact below 2**33 rows a
    partition; past that the readings are refused, never wrapped (shown with the bound lowered)."""
    from pyspark.sql import functions as F  # noqa: N812
    frame, cols = _frame(spark)
    monkeypatch.setattr(spark_digest, "_MAX_ROWS", 2)
    with pytest.raises(ValueError, match=r"rows: Spark's digest sums them in 64 bits.*split the partition key"):
        spark_digest.readings(frame.withColumn("__all", F.lit(1)), cols, ["k"], "__all", "amount")
