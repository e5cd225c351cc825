"""profile proposes a key and a total ordering from the data, or says none works."""

from __future__ import annotations

import datetime as dt

from backfill_assets_tests.support.profiles import profile_source
from backfill_assets_tests.support.specs import make_spec


def test_profile_proposes_the_demo_key_and_tiebreak(demo_db):
    profile = profile_source(demo_db, make_spec(), None)
    assert profile.business_key == ["order_id"]
    assert profile.ordering == ["updated_at", "ingest_seq"]
    # updated_at alone is not total: the profile says how many keys it leaves tied.
    lone = next(t for t in profile.orderings if t.columns == ("updated_at",))
    assert lone.tied_keys > 0 and not lone.total
    assert "ingest_seq" in profile.key_reason  # named as a row id, not a key


def test_profile_says_so_when_no_ordering_is_total(conn):
    # Ten keys, each with its own weight; six corrected an hour later, three with a second row
    # at the same time that nothing breaks.
    at = dt.datetime(2024, 1, 1, 8, tzinfo=dt.timezone.utc)
    rows = [(dt.date(2024, 1, 1), k, at + dt.timedelta(minutes=k), "a", k / 3) for k in range(1, 11)]
    rows += [(d, k, ts + dt.timedelta(hours=1), "b", w) for d, k, ts, _, w in rows[:6]]
    rows += [(d, k, ts, "c", w) for d, k, ts, _, w in rows[6:9]]
    conn.execute("CREATE TABLE public.src (d date, k int, ts timestamptz, v text, w float8)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.src (d, k, ts, v, w) VALUES (%s, %s, %s, %s, %s)", rows)
    spec = make_spec(source={"table": "public.src", "snapshot": "copy"}, partition_key="d",
                     business_key=["k"], ordering=[{"column": "ts", "direction": "desc"}],
                     columns=["d", "k", "ts", "v", "w"], total=None)
    profile = profile_source(conn, spec, None)
    assert profile.business_key == ["k"], profile.key_reason
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
    assert profile.business_key is None and profile.key_reason.startswith("no candidate key is safe")
    assert "declare business_key yourself" in profile.key_reason
