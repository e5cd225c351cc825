"""The scripted demo (``backfill-assets demo``): the whole flow on the embedded PostgreSQL.

It loads the messy sample source of :mod:`backfill_assets.cli.demo` (and writes it as the Spark
example's Parquet folder), then inspects, profiles,
plans, approves, applies, shows the ledger, runs the same backfill again, then (with the lake
specs) into Delta and on DuckDB, audits the targets, and ends with hourly time windows over the
night New York's clocks fall back, printing each step. The command line only parses its arguments and calls :func:`run_demo`.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from psycopg import sql

from backfill_assets.cli import demo
from backfill_assets.core.apply import ApplyResult, apply_plan
from backfill_assets.core.approve import confirm, review
from backfill_assets.core.audit import audit_spec
from backfill_assets.core.errors import VerificationError
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import ConnectionFactory, connection_factory, url_from_env
from backfill_assets.core.plan import make_plan
from backfill_assets.core.profile.propose import profile_spec
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.resolve import inspect
from backfill_assets.core.spec import DeltaSourceSpec, DeltaTargetSpec, ParquetSourceSpec, Spec
from backfill_assets.core.store.ledger import ledger_status
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.render import (
    render_apply,
    render_audit,
    render_plan,
    render_profile,
    render_replacement,
    render_status,
)


class Printer(Protocol):
    """Where the demo writes: results for people, progress on the side."""

    def result(self, text: str) -> None: ...

    def progress(self, event: ProgressEvent) -> None: ...


def run_demo(spec: Spec, partitions: str, out: Printer, lake_spec: Spec | None = None,
             duck_spec: Spec | None = None, spark_spec: Spec | None = None, windows_spec: Spec | None = None,
             inputs_spec: Spec | None = None) -> None:
    """Run the demo of ``spec`` over ``partitions`` on the embedded PostgreSQL; then, with
    ``lake_spec`` (a Delta target), the same backfill into a Delta Lake table; then, with
    ``duck_spec`` (engine duckdb), the whole process on DuckDB from a Delta source. With
    ``spark_spec`` (engine spark, a Parquet folder source), its source folder is written from
    the sample rows at the start, for the user to run on Spark (the demo starts no Spark). With
    ``windows_spec`` (time windows of a time stamp), hours over a daylight-saving change; with
    ``inputs_spec`` (a transform over several inputs), it ends with those events joined with a
    dimension.

    Raises:
        DeterminismError: the plan was refused.
        VerificationError: the second run did not reproduce the first one's stages or
            target (after printing what it found).
    """
    out.result(f"== backfill-assets demo, on the embedded PostgreSQL (under {embedded.home()}) ==")
    control = None if spec.control_database_url_env is None else url_from_env(spec.control_database_url_env)
    factory = connection_factory(embedded.database_url(), spec.limits, application_name="backfill_assets:demo",
                                 control_url=control)
    with factory() as conn:
        demo.load(conn)
    out.result(f"\n-- 1. loaded a messy sample source {spec.source_ref} and a stale target {spec.target_name}")
    if spark_spec is not None:
        _spark_source(spark_spec, out)
    _inspect_and_profile(spec, factory, out)
    request = PartitionRequest(partitions)
    out.result(f"\n-- 4. plan {partitions}: snapshot, build twice, fingerprint, compare")
    plan = make_plan(spec, request, factory, progress=out.progress)
    out.result(render_plan(plan))
    if plan.status != "ready":
        raise plan.refusal()
    first = _approve_and_apply(spec, factory, plan, out)
    out.result("\n-- 7. the ledger")
    with factory() as conn, factory.control(conn) as store:
        out.result(render_status(ledger_status(store, spec)))
    out.result("\n-- 8. the same backfill again, from the same source")
    again = make_plan(spec, request, factory, progress=out.progress)
    with factory() as conn, factory.control(conn) as control:
        confirm(control, review(conn, factory, spec, again.plan_id), "demo")
    second = apply_plan(spec, again.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)
    _report_rerun(plan, again, first, second, out)
    delta = None
    if lake_spec is not None:
        delta = _lake_demo(lake_spec, request, factory, out, second)
    if duck_spec is not None:
        _duck_demo(duck_spec, request, factory, out, delta)
    _audit_demo(spec, lake_spec, factory, out)
    if windows_spec is not None:
        _windows_demo(windows_spec, factory, out)
    if inputs_spec is not None:
        _inputs_demo(inputs_spec, factory, out, events_loaded=windows_spec is not None)


def _inputs_demo(spec: Spec, factory: ConnectionFactory, out: Printer, *, events_loaded: bool) -> None:
    """A transform over two inputs: the events of the hours demo, each with its device's name
    from a dimension, both read in one snapshot and pinned in the plan; a device renamed after
    the backfill gives another plan, which differs only in the hours holding its events."""
    with factory() as conn:
        if not events_loaded:
            demo.load_events(conn)
        demo.load_devices(conn)
    out.result(f"\n-- 13. several inputs: {spec.target_name}, the events of {demo.EVENTS_DAY} by the hour with "
               f"their device's name from {', '.join(i.display_name for i in spec.inputs.values())}")
    request = PartitionRequest(demo.EVENTS_DAY)
    first = make_plan(spec, request, factory, progress=out.progress)
    out.result(render_plan(first))
    if first.status != "ready":
        raise first.refusal()
    with factory() as conn, factory.control(conn) as control:
        confirm(control, review(conn, factory, spec, first.plan_id), "demo")
    out.result(render_apply(apply_plan(spec, first.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)))
    with factory() as conn:
        conn.execute(sql.SQL("UPDATE public.devices SET name = 'garage door (replaced)' WHERE device_id = 3"))
        hours = {r[0] for r in conn.execute(sql.SQL(
            "SELECT DISTINCT created_at FROM public.events_devices WHERE device_id = 3")).fetchall()}
    again = make_plan(spec, request, factory, progress=out.progress)
    before = {p.partition: p.stage_a for p in first.document.partitions}
    moved = [p.partition for p in again.document.partitions if p.stage_a != before[p.partition]]
    (pin,) = again.document.snapshot.inputs or (None,)
    out.result(f"device 3 renamed: plan {again.plan_id[:16]} (another plan: the devices' pin is now "
               f"{pin.content_hash[:16] if pin else '?'}), its stages differ in {len(moved)} of "
               f"{len(again.document.partitions)} hours: those holding device 3's events")
    if again.plan_id == first.plan_id or not moved or len(moved) > len(hours):
        raise VerificationError(demo.EVENTS_DAY, "the demo's several inputs", "another plan, differing in device 3's hours",
                                f"plan {again.plan_id[:16]}, {len(moved)} hour(s) differ")


def _windows_demo(spec: Spec, factory: ConnectionFactory, out: Printer) -> None:
    """Hours of a time stamp as partitions, over the night New York's clocks fall back: 25
    windows, the repeated hour two of them; planned, approved and applied, then planned again
    from the same source (the same plan, nothing to write)."""
    with factory() as conn:
        demo.load_events(conn)
    out.result(f"\n-- 12. time windows: {spec.target_name} rebuilt by the hours of "
               f"{spec.partition_window.time_zone if spec.partition_window else '?'} on {demo.EVENTS_DAY}, "
               "the day the clocks fall back")
    request = PartitionRequest(demo.EVENTS_DAY)
    first = _plan_approve_apply(spec, request, factory, out, lambda plan: "windows " + ", ".join(
        f"{p.partition} [{p.start}, {p.end})" for p in plan.document.partitions[1:3]) + " are the repeated hour")
    again = make_plan(spec, request, factory, progress=out.progress)
    with factory() as conn, factory.control(conn) as control:
        confirm(control, review(conn, factory, spec, again.plan_id), "demo")
    second = apply_plan(spec, again.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)
    skipped = sum(p["status"] == "skipped-already-verified" for p in second.partitions)
    out.result(f"the same windows again: plan {again.plan_id[:16]} ({'the same' if again.plan_id == first.plan_id else 'ANOTHER'} "
               f"plan), {skipped} of {len(second.partitions)} window(s) already carry the approved fingerprint")
    if len(first.partitions) != 25 or again.plan_id != first.plan_id or skipped != len(second.partitions):
        raise VerificationError(demo.EVENTS_DAY, "the demo's time windows", "25 windows, the same plan, all skipped",
                                f"{len(first.partitions)} windows, plan {again.plan_id[:16]}, {skipped} skipped")


def _audit_demo(spec: Spec, lake_spec: Spec | None, factory: ConnectionFactory, out: Printer) -> None:
    """The targets audited after the backfill: they hold; a hand fix to one row is named, by
    key and column; put back, the partition holds again."""
    out.result("\n-- 11. audit: is each target still what was verified?")
    out.result(render_audit(audit_spec(spec, factory, progress=out.progress)))
    if lake_spec is not None:  # a lake holds by its files in the log, from its first audit: no row read
        out.result(render_audit(audit_spec(lake_spec, factory, progress=out.progress)))
    target = spec.target_ref
    day = "2024-01-03"
    fix = sql.SQL("UPDATE {t} SET amount = amount + %s WHERE order_date = %s AND order_id = "
                  "(SELECT min(order_id) FROM {t} WHERE order_date = %s)").format(t=sql.Identifier(target.schema, target.name))
    with factory() as conn:
        conn.execute(fix, (1, day, day))
    out.result(f"a hand fix adds 1 to the amount of one order of {day} in {spec.target_name}:")
    drifted = audit_spec(spec, factory, progress=out.progress)
    out.result(render_audit(drifted))
    with factory() as conn:
        conn.execute(fix, (-1, day, day))
    again = audit_spec(spec, factory, progress=out.progress)
    out.result(f"put back: {again.counts()['holds']} of {len(again.partitions)} partition(s) hold again")
    if [p.partition for p in drifted.drifted] != [day] or again.drifted:
        raise VerificationError(day, "the demo's audit", "only the fixed day drifted, then held again",
                                f"{[p.partition for p in drifted.drifted]} drifted, then {len(again.drifted)}")


def _spark_source(spec: Spec, out: Printer) -> None:
    """The Spark spec's Parquet source folder, written from the sample rows (docs/spark.md runs
    the spec on it)."""
    assert isinstance(spec.source, ParquetSourceSpec)
    folder = _demo_lake_table(spec.source.location)
    rows = demo.write_parquet_folder(folder, spec.partition_key)
    out.result(f"the same {rows} rows as a Parquet folder, the source of spec {spec.name} on Spark: {folder}")


def _demo_lake_table(location: str) -> Path:
    """The demo's own lake table at ``location``, removed so that the demo starts from none
    (a location outside the demo's lake folders is left as it is)."""
    table = Path(location.removeprefix("file://")).expanduser().resolve()
    lakes = {Path(".backfill_assets/lake").resolve(), embedded.home() / "lake"}
    if any(table != lake and table.is_relative_to(lake) for lake in lakes):
        shutil.rmtree(table, ignore_errors=True)
    return table


def _duck_demo(spec: Spec, request: PartitionRequest, factory: ConnectionFactory, out: Printer,
               delta: ApplyResult | None) -> None:
    """The whole process on DuckDB: a Delta source written from the sample rows, pinned at its
    version, both builds in DuckDB, a Delta target; then the same content hashes as step 9."""
    import pyarrow as pa
    from deltalake import write_deltalake

    assert isinstance(spec.source, DeltaSourceSpec) and isinstance(spec.target, DeltaTargetSpec)
    source = _demo_lake_table(spec.source.location)
    _demo_lake_table(spec.target.location)
    with factory() as conn:
        rows = conn.execute(demo.SOURCE_ROWS_QUERY).fetchall()
    data = pa.Table.from_pylist([dict(zip(demo.COLUMNS, r)) for r in rows], schema=demo.arrow_schema())
    write_deltalake(str(source), data, mode="overwrite", partition_by=["order_date"])
    out.result(f"\n-- 10. the whole process on DuckDB, lake to lake: {spec.source_name} (written from the sample "
               f"rows) -> {spec.target_name}")
    first = _plan_approve_apply(spec, request, factory, out, lambda plan: (
        f"the source pinned at Delta version {plan.document.snapshot.version}; both builds ran in DuckDB"))
    if delta is not None:
        # One fingerprint for every engine: built in DuckDB from Delta, the same hashes as built
        # in PostgreSQL from the PostgreSQL source (step 9, the same newest-wins rule).
        in_postgres = {p["partition"]: p["content_hash"] for p in delta.partitions}
        same = [p["partition"] for p in first.partitions if in_postgres.get(p["partition"]) == p["content_hash"]]
        out.result(f"the same content hash as step 9 (built in PostgreSQL) in {len(same)} of {len(first.partitions)} "
                   "partition(s)")
        if len(same) != len(first.partitions):
            raise VerificationError("all", "the DuckDB build against PostgreSQL's", "the same hashes",
                                    f"{len(same)} of {len(first.partitions)} the same")


def _plan_approve_apply(spec: Spec, request: PartitionRequest, factory: ConnectionFactory, out: Printer,
                        about: Callable[[Plan], str]) -> ApplyResult:
    """Plan, approve as 'demo' and apply a lake step of the demo; ``about``: what the plan line says."""
    plan = make_plan(spec, request, factory, progress=out.progress)
    if plan.status != "ready":
        raise plan.refusal()
    out.result(f"plan {plan.plan_id}: {len(plan.labels)} partition(s); {about(plan)}")
    with factory() as conn, factory.control(conn) as control:
        confirm(control, review(conn, factory, spec, plan.plan_id), "demo")
    first = apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)
    out.result(render_apply(first))
    return first


