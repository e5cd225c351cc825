"""profile proposes a key and a total ordering from the data, or says none works."""

from __future__ import annotations

from backfill_assets.core.profile import profile_source
from backfill_assets_tests.conftest import make_spec


def test_profile_proposes_the_demo_key_and_tiebreak(demo_db):
    profile = profile_source(demo_db, make_spec(), None)
    assert profile.business_key == ["order_id"]
    assert profile.ordering == ["updated_at", "ingest_seq"]
    # updated_at alone is not total: the profile says how many keys it leaves tied.
    lone = next(t for t in profile.orderings if t.columns == ("updated_at",))
    assert lone.tied_keys > 0 and not lone.total
    assert "ingest_seq" in profile.key_reason  # named as a row id, not a key


def test_profile_says_so_when_no_ordering_is_total(conn):
    conn.execute("CREATE TABLE public.src (d date, k int, ts timestamptz, v text)")
    conn.execute(
        "INSERT INTO public.src (d, k, ts, v) VALUES ('2024-01-01', 1, '2024-01-01', 'a'), "
        "('2024-01-01', 1, '2024-01-01', 'b'), ('2024-01-01', 2, '2024-01-01', 'c'), "
        "('2024-01-01', 3, '2024-01-02', 'd')"
    )
    spec = make_spec(source={"table": "public.src", "snapshot": "copy"}, partition_key="d",
                     business_key=["k"], ordering=[{"column": "ts", "direction": "desc"}],
                     columns=["d", "k", "ts", "v"], total=None)
    profile = profile_source(conn, spec, None)
    assert profile.business_key == ["k"]
    assert profile.ordering is None and "add a tiebreak column" in profile.ordering_reason


def test_profile_says_so_when_no_column_can_be_a_key(conn):
    conn.execute("CREATE TABLE public.src (d date, status text, amount float8)")
    conn.execute(
        "INSERT INTO public.src (d, status, amount) SELECT '2024-01-01', 'same', g FROM generate_series(1, 20) g"
    )
    spec = make_spec(source={"table": "public.src", "snapshot": "copy"}, partition_key="d",
                     business_key=["status"], ordering=[{"column": "amount", "direction": "desc"}],
                     columns=["d", "status", "amount"], total=None)
    profile = profile_source(conn, spec, None)
    assert profile.business_key is None and "declare the (composite) business_key" in profile.key_reason
