"""Generated sources: the two builds agree, equal an independent newest-wins, and a second
plan gives the same plan id. Examples: 15 by default, HYPOTHESIS_PROFILE=slow for 300."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backfill_assets.core.errors import SourceDataError
from backfill_assets.core.fingerprint import rows as fingerprint_rows
from backfill_assets.core.pg.catalog import table_columns
from backfill_assets.core.plan import make_plan
from backfill_assets.core.vocabulary import PartitionRequest, TableRef
from backfill_assets_tests.support.specs import make_spec

DAYS = [dt.date(2024, 1, d) for d in (1, 2, 3)]
SPEC = make_spec(
    name="gen", source={"table": "public.gen_src", "snapshot": "copy"}, target={"table": "public.gen_tgt"},
    partition_key="d", business_key=["k"],
    ordering=[{"column": "u", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    columns=["d", "k", "u", "seq", "amount", "t"], total="amount", records_can_move=False,
)

texts = st.one_of(st.none(), st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8))
rows = st.lists(
    st.tuples(
        st.sampled_from(DAYS[:2]),  # the third day stays empty
        st.one_of(st.none(), st.integers(0, 4)),
        st.integers(0, 2),
        st.integers(-10**8, 10**8).map(lambda c: Decimal(c) / 100),
        texts,
    ),
    max_size=25,
)


@given(rows)
def test_generated_sources_converge_to_newest_wins(conn, factory, generated):
    conn.execute("DROP TABLE IF EXISTS public.gen_src, public.gen_tgt")
    conn.execute("CREATE TABLE public.gen_src (d date, k int, u int, seq int, amount numeric(12,2), t text)")
    conn.execute("CREATE TABLE public.gen_tgt (d date, k int, u int, seq int, amount numeric(12,2), t text, UNIQUE (d, k))")
    # seq is unique, so (u, seq) is a total order; each row is also re-ingested once in three.
    source = [(d, k, u, seq, amount, t) for seq, (d, k, u, amount, t) in enumerate(generated)]
    source += source[::3]
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO public.gen_src (d, k, u, seq, amount, t) VALUES (%s, %s, %s, %s, %s, %s)", source
        )
    request = PartitionRequest("2024-01-01..2024-01-03")
    if any(source and all(r[1] is None for r in source if r[0] == day) and any(r[0] == day for r in source)
           for day in DAYS):
        # A partition whose rows all lack a key would be emptied: refused, nothing written.
        with pytest.raises(SourceDataError, match="NULL business key"):
            make_plan(SPEC, request, factory)
        return
    plan = make_plan(SPEC, request, factory)
    assert plan.status == "ready", plan.problems

    columns = table_columns(conn, TableRef("public", "gen_tgt"))
    best: dict[tuple, tuple] = {}
    for row in source:
        if row[1] is not None and ((row[0], row[1]) not in best or row[2:4] > best[(row[0], row[1])][2:4]):
            best[(row[0], row[1])] = row
    for entry, day in zip(plan.as_json()["partitions"], DAYS):
        expected = [best[key] for key in sorted(best) if key[0] == day]
        assert entry["stage_a"] == entry["stage_b"]
        reference = fingerprint_rows.reference_readings(columns, expected, ["k"], "amount")
        assert {k: entry["stage_a"][k] for k in ("row_count", "total", "content_hash")} == {
            "row_count": reference.row_count, "total": reference.total, "content_hash": reference.content_hash}
        assert entry["stage_a"]["row_count"] == len(expected)
    assert make_plan(SPEC, request, factory).plan_id == plan.plan_id