def _lake_demo(spec: Spec, request: PartitionRequest, factory: ConnectionFactory, out: Printer,
               postgres: ApplyResult) -> ApplyResult:
    """The same backfill into a Delta Lake table, which the first apply creates, then again."""
    assert isinstance(spec.target, DeltaTargetSpec)
    location = spec.target.location
    _demo_lake_table(location)  # (any other location is left as it is: the plan says whether apply creates it)
    out.result(f"\n-- 9. the same source into a Delta Lake table ({spec.target_name}): plan, approve, apply")
    first = _plan_approve_apply(spec, request, factory, out,
                                lambda plan: f"apply creates the table: {plan.document.creates_target}")
    out.result("Delta versions committed and read back: "
               + ", ".join(f"{p['partition']} v{p['target_version']}" for p in first.partitions))
    # One fingerprint across engines: the rows the PostgreSQL target holds hash the same in Delta.
    in_postgres = {p["partition"]: p["content_hash"] for p in postgres.partitions}
    same = [p["partition"] for p in first.partitions if in_postgres.get(p["partition"]) == p["content_hash"]]
    out.result(f"the same content hash as the PostgreSQL target in {len(same)} of {len(first.partitions)} "
               "partition(s); the others keep the old version of an order a correction re-dated (this spec "
               "does not set records_can_move, so each day keeps its own newest version)")
    again = apply_plan(spec, first.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)
    skipped = sum(p["status"] == "skipped-already-verified" for p in again.partitions)
    out.result(f"applied again: {skipped} of {len(again.partitions)} partition(s) already carry the approved "
               "fingerprint; nothing written")
    if skipped != len(again.partitions):
        raise VerificationError("all", "the second apply into Delta", "every partition skipped", f"{skipped} skipped")
    return first


