"""Read-only inspection: identifiers checked against the catalog, the grain constraint."""

from __future__ import annotations

import pytest

from backfill_assets.core.errors import SpecError
from backfill_assets.core.pg.catalog import has_ordered_index, inspect_tables, unique_keys
from backfill_assets.core.vocabulary import TableRef
from backfill_assets_tests.support.specs import make_spec


def test_demo_tables_are_plannable(demo_db, factory):
    inspection = inspect_tables(demo_db, make_spec())
    assert inspection.problems == []
    assert inspection.partition_kind == "date"
    assert inspection.server.engine == "PostgreSQL" and inspection.server.version_num >= 120000
    assert inspection.target_unique_keys == [("orders_daily_order_key", ["order_id"])]
    assert inspection.grain_columns == ["order_id"]  # records can move: unique across days
    assert [c.type_name for c in inspection.spec_target_columns(make_spec())][:4] == [
        "date", "bigint", "bigint", "timestamp with time zone"
    ]


def test_missing_grain_constraint_is_refused_with_the_exact_ddl(demo_db, factory):
    demo_db.execute("ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key")
    inspection = inspect_tables(demo_db, make_spec(records_can_move=False))
    assert inspection.grain_ddl == (
        'ALTER TABLE "public"."orders_daily" ADD CONSTRAINT "orders_daily_order_date_order_id_key" '
        'UNIQUE ("order_date", "order_id");'
    )
    with pytest.raises(SpecError, match="no UNIQUE"):
        inspection.require_plannable()
    # The DDL it prints works and makes the spec plannable.
    demo_db.execute(inspection.grain_ddl.encode())
    assert inspect_tables(demo_db, make_spec(records_can_move=False)).problems == []


def test_a_narrower_unique_key_is_an_equivalent_grain(demo_db, factory):
    # UNIQUE (order_id) guarantees UNIQUE (order_date, order_id).
    problems = inspect_tables(demo_db, make_spec(records_can_move=False)).problems
    assert problems == []


def test_a_partial_unique_index_is_not_a_grain(demo_db, factory):
    demo_db.execute("ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key")
    demo_db.execute("CREATE UNIQUE INDEX ON public.orders_daily (order_id) WHERE amount > 0")
    assert any("no UNIQUE" in p for p in inspect_tables(demo_db, make_spec()).problems)


def test_unique_keys_are_read_from_the_catalog_in_one_query(demo_db):
    demo_db.execute(
        "CREATE TABLE public.keys_t (a int, b int, c text, d int, e int, f int, "
        "CONSTRAINT keys_t_pk PRIMARY KEY (b, a), CONSTRAINT keys_t_c UNIQUE (c))"
    )
    demo_db.execute("CREATE UNIQUE INDEX keys_t_d_inc ON public.keys_t (d) INCLUDE (e)")  # key columns only
    demo_db.execute("CREATE UNIQUE INDEX keys_t_partial ON public.keys_t (e) WHERE e > 0")  # not a grain
    demo_db.execute("CREATE UNIQUE INDEX keys_t_expr ON public.keys_t (lower(c))")  # not a grain
    demo_db.execute("CREATE UNIQUE INDEX keys_t_mixed ON public.keys_t (f, (f + 1))")  # not a grain
    demo_db.execute("CREATE INDEX keys_t_plain ON public.keys_t (f)")  # not unique
    assert unique_keys(demo_db, TableRef("public", "keys_t")) == [
        ("keys_t_pk", ["b", "a"]), ("keys_t_c", ["c"]), ("keys_t_d_inc", ["d"]),
    ]
    assert unique_keys(demo_db, TableRef("public", "no_such_table")) == []


def test_records_that_can_move_need_a_key_unique_across_the_table(demo_db, factory):
    demo_db.execute("ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key")
    demo_db.execute("ALTER TABLE public.orders_daily ADD UNIQUE (order_date, order_id)")
    assert inspect_tables(demo_db, make_spec(records_can_move=False)).problems == []
    problems = inspect_tables(demo_db, make_spec()).problems
    assert any("UNIQUE (order_id)" in p and "across the table" in p for p in problems)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"source": {"table": "public.nope", "snapshot": "copy"}}, "source table public.nope does not exist"),
        ({"target": {"table": 'public.x"; DROP TABLE orders_raw; --'}}, "does not exist"),
        ({"target": {"table": "public.café"}}, "target table public.café does not exist"),
        ({"columns": ["order_date", "order_id", "updated_at", "ingest_seq", "ghost"], "total": None},
         "target public.orders_daily has no column(s) ghost"),
        ({"ordering": [{"column": "ghost_ts", "direction": "desc"}]}, "source public.orders_raw has no column(s) ghost_ts"),
        ({"total": "status"}, "an additive total must be exact"),
    ],
)
def test_catalog_problems_are_named(demo_db, factory, changes, message):
    problems = inspect_tables(demo_db, make_spec(**changes)).problems
    assert any(message in p for p in problems), problems
    # Inspection is read-only: both tables are still there, unchanged.
    assert demo_db.execute("SELECT count(*) FROM public.orders_raw").fetchone()[0] > 0


def test_unsupported_partition_key_type_is_refused(conn, factory):
    conn.execute("CREATE TABLE public.src (ts timestamptz, k int, v int)")
    conn.execute("CREATE TABLE public.tgt (ts timestamptz, k int, v int, UNIQUE (ts, k))")
    spec = make_spec(source={"table": "public.src", "snapshot": "copy"}, target={"table": "public.tgt"},
                     partition_key="ts", business_key=["k"], columns=["ts", "k", "v"], total=None,
                     ordering=[{"column": "v", "direction": "desc"}])
    problems = inspect_tables(conn, spec).problems
    assert any("use a date, integer or text partition key" in p for p in problems)


@pytest.mark.parametrize(("ddl", "expected"), [
    ("CREATE UNIQUE INDEX ON t (d, k)", True),
    ("CREATE INDEX ON t (d, k, extra) INCLUDE (name)", True),
    ("CREATE INDEX ON t (k, d)", False),  # the partition must lead
    ("CREATE INDEX ON t (d, k DESC)", False),  # read ascending, NULLs last
    ("CREATE INDEX ON t (d, k) WHERE k > 0", False),  # partial: not every row
    ("CREATE INDEX ON t (d, (k + 0))", False),  # an expression, not the column
    ("CREATE INDEX ON t USING hash (d)", False),
])
def test_an_index_gives_the_business_key_order_only_if_it_leads_with_partition_then_key(conn, ddl, expected):
    conn.execute(b"CREATE TABLE t (d date, k bigint, extra int, name text)")
    conn.execute(ddl.encode())
    assert has_ordered_index(conn, TableRef("public", "t"), "d", [("k", False)]) is expected


def test_a_text_key_is_ordered_by_an_index_only_with_byte_order(conn):
    conn.execute(b"CREATE TABLE t (d date, name text)")
    conn.execute(b"CREATE INDEX ON t (d, name)")  # the database's collation: not byte order
    assert not has_ordered_index(conn, TableRef("public", "t"), "d", [("name", True)])
    conn.execute(b'CREATE INDEX ON t (d, name COLLATE "C")')
    assert has_ordered_index(conn, TableRef("public", "t"), "d", [("name", True)])
