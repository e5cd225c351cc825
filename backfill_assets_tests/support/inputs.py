"""A fact joined with a dimension and a second fact (core.spec_inputs), for the tests of a
transform over several inputs: the tables, their rows and the spec."""

from __future__ import annotations

import datetime as dt

import psycopg

from backfill_assets_tests.support.specs import URL_ENV

DAYS = "2024-01-01..2024-01-03"
COLUMNS = ["order_date", "order_id", "customer_id", "region", "paid", "updated_at", "seq", "amount"]
TRANSFORM = (
    "SELECT s.order_date, s.order_id, s.customer_id, c.region, coalesce(p.paid, 0) AS paid, s.updated_at, s.seq, "
    "s.amount FROM source AS s LEFT JOIN customers AS c ON c.customer_id = s.customer_id "
    "LEFT JOIN (SELECT order_id, paid_on, sum(paid) AS paid FROM payments GROUP BY order_id, paid_on) AS p "
    "ON p.order_id = s.order_id AND p.paid_on = s.order_date"
)
INPUTS_SPEC = {
    "name": "orders_enriched", "database_url_env": URL_ENV,
    "source": {"table": "public.orders_raw"},
    "inputs": {"customers": {"table": "public.customers"},
               "payments": {"table": "public.payments", "partition_key": "paid_on"}},
    "target": {"table": "public.orders_enriched"},
    "partition_key": "order_date", "business_key": ["order_id"],
    "ordering": [{"column": "updated_at", "direction": "desc"}, {"column": "seq", "direction": "desc"}],
    "columns": COLUMNS, "total": "amount", "transform_version": "v1", "transform_sql": TRANSFORM,
}
T = dt.datetime(2024, 1, 5, tzinfo=dt.timezone.utc)
# order_date, order_id, customer_id, updated_at, seq, amount: order 2 has two versions, 6 lies
# outside the plan's days.
ORDERS = [("2024-01-01", 1, 10, T, 1, "5.00"), ("2024-01-01", 2, 11, T, 1, "6.00"),
          ("2024-01-01", 2, 11, T, 2, "7.00"), ("2024-01-02", 3, 12, T, 1, "8.00"),
          ("2024-01-03", 4, 99, T, 1, "9.00"), ("2024-01-04", 6, 10, T, 1, "1.00")]
CUSTOMERS = [(10, "north ünïcödé"), (11, "south\ttab"), (12, None)]
PAYMENTS = [("2024-01-01", 1, "2.00"), ("2024-01-01", 1, "3.00"), ("2024-01-02", 3, "8.00"),
            ("2024-01-04", 4, "9.00")]  # order 4 paid a day late: not its day's payment


def load_inputs(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE public.orders_raw (order_date date, order_id bigint, customer_id bigint, "
                 "updated_at timestamptz, seq int, amount numeric(12,2))")
    conn.execute("CREATE TABLE public.customers (customer_id bigint PRIMARY KEY, region text)")
    conn.execute("CREATE TABLE public.payments (paid_on date, order_id bigint, paid numeric(12,2))")
    conn.execute("CREATE TABLE public.orders_enriched (order_date date, order_id bigint, customer_id bigint, "
                 "region text, paid numeric(12,2), updated_at timestamptz, seq int, amount numeric(12,2), "
                 "UNIQUE (order_date, order_id))")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO public.orders_raw VALUES (%s, %s, %s, %s, %s, %s)", ORDERS)
        cur.executemany("INSERT INTO public.customers VALUES (%s, %s)", CUSTOMERS)
        cur.executemany("INSERT INTO public.payments VALUES (%s, %s, %s)", PAYMENTS)
    conn.commit()