def _inspect_and_profile(spec: Spec, factory: ConnectionFactory, out: Printer) -> None:
    out.result("\n-- 2. inspect (read-only)")
    inspection = inspect(spec, factory)
    out.result(f"{inspection.server.engine} {inspection.server.version}; target keys: "
               + "; ".join(f"{n} ({', '.join(c)})" for n, c in inspection.target_unique_keys))
    out.result("\n-- 3. profile: propose a key and a tiebreak from the data")
    out.result(render_profile(profile_spec(spec, factory)))


def _approve_and_apply(spec: Spec, factory: ConnectionFactory, plan: Plan, out: Printer) -> ApplyResult:
    out.result("\n-- 5. approve that exact plan")
    with factory() as conn:
        checked = review(conn, factory, spec, plan.plan_id)
        out.result(render_replacement(checked.stored.document))
        with factory.control(conn) as control:
            approval = confirm(control, checked, "demo")
    out.result(f"approved as approval {approval} by 'demo' (in real use a person runs "
               "`backfill-assets approve`, which asks on the terminal)")
    out.result("\n-- 6. apply: replace and verify one partition (or moved-key group) per transaction")
    first = apply_plan(spec, plan.plan_id, factory, run_id=uuid.uuid4().hex, progress=out.progress)
    out.result(render_apply(first))
    return first


