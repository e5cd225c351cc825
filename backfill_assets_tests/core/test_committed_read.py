"""The read after the commit on a PostgreSQL target: by the write's seal where the table lets
nothing else change its rows, in full otherwise; a change after the commit is never passed.
Real PostgreSQL; the demo flow."""

from __future__ import annotations

import psycopg
import pytest

from backfill_assets.core.engines.postgres.target import PostgresTarget
from backfill_assets.core.errors import VerificationError
from backfill_assets_tests.support.flows import approved, run
from backfill_assets_tests.support.specs import make_spec

pytestmark = pytest.mark.postgres

SPEC = make_spec()


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """How each committed read of the run was made ("seal" or "full"), in order."""
    seen: list[str] = []
    original = PostgresTarget._read_committed

    def spy(self, labels):
        out = original(self, labels)
        seen.append(self.last_committed_read)
        return out

    monkeypatch.setattr(PostgresTarget, "_read_committed", spy)
    return seen


def statuses(result) -> set[str]:
    return {p["status"] for p in result.partitions}


def test_a_plain_table_is_read_back_by_its_seal(demo_db, factory, reads):
    result = run(SPEC, approved(demo_db, factory, SPEC), factory)
    assert statuses(result) == {"verified"} and reads and set(reads) == {"seal"}


@pytest.mark.parametrize("setup", [
    "CREATE FUNCTION public.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; "
    "CREATE TRIGGER t BEFORE INSERT ON public.orders_daily FOR EACH ROW EXECUTE FUNCTION public.noop()",
    "CREATE RULE r AS ON UPDATE TO public.orders_daily DO ALSO NOTIFY orders",
    "ALTER TABLE public.orders_daily ENABLE ROW LEVEL SECURITY",
], ids=["trigger", "rule", "row-security"])
def test_a_table_that_could_change_its_own_rows_is_read_back_in_full(demo_db, factory, reads, setup):
    demo_db.execute(setup)
    result = run(SPEC, approved(demo_db, factory, SPEC), factory)
    assert statuses(result) == {"verified"} and set(reads) == {"full"}


def test_a_trigger_that_rewrites_rows_at_the_commit_is_caught_after_it(demo_db, factory, reads):
    """A deferred constraint trigger fires at the commit, after the verification before it,
    and writes under the same transaction id: the seal could not see it, so such a table is
    read back in full, and the change is found."""
    demo_db.execute(
        "CREATE FUNCTION public.late() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "UPDATE public.orders_daily SET note = 'changed at commit' WHERE order_id = NEW.order_id "
        "AND note IS DISTINCT FROM 'changed at commit'; RETURN NULL; END $$; "
        "CREATE CONSTRAINT TRIGGER late AFTER INSERT ON public.orders_daily DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION public.late()"
    )
    with pytest.raises(VerificationError, match="verification after commit"):
        run(SPEC, approved(demo_db, factory, SPEC), factory)
    assert reads == ["full"]


@pytest.mark.parametrize(("write", "outcome"), [
    ("UPDATE public.orders_daily SET amount = amount + 1 WHERE order_date = '2024-01-02' "
     "AND order_id = (SELECT min(order_id) FROM public.orders_daily WHERE order_date = '2024-01-02')", "refused"),
    ("DELETE FROM public.orders_daily WHERE order_date = '2024-01-02' "
     "AND order_id = (SELECT min(order_id) FROM public.orders_daily WHERE order_date = '2024-01-02')", "refused"),
    # The same row again, written by another transaction: the seal breaks, the full read passes.
    ("WITH d AS (DELETE FROM public.orders_daily WHERE order_date = '2024-01-02' AND order_id = "
     "(SELECT min(order_id) FROM public.orders_daily WHERE order_date = '2024-01-02') RETURNING *) "
     "INSERT INTO public.orders_daily SELECT * FROM d", "verified"),
], ids=["update", "delete", "same-row-rewritten"])
def test_a_write_between_the_commit_and_the_read_is_never_passed_by_the_seal(
        demo_db, factory, db_url, reads, write, outcome):
    def slip_in(step: str, labels: list[str]) -> None:
        if step == "committed" and labels == ["2024-01-02"]:
            with psycopg.connect(db_url.reveal(), autocommit=True) as writer:
                writer.execute(write)

    plan = approved(demo_db, factory, SPEC)
    if outcome == "refused":
        with pytest.raises(VerificationError, match="verification after commit"):
            run(SPEC, plan, factory, checkpoint=slip_in)
    else:
        assert statuses(run(SPEC, plan, factory, checkpoint=slip_in)) == {"verified"}
    assert reads[:2] == ["seal", "full"]
