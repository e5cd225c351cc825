"""The diff: the approved stage against the target (or stage B), exact on the canonical text
forms, against a real PostgreSQL."""

from __future__ import annotations

import json

import pytest

from backfill_assets.core.diff import diff_plan
from backfill_assets.core.engines.postgres.diff import diff_against
from backfill_assets.core.engines.postgres.resolve import resolve
from backfill_assets.core.engines.postgres.review import changes_of
from backfill_assets.core.errors import ApprovalError, SpecError
from backfill_assets.core.pg.db import repeatable_read
from backfill_assets.core.plan import make_plan
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets_tests.support.flows import approved, run
from backfill_assets_tests.support.specs import URL_ENV, make_spec

STATIC = make_spec(records_can_move=False)
DAYS = PartitionRequest("2024-01-01..2024-01-03")


def by_partition(result):
    return {p.partition: p for p in result.partitions}


def test_each_planted_difference_is_reported_exactly(unmoved_db, factory):
    db = unmoved_db
    plan = approved(db, factory, STATIC, DAYS)
    run(STATIC, plan, factory)  # the target now equals the stage: nothing differs
    clean = by_partition(diff_plan(STATIC, plan.plan_id, factory))
    assert all(not p.differs and p.unchanged == plan.approved(p.partition)["row_count"] for p in clean.values())
    keys = [r[0] for r in db.execute(
        "SELECT order_id FROM public.orders_daily WHERE order_date = '2024-01-01' ORDER BY order_id").fetchall()]
    db.execute("DELETE FROM public.orders_daily WHERE order_id = %s", (keys[0],))  # added (stage only)
    db.execute(  # removed (target only)
        "INSERT INTO public.orders_daily (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "VALUES ('2024-01-01', 1, 1, '2024-01-01', 1, 1.00, 'extra', 'not in the stage')")
    db.execute("UPDATE public.orders_daily SET note = note || '!' WHERE order_id = %s", (keys[1],))  # changed text
    empty = db.execute("SELECT order_id FROM public.orders_daily WHERE note = '' LIMIT 1").fetchone()[0]
    db.execute("UPDATE public.orders_daily SET note = NULL WHERE order_id = %s", (empty,))  # '' vs NULL
    moved = db.execute("SELECT order_id FROM public.orders_daily WHERE order_date = '2024-01-03' "
                       "ORDER BY order_id LIMIT 1").fetchone()[0]
    db.execute("UPDATE public.orders_daily SET order_date = '2024-01-02' WHERE order_id = %s", (moved,))
    result = diff_plan(STATIC, plan.plan_id, factory, limit=20)
    parts = by_partition(result)
    day1, day2, day3 = parts["2024-01-01"], parts["2024-01-02"], parts["2024-01-03"]
    examples = {(p.partition, e.kind, e.key["order_id"]): e for p in result.partitions for e in p.examples}
    assert (day1.added, day1.removed) == (1, 1) and (str(keys[0]) in {e.key["order_id"] for e in day1.examples})
    assert examples[("2024-01-01", "removed", "1")].values["note"] == [None, "not in the stage"]
    changed = examples[("2024-01-01", "changed", str(keys[1]))]
    assert changed.columns == ["note"] and changed.values["note"][1] == changed.values["note"][0] + "!"
    blank = next(e for k, e in examples.items() if k[1] == "changed" and k[2] == str(empty))
    assert blank.columns == ["note"] and blank.values["note"] == ["", None]
    # The key that moved in the target: added where the stage has it, removed where it went.
    assert examples[("2024-01-03", "added", str(moved))] and examples[("2024-01-02", "removed", str(moved))]
    total = sum(p.added + p.changed + p.unchanged for p in result.partitions)
    assert total == sum(plan.approved(label)["row_count"] for label in plan.labels)
    assert day3.added == 1 and day2.removed == 1
    assert json.loads(json.dumps(result.as_json()))["partitions"][0]["partition"] == "2024-01-01"


def test_the_counts_of_every_partition_at_once_are_each_partitions_own(unmoved_db, factory):
    """approve reads a PostgreSQL target's changes for all partitions in one statement, and a
    partition the target does not hold yet by counting stage A's rows: the same counts (and,
    asked for, the same first keys) as one comparison per partition, with differences planted
    in one partition, a key moved between two, and one partition missing from the target."""
    db = unmoved_db
    plan = approved(db, factory, STATIC, DAYS)
    run(STATIC, plan, factory)
    keys = [r[0] for r in db.execute(
        "SELECT order_id FROM public.orders_daily WHERE order_date = '2024-01-01' ORDER BY order_id").fetchall()]
    db.execute("DELETE FROM public.orders_daily WHERE order_id = %s", (keys[0],))
    db.execute("UPDATE public.orders_daily SET note = coalesce(note, '') || E'\\t☕' WHERE order_id = %s", (keys[1],))
    db.execute(
        "INSERT INTO public.orders_daily (order_date, order_id, customer_id, updated_at, ingest_seq, amount, status, note) "
        "VALUES ('2024-01-01', 1, 1, '2024-01-01', 1, 1.00, 'extra', NULL)")
    moved = db.execute("SELECT order_id FROM public.orders_daily WHERE order_date = '2024-01-03' "
                       "ORDER BY order_id LIMIT 1").fetchone()[0]
    db.execute("UPDATE public.orders_daily SET order_date = '2024-01-02' WHERE order_id = %s", (moved,))

    def both_ways(first):
        """changes_of, and one comparison per partition, in the same shape."""
        with factory() as conn:
            ctx = resolve(conn, STATIC, plan.labels)
            together = changes_of(conn, ctx, plan, first)
            with repeatable_read(conn, read_only=True):
                each = {label: diff_against(conn, ctx, label, "target", first) for label in plan.labels}
        return together, {label: {
            "added": d.added, "removed": d.removed, "changed": d.changed, "unchanged": d.unchanged,
            **({"first": [{"key": e.key, "kind": e.kind, "columns": e.columns if e.kind == "changed" else []}
                          for e in d.examples]} if first else {})} for label, d in each.items()}

    for first in (0, 2):
        together, each = both_ways(first)
        assert together == each
    assert together["2024-01-02"]["removed"] == 1
    db.execute("DELETE FROM public.orders_daily WHERE order_date = '2024-01-02'")  # a partition not there yet
    for first in (0, 2):
        together, each = both_ways(first)
        assert together == each
    assert together["2024-01-01"]["added"] == 1 and together["2024-01-01"]["removed"] == 1
    assert together["2024-01-01"]["changed"] == 1
    assert together["2024-01-03"]["added"] == 1 and len(together["2024-01-01"]["first"]) == 2
    day2 = plan.approved("2024-01-02")["row_count"]
    assert together["2024-01-02"]["added"] == day2 > 2 and together["2024-01-02"]["removed"] == 0
    assert [e["kind"] for e in together["2024-01-02"]["first"]] == ["added", "added"]


def _typed_spec(db):
    db.execute("CREATE TABLE public.vals_src (d date, k bigint, f float8, n numeric, t text, seq int)")
    db.execute("CREATE TABLE public.vals_tgt (d date, k bigint, f float8, n numeric, t text, UNIQUE (d, k))")
    db.execute("INSERT INTO public.vals_src VALUES ('2024-01-01', 1, 0, 1.5, 'x', 1), ('2024-01-01', 2, 1, 2, '', 1), "
               "('2024-01-01', 3, -0.0, 1.50, 'same', 1)")
    return spec_from_mapping({
        "name": "vals", "database_url_env": URL_ENV, "source": {"table": "public.vals_src", "snapshot": "copy"},
        "target": {"table": "public.vals_tgt"}, "partition_key": "d", "business_key": ["k"],
        "ordering": [{"column": "seq", "direction": "desc"}], "columns": ["d", "k", "f", "n", "t"],
        "transform_version": "v1",
    })


def test_differences_typed_equality_misses_are_differences(conn, factory):
    spec = _typed_spec(conn)
    plan = approved(conn, factory, spec, PartitionRequest("2024-01-01"))
    # Equal as values, different as text: -0 vs 0, 1.5 vs 1.50, '' vs NULL; and one truly equal row.
    conn.execute("INSERT INTO public.vals_tgt VALUES ('2024-01-01', 1, '-0'::float8, 1.50, 'x'), "
                 "('2024-01-01', 2, 1, 2, NULL), ('2024-01-01', 3, 0, 1.50, 'same')")
    (part,) = diff_plan(spec, plan.plan_id, factory).partitions
    assert (part.added, part.removed, part.changed, part.unchanged) == (0, 0, 2, 1)
    first, second = part.examples
    assert first.key == {"k": "1"} and first.columns == ["f", "n"]
    assert first.values == {"f": ["0", "-0"], "n": ["1.5", "1.50"]}
    assert second.key == {"k": "2"} and second.values == {"t": ["", None]}
    assert conn.execute("SELECT count(*) FROM public.vals_tgt AS t JOIN backfill_control.vals__stage_a AS s "
                        "USING (d, k) WHERE (s.f, s.n, s.t) = (t.f, t.n, t.t)").fetchone()[0] == 2  # typed equality: 2


def test_against_stage_b_limits_partitions_and_bad_input(unmoved_db, factory):
    plan = make_plan(STATIC, DAYS, factory)
    same = diff_plan(STATIC, plan.plan_id, factory, against="stage_b", request=PartitionRequest("2024-01-02"))
    assert [p.partition for p in same.partitions] == ["2024-01-02"] and not same.partitions[0].differs
    with pytest.raises(SpecError, match="not in plan"):
        diff_plan(STATIC, plan.plan_id, factory, request=PartitionRequest("2024-01-09"))
    with pytest.raises(SpecError, match="--limit"):
        diff_plan(STATIC, plan.plan_id, factory, limit=-1)
    no_examples = diff_plan(STATIC, plan.plan_id, factory, limit=0)
    assert all(p.examples == [] for p in no_examples.partitions) and any(p.differs for p in no_examples.partitions)


def test_a_rebuilt_stage_is_refused_rather_than_diffed(unmoved_db, factory):
    plan = make_plan(STATIC, DAYS, factory)
    unmoved_db.execute("UPDATE backfill_control.orders_daily__stage_a SET note = 'x' WHERE order_date = '2024-01-02'")
    with pytest.raises(ApprovalError, match="no longer holds plan"):
        diff_plan(STATIC, plan.plan_id, factory)


def test_diff_from_the_command_line_prints_one_json_object_and_exits_0(unmoved_db, url_env, tmp_path, capsys):
    import yaml

    from backfill_assets.cli.commands import main
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(STATIC.model_dump(mode="json", exclude_none=True)))
    assert main(["plan", "--spec", str(path), "--partitions", "2024-01-01..2024-01-02", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["diff", "--spec", str(path), "--plan", plan["plan_id"][:12], "--json", "--limit", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"plan_id", "against", "partitions"} and out["against"] == "target"
    first = out["partitions"][0]
    assert set(first) == {"partition", "added", "removed", "changed", "unchanged", "examples"}
    assert len(first["examples"]) == 2 and set(first["examples"][0]) >= {"key", "kind", "columns"}
    assert main(["diff", "--spec", str(path), "--plan", plan["plan_id"][:12], "--limit", "1"]) == 0
    text = capsys.readouterr().out
    # The stale demo target: its three old rows a day are changed; the example shows both values.
    assert "2024-01-01" in text and "    changed  (order_id=" in text and "-> 'stale'" in text


def test_approve_shows_what_the_replacement_changes_before_asking(unmoved_db, url_env, tmp_path, capsys):
    import yaml

    from backfill_assets.cli.commands import main
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(STATIC.model_dump(mode="json", exclude_none=True)))
    assert main(["plan", "--spec", str(path), "--partitions", "2024-01-01..2024-01-02", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert main(["approve", "--spec", str(path), "--plan", plan["plan_id"], "--by", "alice", "--yes"]) == 0
    text = capsys.readouterr().out
    assert "what the replacement changes" in text and "unchanged" in text.split("The target now")[1]
    # The stale demo target holds 3 old rows a day under keys the stage also has: all changed.
    assert main(["approve", "--spec", str(path), "--plan", plan["plan_id"], "--by", "alice", "--yes", "--json"]) == 0
    changes = json.loads(capsys.readouterr().out)["changes"]
    for label in ("2024-01-01", "2024-01-02"):
        rows = next(p for p in plan["partitions"] if p["partition"] == label)["stage_a"]["row_count"]
        c = changes[label]
        assert c["removed"] == 0 and c["added"] + c["changed"] + c["unchanged"] == rows and c["changed"] == 3


def test_a_refused_plan_names_its_first_differing_keys_and_columns(unmoved_db, factory):
    from backfill_assets.core.errors import DeterminismError
    unmoved_db.execute(
        "CREATE FUNCTION public.jitter() RETURNS int LANGUAGE plpgsql IMMUTABLE "
        "AS $$ BEGIN RETURN floor(random() * 1000000)::int; END $$"
    )
    transform = ("SELECT order_date, order_id, customer_id + jitter() AS customer_id, updated_at, "
                 "ingest_seq, amount, status, note FROM source")
    spec = make_spec(transform_sql=transform, records_can_move=False,
                     trusted_functions=[{"name": "public.jitter", "reason": "a test of a wrong trust"}])
    plan = make_plan(spec, PartitionRequest("2024-01-01"), factory)
    assert plan.status == "refused"
    named = [p for p in plan.problems if p.startswith("partition 2024-01-01: first differing key(s)")]
    assert len(named) == 1 and named[0].count("(order_id=") == 3 and named[0].count("differs in customer_id") == 3
    assert "first differing key(s)" in str(plan.refusal())
    assert isinstance(plan.refusal(), DeterminismError)


def test_a_failed_check_after_commit_names_the_differing_keys_in_its_error_and_ledger(unmoved_db, factory, db_url):
    import psycopg

    from backfill_assets.core.errors import VerificationError
    from backfill_assets.core.store import ledger
    plan = approved(unmoved_db, factory, STATIC, DAYS)
    victim = {}

    def another_writer(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-02"]:  # between our commit and our check
            with psycopg.connect(db_url.reveal(), autocommit=True) as other:
                victim["id"] = other.execute(
                    "UPDATE public.orders_daily SET status = 'meddled' WHERE order_id = ("
                    "SELECT min(order_id) FROM public.orders_daily WHERE order_date = '2024-01-02') "
                    "RETURNING order_id").fetchone()[0]

    with pytest.raises(VerificationError) as err:
        run(STATIC, plan, factory, checkpoint=another_writer)
    assert err.value.step == "verification after commit"
    assert f"(order_id={victim['id']}) differs in status" in str(err.value) and "meddled" not in str(err.value)
    states = {r["partition"]: r for r in ledger.ledger_status(unmoved_db, STATIC)}
    assert states["2024-01-02"]["status"] == "failed" and f"order_id={victim['id']}" in states["2024-01-02"]["error"]