def _stage_hashes(plan: Plan) -> list[tuple[str, str]]:
    return [(e.partition, e.stage_a.content_hash) for e in plan.document.partitions]


def _report_rerun(plan: Plan, again: Plan, first: ApplyResult, second: ApplyResult, out: Printer) -> None:
    """Print what the second run found, and raise unless it reproduced the first."""
    same = _stage_hashes(again) == _stage_hashes(plan)
    out.result(
        f"plan {again.plan_id}: "
        + (f"the same {len(_stage_hashes(again))} partitions and stage hashes" if same else "OTHER STAGES")
        + ("; the moved keys are home now, so it records no moves and has another id"
           if again.plan_id != plan.plan_id else "; the same plan id")
    )
    out.result(render_apply(second))
    before = {p["partition"]: p["content_hash"] for p in first.partitions}
    unchanged = [p["content_hash"] == before.get(p["partition"]) for p in second.partitions]
    out.result(f"target hashes unchanged in {sum(unchanged)} of {len(before)} partition(s)")
    if not same:
        planned, now = dict(_stage_hashes(plan)), dict(_stage_hashes(again))
        label = next((k for k in sorted(planned.keys() | now.keys()) if planned.get(k) != now.get(k)), None)
        if label is None:  # the same hashes, in another order
            raise VerificationError("all", "the second plan's partitions", list(planned), list(now))
        raise VerificationError(label, "the second plan's stage A hash", planned.get(label), now.get(label))
    for p in second.partitions:
        if p["content_hash"] != before.get(p["partition"]):
            raise VerificationError(p["partition"], "the target hash after the second run",
                                    before.get(p["partition"]), p["content_hash"])
    if len(unchanged) != len(before):
        missing = sorted(before.keys() - {p["partition"] for p in second.partitions})
        raise VerificationError(", ".join(missing), "the second run", "every partition of the first", "not reached")
