"""profile proposes a business key only when the rows sharing it look like versions of one
entity: on sources where the tempting single column merges entities it proposes the real
(composite) key, or nothing, and says why.

Each source is generated with a fixed seed, small enough to profile in well under a second.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence

import psycopg
from psycopg import sql

from backfill_assets.core.profile import keysearch as profile_mod
from backfill_assets.render import render_profile
from backfill_assets_tests.support.profiles import profile_source
from backfill_assets_tests.support.specs import make_spec

UTC = dt.timezone.utc
DAYS = [dt.date(2024, 3, 1) + dt.timedelta(days=i) for i in range(3)]
_CREATE = sql.SQL("CREATE TABLE {rel} ({defs})")
_INSERT = sql.SQL("INSERT INTO {rel} ({cols}) VALUES ({values})")


def _load(conn: psycopg.Connection, name: str, columns: Sequence[tuple[str, str]], rows: list[tuple]) -> None:
    """Create public.<name> with ``columns`` (name, SQL type literal) and insert ``rows``."""
    rel = sql.Identifier("public", name)
    defs = sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns  # type: ignore[arg-type]
    )
    cols = sql.SQL(", ").join(sql.Identifier(c) for c, _ in columns)
    values = sql.SQL(", ").join(sql.Placeholder() for _ in columns)
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(_CREATE.format(rel=rel, defs=defs))
        cur.executemany(_INSERT.format(rel=rel, cols=cols, values=values), rows)


def _spec(name: str, partition_key: str, key: list[str], order: str, columns: Sequence[tuple[str, str]]):
    return make_spec(source={"table": f"public.{name}", "snapshot": "copy"}, partition_key=partition_key,
                     business_key=key, ordering=[{"column": order, "direction": "desc"}],
                     columns=[c for c, _ in columns], total=None)


def _versions(rng: random.Random, originals: list[list], restate, *, updated: int,
              loaded: dt.datetime | None = None) -> list[tuple]:
    """The originals (stamped ``loaded`` at index ``updated`` when given), ~10% of them
    restated by ``restate`` at a later time, ~5% re-ingested as exact copies; the last
    column of each row is its ingest sequence."""
    rows = []
    for row in originals:
        if loaded is not None:
            row[updated] = loaded
        rows.append(row)
        if rng.random() < 0.10:
            newer = restate(list(row))
            newer[updated] = row[updated] + dt.timedelta(hours=rng.randrange(1, 48), seconds=len(rows))
            rows.append(newer)
        if rng.random() < 0.05:
            rows.append(list(rows[-1]))
    for n, row in enumerate(rows, start=1):
        row[-1] = n
    return [tuple(r) for r in rows]


# --- flights: carriers reuse flight numbers; the key is (carrier, flight, origin, sched_dep) -

FLIGHT_COLUMNS = (
    ("fl_date", "date"), ("carrier", "text"), ("flight", "int"), ("origin", "text"), ("dest", "text"),
    ("sched_dep", "timestamp"), ("sched_elapsed", "float8"), ("distance", "float8"),
    ("dep_delay", "int"), ("arr_delay", "int"), ("updated_at", "timestamptz"), ("ingest_seq", "bigint"),
)
FLIGHT_KEY = ["carrier", "flight", "origin", "sched_dep"]
AIRPORTS = ["ATL", "BOS", "DEN", "DFW", "JFK", "LAX", "ORD", "SEA"]
CARRIERS = ["AA", "DL", "UA"]


def flight_rows(seed: int = 7, per_carrier: int = 60) -> list[tuple]:
    """A few days of flights. Three carriers draw flight numbers from one range, numbers fly
    from several origins, and some flights have a "twin" equal to them in three of the four
    key columns (another carrier, number, origin or departure; same destination), so that
    every three-column part of the key merges flights. Route and scheduled elapsed time
    identify a flight; restatements change the delays only."""
    rng = random.Random(seed)
    distance = {(a, b): float(150 + 37 * i + 11 * j) for i, a in enumerate(AIRPORTS) for j, b in enumerate(AIRPORTS)}
    rows: list[tuple] = []
    for day in DAYS:
        keys: set[tuple] = set()
        flights = []

        def add(carrier: str, number: int, origin: str, dest: str, dep: dt.datetime) -> None:
            if (carrier, number, origin, dep) in keys or origin == dest:
                return
            keys.add((carrier, number, origin, dep))
            delay = rng.randrange(-10, 120)
            flights.append([day, carrier, number, origin, dest, dep, 60 + rng.randrange(0, 50) / 2,
                            distance[origin, dest], delay, delay + rng.randrange(-15, 16), None, None])

        for n in range(per_carrier * len(CARRIERS)):
            carrier, number = CARRIERS[n % len(CARRIERS)], rng.randrange(1, 400)
            origin, dest = rng.sample(AIRPORTS, 2)
            dep = dt.datetime.combine(day, dt.time(rng.randrange(6, 22), 15 * rng.randrange(4)))
            add(carrier, number, origin, dest, dep)
            if rng.random() < 0.12:  # a twin differing in one key column only
                which = n % 4
                add(CARRIERS[(n + 1) % 3] if which == 0 else carrier,
                    number + 1 if which == 1 else number,
                    rng.choice([a for a in AIRPORTS if a not in (origin, dest)]) if which == 2 else origin,
                    dest, dep + dt.timedelta(hours=3) if which == 3 else dep)

        def restate(row: list) -> list:
            row[8] += rng.randrange(5, 60)
            row[9] += rng.randrange(5, 60)
            return row

        loaded = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(6), tzinfo=UTC)
        rows += _versions(rng, flights, restate, updated=10, loaded=loaded)
    return rows


def test_flights_propose_carrier_flight_origin_sched_dep_not_the_flight_number(conn):
    """The old profile proposed [flight] here: a backfill by it keeps one flight per number."""
    _load(conn, "flights", FLIGHT_COLUMNS, flight_rows())
    profile = profile_source(conn, _spec("flights", "fl_date", ["flight"], "updated_at", FLIGHT_COLUMNS), None)
    assert profile.business_key == FLIGHT_KEY, profile.key_reason  # in table order
    assert profile.ordering == ["updated_at", "ingest_seq"]
    by_columns = {c.columns: c for c in profile.key_candidates}
    flight = by_columns[("flight",)]
    assert not flight.safe and flight.version_groups > 0
    assert flight.evidence_against[0].startswith("no other column stays the same within every group")
    chosen = profile.key_candidates[0]
    assert chosen.columns == tuple(FLIGHT_KEY) and chosen.safe and not chosen.evidence_against
    # dest and distance are fixed by (flight, origin) already; the scheduled duration is not.
    assert chosen.identity_columns == ["sched_elapsed"]
    assert chosen.clock == "updated_at" and chosen.clock_groups == chosen.version_groups
    # Every three-column part of the key merges flights, and says why.
    for left_out in FLIGHT_KEY:
        part = by_columns[tuple(c for c in FLIGHT_KEY if c != left_out)]
        assert not part.safe and part.evidence_against, part
    # The two carriers' flights with one number, from one airport at one time, agree on the
    # route: only the safe four-column key shows they are two flights (rule 4).
    twins = by_columns[("flight", "origin", "sched_dep")]
    assert "sched_elapsed never changes within a group of carrier, flight, origin, sched_dep (safe)" \
        in twins.evidence_against[-1]


def test_flights_a_route_holds_several_flights_each_with_versions(conn):
    _load(conn, "flights", FLIGHT_COLUMNS, flight_rows())
    profile = profile_source(conn, _spec("flights", "fl_date", ["flight"], "updated_at", FLIGHT_COLUMNS), None)
    route = next(c for c in profile.key_candidates if c.columns == ("origin", "dest"))
    # distance never changes within a route, yet split by carrier a route's rows fall into
    # parts that each still hold rows that differ (rule 3).
    assert "distance never changes within a group" in route.evidence_for
    assert not route.safe and any(a.startswith("split by ") for a in route.evidence_against)


def test_flights_profile_renders_and_reports_the_evidence(conn):
    _load(conn, "flights", FLIGHT_COLUMNS, flight_rows())
    profile = profile_source(conn, _spec("flights", "fl_date", ["flight"], "updated_at", FLIGHT_COLUMNS), None)
    text = render_profile(profile)
    assert "business key: ['carrier', 'flight', 'origin', 'sched_dep']" in text
    assert "    PROPOSED [carrier, flight, origin, sched_dep]: " in text
    assert "    unsafe   [flight]: " in text and "      - no other column stays the same" in text
    assert "    business_key: [carrier, flight, origin, sched_dep]" in text
    doc = profile.as_dict()
    assert doc["proposal"]["business_key"] == FLIGHT_KEY and doc["row_id_columns"] == ["ingest_seq"]
    first = doc["key_candidates"][0]
    assert first["columns"] == FLIGHT_KEY and first["safe"] and first["for"] and not first["against"]
    assert doc["key_search"]["partitions"] == 3 and doc["key_search"]["rows"] == profile.row_count
    assert doc["key_search"]["queries"] == profile.key_queries <= profile_mod.MAX_KEY_QUERIES + profile_mod.SPLIT_CHECKS


# --- sensors: one code on several sites; the sites differ only in float coordinates ------

SENSOR_COLUMNS = (
    ("d", "date"), ("sensor", "text"), ("site_lat", "float8"), ("site_lon", "float8"),
    ("reading", "float8"), ("updated_at", "timestamptz"), ("ingest_seq", "bigint"),
)


def sensor_rows(seed: int = 11, codes: int = 100, shared: int = 30, shared_from: int = 0) -> list[tuple]:
    """Readings per day of ``codes`` sensor codes, ``shared`` of them also on a second site
    from day ``shared_from`` on. A site is identified only by its float coordinates, which
    cannot be a key."""
    rng = random.Random(seed)
    sites = [(f"S{n:03d}", round(rng.uniform(40, 50), 4), round(rng.uniform(0, 10), 4)) for n in range(codes)]
    second = [(code, lat + 0.5, lon - 0.5) for code, lat, lon in sites[:shared]]
    rows: list[tuple] = []
    for i, day in enumerate(DAYS):
        here = sites + (second if i >= shared_from else [])
        readings = [[day, code, lat, lon, round(rng.uniform(0, 100), 2), None, None] for code, lat, lon in here]

        def restate(row: list) -> list:
            row[4] = round(row[4] + rng.uniform(0.5, 5), 2)
            return row

        loaded = dt.datetime.combine(day, dt.time(23), tzinfo=UTC)
        rows += _versions(rng, readings, restate, updated=5, loaded=loaded)
    return rows


def test_sensors_sharing_a_code_get_no_proposal_and_a_plain_reason(conn):
    """The old profile proposed [sensor] here: a backfill by it keeps one site per code."""
    _load(conn, "readings", SENSOR_COLUMNS, sensor_rows())
    profile = profile_source(conn, _spec("readings", "d", ["sensor"], "updated_at", SENSOR_COLUMNS), None)
    assert profile.business_key is None and profile.ordering is None
    assert profile.key_reason.startswith("no candidate key is safe")
    assert "sensor: no other column stays the same within every group: " in profile.key_reason
    assert "site_lat varies in" in profile.key_reason
    assert profile.key_reason.endswith("then run profile again")
    assert profile.key_candidates and not any(c.safe for c in profile.key_candidates)
    text = render_profile(profile)
    assert "business key: none proposed" in text and "    unsafe   [sensor]: " in text


def test_a_key_safe_on_the_first_partitions_but_not_on_all_is_not_proposed(conn):
    """Sites share codes only from the second day: the first day alone shows no merge."""
    rows = sensor_rows(shared_from=1)
    _load(conn, "readings", SENSOR_COLUMNS, rows)
    spec = _spec("readings", "d", ["sensor"], "updated_at", SENSOR_COLUMNS)
    first_day = sum(1 for r in rows if r[0] == DAYS[0])
    profile = profile_source(conn, spec, None, key_sample_rows=first_day)
    assert profile.key_partitions == 1 and profile.key_rows == first_day
    assert profile.business_key is None
    assert profile.key_reason.startswith("no candidate key is safe: sensor looked safe on the first "
                                         "partitions but not on all 3: no other column stays the same")
    # On the first day alone, [sensor] is safe.
    assert profile_source(conn, spec, [DAYS[0]]).business_key == ["sensor"]


# --- order lines: the key is (order_id, line_no) ---------------------------------------

LINE_COLUMNS = (
    ("d", "date"), ("order_id", "bigint"), ("line_no", "int"), ("sku", "text"), ("qty", "int"),
    ("unit_price", "numeric(10,2)"), ("updated_at", "timestamptz"), ("ingest_seq", "bigint"),
)


def line_rows(seed: int = 5, orders: int = 80) -> list[tuple]:
    """Orders of one to three lines; a line is restated with another quantity. The lines of
    an order share its timestamp, and some orders repeat a sku at another price."""
    rng = random.Random(seed)
    rows: list[tuple] = []
    for day in DAYS:
        lines = []
        for n in range(orders):
            order_id = day.toordinal() * 1000 + n
            at = dt.datetime.combine(day, dt.time(8), tzinfo=UTC) + dt.timedelta(minutes=5 * n)
            skus = rng.sample(range(40), 3)
            count = rng.choices([1, 2, 3], weights=[6, 3, 2])[0]
            for line_no in range(1, count + 1):
                sku = skus[0] if line_no == 3 and n % 2 else skus[line_no - 1]
                lines.append([day, order_id, line_no, f"SKU-{sku:02d}", rng.randrange(1, 5),
                              rng.randrange(100, 5000) / 100, at, None])

        def restate(row: list) -> list:
            row[4] += rng.randrange(1, 4)
            return row

        rows += _versions(rng, lines, restate, updated=6)
    return rows


def test_order_lines_propose_the_two_column_key(conn):
    """The old profile proposed [order_id] here: a backfill by it keeps one line per order."""
    _load(conn, "lines", LINE_COLUMNS, line_rows())
    profile = profile_source(conn, _spec("lines", "d", ["order_id"], "updated_at", LINE_COLUMNS), None)
    assert profile.business_key == ["order_id", "line_no"], profile.key_reason
    assert profile.ordering == ["updated_at", "ingest_seq"]
    by_columns = {c.columns: c for c in profile.key_candidates}
    assert not by_columns[("order_id",)].safe  # its orders hold several lines
    chosen = profile.key_candidates[0]
    assert chosen.columns == ("order_id", "line_no") and {"sku", "unit_price"} <= set(chosen.identity_columns)
    # The lines of one order share its timestamp, which groups them as well as order_id does;
    # rows that share every time were written together: not versions (rule 2).
    stamp = by_columns[("updated_at",)]
    assert stamp.identity_columns == ["order_id"] and not stamp.safe
    assert stamp.evidence_against[-1].startswith("every date/time column is in the key")


def test_the_demo_still_proposes_order_id_with_its_evidence(demo_db):
    profile = profile_source(demo_db, make_spec(), None)
    assert profile.business_key == ["order_id"]
    chosen = profile.key_candidates[0]
    assert chosen.columns == ("order_id",) and chosen.identity_columns == ["customer_id"]
    assert chosen.clock == "updated_at" and chosen.clock_groups < chosen.version_groups  # ties broken by ingest_seq
    assert "customer_id never changes within a group" in profile.key_reason
    assert profile.key_partitions == len(profile.partitions)


def test_a_key_chosen_on_the_first_partition_is_measured_again_on_all(demo_db):
    profile = profile_source(demo_db, make_spec(), None, key_sample_rows=1)
    assert profile.key_partitions == 1 < len(profile.partitions)
    assert profile.business_key == ["order_id"] and profile.ordering == ["updated_at", "ingest_seq"]
    chosen = next(c for c in profile.key_candidates if c.columns == ("order_id",))
    assert chosen.rows + chosen.null_key_rows == profile.row_count  # all partitions, not the first
    assert f"order_id: {chosen.groups} group(s) in {chosen.rows} non-NULL row(s)" in profile.key_reason
    assert "measured on the first 1 partition(s)" in render_profile(profile)
