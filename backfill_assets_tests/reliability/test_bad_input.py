"""The bad-input catalogue: every case is refused with a clear message and a non-zero exit,
and the target's fingerprint does not change. Counted in docs/reliability.md."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from backfill_assets.cli.commands import main
from backfill_assets.core.errors import TransientDatabaseError
from backfill_assets.core.pg.db import DatabaseUrl, connect
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets_tests.support.flows import DAYS8, target_hashes
from backfill_assets_tests.support.specs import CANARY, DEMO_SPEC, URL_ENV

WEEK = "2024-01-01..2024-01-07"
VOLATILE_FN = ("CREATE FUNCTION public.shaky(x int) RETURNS int LANGUAGE plpgsql VOLATILE "
               "AS $$ BEGIN RETURN x; END $$")
JITTER_FN = ("CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
             "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$")
READS_TABLE_FN = ("CREATE FUNCTION public.status_of(x bigint) RETURNS text LANGUAGE sql IMMUTABLE "
                  "AS 'SELECT max(r.status) FROM public.orders_raw AS r WHERE r.order_id = x'")
CALLS_RANDOM_FN = ("CREATE FUNCTION public.noise(x int) RETURNS int LANGUAGE sql IMMUTABLE "
                   "AS 'SELECT x + floor(random() * 10)::int'")
CALLS_NOISE_FN = ("CREATE FUNCTION public.shifted(x int) RETURNS int LANGUAGE sql IMMUTABLE "
                  "AS 'SELECT public.noise(x) + 1'")
# A function the spec trusts wrongly: it passes the guard, and building twice catches it.
TRUST_JITTER = [{"name": "public.jitter", "reason": "a test of a wrong trust"}]
COLS = "order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note"


def static(**changes: Any) -> dict[str, Any]:
    return {"records_can_move": False, **changes}


def transform(expr: str) -> dict[str, Any]:
    return static(transform_sql=" ".join(["SELECT", COLS + ",", expr, "AS extra FROM source"]))


# (id, spec changes, command, setup SQL, exit code, message)
CASES: list[tuple[str, dict[str, Any] | str, list[str], list[str], int, str]] = [
    ("name-uppercase", {"name": "Orders"}, ["plan", "--partitions", WEEK], [], 2, "name"),
    ("unknown-spec-key", {"surprise": True}, ["plan", "--partitions", WEEK], [], 2, "surprise: Extra inputs are not permitted"),
    ("malformed-yaml", "name: [unclosed\n", ["plan", "--partitions", WEEK], [], 2, "not valid YAML at line"),
    ("spec-not-a-mapping", "- just\n- a list\n", ["plan", "--partitions", WEEK], [], 2, "must be a YAML mapping"),
    ("url-in-env-name", {"database_url_env": "postgresql://u:" + CANARY + "@h/db"}, ["plan", "--partitions", WEEK], [], 2,
     "NAME of an environment variable"),
    ("target-quote-semicolon", {"target": {"table": 'public.x"; DROP TABLE orders_raw; --'}}, ["plan", "--partitions", WEEK], [], 2,
     'target table public.x"; DROP TABLE orders_raw; -- does not exist'),
    ("source-semicolon", {"source": {"table": "public.orders_raw; DROP TABLE t", "snapshot": "copy"}},
     ["plan", "--partitions", WEEK], [], 2, "source table public.orders_raw; DROP TABLE t does not exist"),
    ("unicode-table", {"target": {"table": "public.zamówienia"}}, ["plan", "--partitions", WEEK], [], 2,
     "target table public.zamówienia does not exist"),
    ("identifier-over-63-bytes", {"partition_key": "é" * 32}, ["plan", "--partitions", WEEK], [], 2, "longer than 63 bytes"),
    ("column-with-quote", static(columns=["order_date", "order_id", "updated_at", "ingest_seq", 'note"'], total=None),
     ["plan", "--partitions", WEEK], [], 2, 'has no column(s) note"'),
    ("missing-source-table", {"source": {"table": "public.nope", "snapshot": "copy"}}, ["plan", "--partitions", WEEK], [], 2,
     "source table public.nope does not exist"),
    ("missing-target-column", static(columns=["order_date", "order_id", "updated_at", "ingest_seq", "ghost"], total=None),
     ["plan", "--partitions", WEEK], [], 2, "has no column(s) ghost"),
    ("missing-ordering-column", {"ordering": [{"column": "ghost_ts", "direction": "desc"}]}, ["plan", "--partitions", WEEK], [], 2,
     "has no column(s) ghost_ts"),
    ("partition-key-type-mismatch", {}, ["plan", "--partitions", WEEK],
     ["ALTER TABLE public.orders_raw ALTER COLUMN order_date TYPE text"], 2, "is text in the source but date in the target"),
    ("partition-not-a-date", {}, ["plan", "--partitions", "2024-13-01"], [], 2, "is not a date"),
    ("partition-garbage", {}, ["plan", "--partitions", "yesterday"], [], 2, "is not a date"),
    ("partition-range-reversed", {}, ["plan", "--partitions", "2024-01-05..2024-01-01"], [], 2, "ends before it starts"),
    ("partition-empty-item", {}, ["plan", "--partitions", "2024-01-01,,2024-01-02"], [], 2, "empty item"),
    ("missing-grain-constraint", {}, ["plan", "--partitions", WEEK],
     ["ALTER TABLE public.orders_daily DROP CONSTRAINT orders_daily_order_key"], 2, "ADD CONSTRAINT"),
    ("total-not-exact", {"total": "status"}, ["plan", "--partitions", WEEK], [], 2, "must be exact"),
    ("key-includes-partition", {"business_key": ["order_date"]}, ["plan", "--partitions", WEEK], [], 2, "must not include partition_key"),
    ("moving-needs-copy", {"source": {"table": "public.orders_raw", "snapshot": "immutable"}},
     ["plan", "--partitions", WEEK], [], 2, "records_can_move needs `snapshot: copy`"),
    ("ordering-with-ties", {"ordering": [{"column": "updated_at", "direction": "desc"}]}, ["plan", "--partitions", WEEK], [], 4,
     "tie on every ordering column"),
    ("nulls-in-ordering", {}, ["plan", "--partitions", WEEK],
     ["ALTER TABLE public.orders_raw ALTER COLUMN ingest_seq DROP NOT NULL",
      "UPDATE public.orders_raw SET ingest_seq = NULL WHERE order_id IS NOT NULL AND ingest_seq = 5"], 4,
     "ingest_seq: 1 row(s)"),
    ("null-business-keys-only", {}, ["plan", "--partitions", WEEK],
     ["UPDATE public.orders_raw SET order_id = NULL WHERE order_date = '2024-01-06'"], 4,
     "every source row of some partitions has a NULL business key"),
    ("transform-now", transform("now()"), ["plan", "--partitions", WEEK], [], 2,
     "now() reads the transaction's start time"),
    ("transform-random", transform("random()"), ["plan", "--partitions", WEEK], [], 2, "random() reads a random generator"),
    ("transform-user-volatile", transform("shaky(1)"), ["plan", "--partitions", WEEK], [VOLATILE_FN], 2,
     "shaky(integer) is VOLATILE, not IMMUTABLE"),
    # Functions outside pg_catalog labelled IMMUTABLE, which PostgreSQL does not check.
    ("transform-untrusted-plpgsql", transform("jitter()"), ["plan", "--partitions", WEEK], [JITTER_FN], 2,
     "public.jitter() is written in plpgsql, which the guard cannot read"),
    ("transform-sql-function-reads-table", transform("status_of(order_id)"), ["plan", "--partitions", WEEK],
     [READS_TABLE_FN], 2, "public.status_of(bigint) is labelled IMMUTABLE, but its body reads public.orders_raw"),
    ("transform-sql-function-calls-random", transform("shifted(1)"), ["plan", "--partitions", WEEK],
     [CALLS_RANDOM_FN, CALLS_NOISE_FN], 2, "public.noise(integer) is labelled IMMUTABLE, but its body is refused: "
     "random() reads a random generator"),
    # Order- and session-dependent transforms: legal SQL whose rows can change between runs.
    ("transform-current-user", transform("current_user"), ["plan", "--partitions", WEEK], [], 2,
     "current_user at line 1, column 89"),
    ("transform-current-timestamp", transform("current_timestamp"), ["plan", "--partitions", WEEK], [], 2,
     "current_timestamp at line 1"),
    ("transform-now-literal", transform("'now'::timestamptz"), ["plan", "--partitions", WEEK], [], 2,
     "reads the clock when the statement is parsed"),
    ("transform-row-number-over-nothing", transform("row_number() OVER ()"), ["plan", "--partitions", WEEK], [], 2,
     "row_number() OVER (...) at line 1"),
    ("transform-limit-in-subquery", transform("(SELECT s.note FROM source s LIMIT 1)"), ["plan", "--partitions", WEEK],
     [], 2, "LIMIT at line 1"),
    ("transform-distinct-on-in-cte", static(transform_sql=(
        "WITH d AS (SELECT DISTINCT ON (order_id) " + COLS + " FROM source ORDER BY order_id, updated_at) "
        "SELECT " + COLS + " FROM d")), ["plan", "--partitions", WEEK], [], 2, "DISTINCT ON at line 1"),
    ("transform-string-agg-unordered", transform("(SELECT string_agg(s.note, ',') FROM source s)"),
     ["plan", "--partitions", WEEK], [], 2, "string_agg() combines rows in the order they arrive"),
    ("transform-group-by-unscaled-numeric", transform(
        "(SELECT count(*) FROM (SELECT s.amount / 3 AS a FROM source s GROUP BY 1) g)"),
     ["plan", "--partitions", WEEK], [], 2, "GROUP BY on a"),
    ("transform-dml", static(transform_sql="DELETE FROM source"), ["plan", "--partitions", WEEK], [], 2, "must be a SELECT"),
    ("transform-two-statements", static(transform_sql="SELECT 1; SELECT 2"), ["plan", "--partitions", WEEK], [], 2,
     "exactly one SELECT statement"),
    ("transform-other-table", static(transform_sql="SELECT o.* FROM source JOIN public.orders_daily o ON true"),
     ["plan", "--partitions", WEEK], [], 2, "it reads public.orders_daily"),
    ("missing-env-var", {"database_url_env": "BFA_NOT_SET_ANYWHERE"}, ["plan", "--partitions", WEEK], [], 3,
     "environment variable BFA_NOT_SET_ANYWHERE is not set"),
    ("unreachable-host", "UNREACHABLE", ["plan", "--partitions", WEEK], [], 3, "cannot connect"),
    ("wrong-password", "WRONG_PASSWORD", ["plan", "--partitions", WEEK], [], 3, "password authentication failed"),
    ("approve-unknown-plan", {}, ["approve", "--plan", "0123456789abcdef", "--by", "x", "--yes"], [], 6, "no plans exist"),
    ("approve-short-plan-id", {}, ["approve", "--plan", "abc", "--by", "x", "--yes"], [], 2, "at least 8 hex digits"),
    ("approve-refused-plan", static(trusted_functions=TRUST_JITTER, transform_sql=(
        "SELECT order_date, order_id, customer_id + jitter() AS customer_id, updated_at, ingest_seq, amount, "
        "status, note FROM source")), ["approve", "--plan", "{plan}", "--by", "x", "--yes"], [JITTER_FN], 6, "was refused"),
    ("apply-unapproved-plan", {}, ["apply", "--plan", "{plan}"], [], 6, "has not been approved"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(case, demo_db, url_env, tmp_path, capsys, monkeypatch, request):
    name, changes, command, setup, code, message = case
    spec_file = tmp_path / "spec.yaml"
    if isinstance(changes, str) and changes in ("UNREACHABLE", "WRONG_PASSWORD"):
        url = (f"postgresql://bfa:{CANARY}@127.0.0.1:9/nowhere" if changes == "UNREACHABLE"
               else request.getfixturevalue("password_role"))
        monkeypatch.setenv(URL_ENV, url)
        spec_file.write_text(yaml.safe_dump(DEMO_SPEC), encoding="utf-8")
    elif isinstance(changes, str):
        spec_file.write_text(changes, encoding="utf-8")
    else:
        spec_file.write_text(yaml.safe_dump({**DEMO_SPEC, **changes}), encoding="utf-8")
    for statement in setup:
        demo_db.execute(statement.encode())
    if "{plan}" in command:
        main(["plan", "--spec", str(spec_file), "--partitions", "2024-01-01,2024-01-02", "--json"])
        plan_id = json.loads(capsys.readouterr().out)["plan_id"]
        command = [c.replace("{plan}", plan_id) for c in command]
    plans_before = demo_db.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill_control'").fetchone()[0]
    before = target_hashes(demo_db, DAYS8)

    exit_code = main([command[0], "--spec", str(spec_file), *command[1:]])
    out, err = capsys.readouterr()

    assert exit_code == code, err
    assert message in err, err
    assert err.strip().splitlines()[-1].startswith("error: ") and CANARY not in out + err
    assert target_hashes(demo_db, DAYS8) == before
    if command[0] == "plan":  # a refused plan writes nothing, not even the control schema
        assert demo_db.execute("SELECT to_regnamespace('backfill_control')").fetchone()[0] is None
    else:
        tables = demo_db.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'backfill_control'").fetchone()[0]
        assert tables == plans_before


def test_the_catalogue_has_at_least_thirty_cases():
    assert len(CASES) >= 30


SIDE_TABLE = "CREATE TABLE public.bfa_side (x int)"
READS_SIDE_FN = ("CREATE FUNCTION public.reads_side(x int) RETURNS int LANGUAGE sql IMMUTABLE "
                 "AS 'SELECT x + (SELECT count(*)::int FROM public.bfa_side)'")


def test_a_lock_timeout_while_guarding_the_transform_is_transient_not_a_refusal(demo_db, db_url: DatabaseUrl,
                                                                                url_env, tmp_path, capsys):
    """The guard analyses a SQL function's body, which waits for a lock another session holds
    on a table the body reads: a retryable timeout (exit 8), not a refused spec (exit 2)."""
    demo_db.execute(SIDE_TABLE)
    demo_db.execute(READS_SIDE_FN)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump({**DEMO_SPEC, **transform("reads_side(1)"), "lock_timeout_ms": 300}),
                         encoding="utf-8")
    with connect(db_url, DEFAULT_LIMITS) as holder:
        with holder.transaction():
            holder.execute("LOCK TABLE public.bfa_side IN ACCESS EXCLUSIVE MODE")
            exit_code = main(["plan", "--spec", str(spec_file), "--partitions", WEEK])
    out, err = capsys.readouterr()
    assert exit_code == TransientDatabaseError.exit_code, err
    assert "LockNotAvailable" in err and "safe to retry" in err and "refused" not in err, err
    assert demo_db.execute("SELECT to_regnamespace('backfill_control')").fetchone()[0] is None
