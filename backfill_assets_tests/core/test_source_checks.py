"""The source checks, written once (core.planning.check_source_counts) over the counts each
engine computes: each wording's order and messages, and nothing counted after the first
refusal. The engines' own tests refuse real data with them (test_bad_input.py,
test_duck_bad_inputs.py, test_spark_bad_inputs.py)."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import SourceDataError
from backfill_assets.core.planning import Outside, Tie, Ties, check_source_counts
from backfill_assets_tests.support.specs import make_spec


class Counts:
    """Counts handed over as given, with the questions asked recorded."""

    def __init__(self, *, outside=Outside(0), nulls=(0, 0), reports=None, ties=Ties(0, ())):
        self.answers = {"outside": outside, "ordering_nulls": nulls,
                        "reports": {"2024-01-01": (3, 0)} if reports is None else reports, "ties": ties}
        self.asked: list[str] = []

    def __getattr__(self, name):
        if name not in self.answers:
            raise AttributeError(name)
        return lambda: self.asked.append(name) or self.answers[name]


ALL_BAD = {"outside": Outside(4, [("2024-02-01", 4)]), "nulls": (2, 0),
           "reports": {"2024-01-01": (2, 2)}, "ties": Ties(1, [Tie(("2024-01-01",), (7,), 2)])}


def test_clean_counts_pass_and_return_the_input_report():
    for wording in ("database", "loaded"):
        counts = Counts()
        assert check_source_counts(make_spec(), counts, wording) == {"2024-01-01": (3, 0)}
        assert sorted(counts.asked) == ["ordering_nulls", "outside", "reports", "ties"]


def test_the_loaded_wording_refuses_rows_outside_first_with_examples_and_asks_nothing_more():
    counts = Counts(**ALL_BAD)
    with pytest.raises(SourceDataError) as refused:
        check_source_counts(make_spec(), counts, "loaded")
    assert counts.asked == ["outside"]
    assert str(refused.value) == (
        "the input has rows outside the declared partitions (the transform moves them, or they have a NULL "
        "partition key) (for example partition 2024-02-01: 4 row(s)). Keep the partition key as the source has "
        "it in transform_sql")


def test_the_database_wording_refuses_undeclared_nulls_first_and_rows_outside_last():
    counts = Counts(**ALL_BAD)
    with pytest.raises(SourceDataError, match="no declared NULL placement") as refused:
        check_source_counts(make_spec(), counts, "database")
    assert counts.asked == ["ordering_nulls"]
    assert refused.value.examples == ("updated_at: 2 row(s)",)
    counts = Counts(outside=Outside(4))
    with pytest.raises(SourceDataError) as refused:
        check_source_counts(make_spec(), counts, "database")
    assert counts.asked == ["ordering_nulls", "reports", "ties", "outside"]
    assert str(refused.value) == ("transform_sql puts 4 row(s) outside the declared partitions or in a NULL "
                                  "partition. A transform must keep every row in its source partition")


def test_declared_nulls_pass_and_a_partition_of_null_keys_is_refused_alike():
    spec = make_spec(ordering=[{"column": "updated_at", "direction": "desc", "nulls": "last"},
                               {"column": "ingest_seq", "direction": "desc"}])
    for wording in ("database", "loaded"):
        counts = Counts(nulls=(5, 0), reports={"2024-01-01": (2, 2), "2024-01-02": (3, 1)})
        with pytest.raises(SourceDataError) as refused:
            check_source_counts(spec, counts, wording)
        assert "ties" not in counts.asked
        assert str(refused.value) == (
            "every source row of some partitions has a NULL business key (order_id), so the rebuild would empty "
            "them (for example partition 2024-01-01: 2 row(s)). Check business_key against the source (run "
            "`backfill-assets profile`)")


def test_ties_in_each_wording():
    ties = Ties(5, [Tie(("2024-01-01",), (7,), 2), Tie((), (8,), 3)])
    with pytest.raises(SourceDataError) as refused:
        check_source_counts(make_spec(), Counts(ties=ties), "database")
    assert refused.value.problem == ("5 key(s) have rows that tie on every ordering column (updated_at, ingest_seq) "
                                     "but differ, so newest-wins would pick one by chance")
    assert refused.value.hint == ("Add a final tiebreak column to `ordering` (run `backfill-assets profile` to "
                                  "find one); do not guess")
    assert refused.value.examples == ("partition 2024-01-01, key (order_id=7): 2 different rows",
                                      "key (order_id=8): 3 different rows")
    with pytest.raises(SourceDataError) as refused:
        check_source_counts(make_spec(), Counts(ties=ties), "loaded")
    assert refused.value.problem == ("rows tie on every ordering column (updated_at, ingest_seq) within a key but "
                                     "differ, so newest-wins would pick one of them by chance")
    assert refused.value.hint == "Add a final tiebreak column to ordering (an ingest sequence, a unique id)"
    assert refused.value.examples == ("order_date=2024-01-01, order_id=7 (2 different rows)",
                                      "order_id=8 (3 different rows)")
