"""``backfill-assets``: a thin command line over the core.

Exit codes: 0 done; 1 unexpected error; 2 bad spec or arguments; 3 cannot connect;
4 source data refused (ties, NULL ordering values, changed immutable source); 5 plan
refused (the two builds differ or break the grain); 6 approval; 7 verification;
8 transient (lock or statement timeout, another run holds the lock): safe to retry;
9 audit found a partition that no longer holds what was verified.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import psycopg

from backfill_assets.cli.demo_run import run_demo
from backfill_assets.cli.progress_bar import ProgressBar, plain
from backfill_assets.core.apply import apply_plan
from backfill_assets.core.approve import confirm, review
from backfill_assets.core.audit import audit_spec
from backfill_assets.core.coverage import open_approvals
from backfill_assets.core.diff import diff_plan
from backfill_assets.core.errors import ApprovalError, BackfillError, SpecError
from backfill_assets.core.pg import embedded
from backfill_assets.core.pg.db import ConnectionFactory, DatabaseUrl, as_transient, connection_factory, url_from_env
from backfill_assets.core.plan import make_plan
from backfill_assets.core.profile.propose import profile_spec
from backfill_assets.core.progress import ProgressEvent
from backfill_assets.core.resolve import inspect
from backfill_assets.core.spec import Spec, load_spec
from backfill_assets.core.store.audits import latest_audits
from backfill_assets.core.store.ledger import ledger_status
from backfill_assets.core.vocabulary import PartitionRequest
from backfill_assets.core.waits import explain
from backfill_assets.render import (
    render_apply,
    render_approvals,
    render_audit,
    render_diff,
    render_plan,
    render_profile,
    render_review,
    render_status,
)

EXIT_CODES = """exit codes:
  0  done                       5  plan refused: stages differ or break the grain
  1  unexpected error           6  approval missing, does not match, or no longer covers the target
  2  bad spec or arguments      7  verification failed
  3  cannot connect             8  transient (lock/statement timeout, busy): retry
  4  source data refused (ties, NULL ordering values, changed immutable source)
  9  audit: a partition no longer holds what was verified (drifted)
"""

EXIT_DRIFTED = 9

DESCRIPTION = (
    "Idempotent, verified backfills of partitioned tables, built on one of three engines: PostgreSQL (a table "
    "of the database, into a PostgreSQL, Delta Lake or Apache Iceberg target), DuckDB (a Delta, Iceberg or "
    "Parquet source, into a Delta or Iceberg target) and Apache Spark (a Parquet folder, a table of Spark's "
    "catalog or a PostgreSQL table over JDBC, into a Parquet folder or a catalog table)."
)


class Output:
    """stdout for results, stderr for progress; progress is silent with --quiet or --json.

    Progress is a bar per step when stderr is a terminal (``tty`` overrides the check), and
    plain lines otherwise. Used as a context manager, it ends a bar line left half drawn.
    """

    def __init__(self, *, json_mode: bool, quiet: bool, out: TextIO | None = None, err: TextIO | None = None,
                 tty: bool | None = None, clock: Callable[[], float] = time.monotonic):
        self.json_mode, self.quiet = json_mode, quiet
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._lock = threading.Lock()  # the two stage builds report from two threads
        on_terminal = self.err.isatty() if tty is None else tty
        self._bar = ProgressBar(self.err, clock) if on_terminal and not quiet else None

    def progress(self, event: ProgressEvent) -> None:
        if self.quiet:
            return
        with self._lock:
            if self._bar is not None:
                self._bar.show(event)
            else:
                print(plain(event), file=self.err, flush=True)

    def end_line(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.end_line()

    def __enter__(self) -> Output:
        return self

    def __exit__(self, *_: object) -> None:
        self.end_line()

    def result(self, text: str) -> None:
        self.end_line()
        print(text, file=self.out, flush=True)

    def json(self, value: Any) -> None:
        print(json.dumps(value, indent=2, ensure_ascii=False), file=self.out, flush=True)


def _url(spec: Spec, args: argparse.Namespace) -> DatabaseUrl:
    if args.embedded:
        return embedded.embedded_url(spec)
    return embedded.spec_url(spec)


def _factory(spec: Spec, args: argparse.Namespace) -> ConnectionFactory:
    """The command's connections, carrying the spec's timeouts; kept on ``args`` so that
    :func:`main` can say what a wait that ran out waited for (core.waits)."""
    # Each URL is read when a command first opens a connection of its role: inspect and profile
    # of an engine whose data is not in PostgreSQL open none, and need no variable or server.
    name = spec.control_database_url_env
    factory = connection_factory(lambda: _url(spec, args), spec.limits,
                                 application_name=f"backfill_assets:{spec.name}",
                                 control_url=None if name is None else lambda: url_from_env(name))
    args.opened = (factory, spec)
    return factory


# --- commands ----------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    factory = _factory(spec, args)
    inspection = inspect(spec, factory)
    if out.json_mode:
        out.json(inspection.as_dict())
    else:
        s = inspection.server
        out.result(f"{s.engine} {s.version} ({s.encoding})")
        for label, cols in (("source " + spec.source_name, inspection.source_columns),
                            ("target " + spec.target_name, inspection.target_columns)):
            out.result(f"{label}: " + ", ".join(f"{c.name} {c.type_name}" for c in cols))
        out.result("target unique keys: " + ("; ".join(f"{n} ({', '.join(c)})" for n, c in inspection.target_unique_keys) or "none"))
        out.result(f"partition key kind: {inspection.partition_kind}")
        for problem in inspection.problems:
            out.result(f"problem: {problem}")
        if not inspection.problems:
            out.result("the spec matches the catalog; it can be planned")
    inspection.require_plannable()
    return 0


def cmd_profile(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    profile = profile_spec(spec, _factory(spec, args), PartitionRequest(args.partitions) if args.partitions else None)
    if out.json_mode:
        out.json(profile.as_dict())
    else:
        out.result(render_profile(profile))
    return 0


def cmd_plan(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    plan = make_plan(spec, PartitionRequest(args.partitions), _factory(spec, args), progress=out.progress)
    if out.json_mode:
        out.json(plan.as_json())
    else:
        out.result(render_plan(plan, spec.parallel))
    if plan.status != "ready":
        raise plan.refusal()
    return 0


def _confirm(args: argparse.Namespace, plan_id: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise ApprovalError("no terminal to confirm on; review the plan above and pass --yes to approve it",
                            plan_id=plan_id)
    answer = input("Type 'yes' to approve this exact plan: ")
    if answer.strip().lower() != "yes":
        raise ApprovalError("not approved: the answer was not 'yes'", plan_id=plan_id)


def cmd_approve(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    factory = _factory(spec, args)
    with factory() as conn:
        checked = review(conn, factory, spec, args.plan)
        if not out.json_mode:
            out.result(render_review(checked, spec.parallel))
        _confirm(args, checked.plan_id)
        with factory.control(conn) as control:
            approval_id = confirm(control, checked, args.by)
    if out.json_mode:
        out.json({"approval_id": approval_id, "plan_id": checked.plan_id, "approved_by": args.by,
                  "partitions": checked.stored.labels, "target": checked.stored.document.target,
                  "target_readings": checked.target, "changes": checked.changes})
    else:
        out.result(f"approved plan {checked.plan_id} as approval {approval_id} by {args.by}")
    return 0


# The crash tests' pause hook: test support, imported only when its variable is set.
TEST_PAUSE_ENV = "BACKFILL_ASSETS_TEST_PAUSE_AT"


def _test_checkpoint() -> dict[str, Any]:
    if not os.environ.get(TEST_PAUSE_ENV):
        return {}
    from backfill_assets.cli.crash_hook import pause_checkpoint

    return {"checkpoint": pause_checkpoint()}


def cmd_apply(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    run_id = uuid.uuid4().hex
    out.progress(ProgressEvent("apply", f"run {run_id}"))
    result = apply_plan(spec, args.plan, _factory(spec, args), run_id=run_id, progress=out.progress,
                        **_test_checkpoint())
    if out.json_mode:
        out.json(result.as_json())
    else:
        out.result(render_apply(result))
    return 0


def cmd_diff(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    request = PartitionRequest(args.partitions) if args.partitions else None
    result = diff_plan(spec, args.plan, _factory(spec, args), against=args.against, request=request,
                       limit=args.limit)
    if out.json_mode:
        out.json(result.as_json())
    else:
        out.result(render_diff(result))
    return 0  # differences are the answer, not a failure


def cmd_audit(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    request = PartitionRequest(args.partitions) if args.partitions else None
    result = audit_spec(spec, _factory(spec, args), request=request, full=args.full, limit=args.limit,
                        progress=out.progress)
    if out.json_mode:
        out.json(result.as_json())
    else:
        out.result(render_audit(result))
    return EXIT_DRIFTED if result.drifted else 0


def cmd_status(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    factory = _factory(spec, args)
    with factory() as conn:
        with factory.control(conn) as store:
            rows = ledger_status(store, spec)
            audits = latest_audits(store, spec.control_schema, spec.target_name)
        for r in rows:  # when each partition was last audited, and last seen holding
            last = audits.get(r["partition"])
            if last is not None:
                r.update(audit=last["result"], audited_at=last["audited_at"], last_seen_holding=last["last_holding_at"])
        approvals = open_approvals(conn, factory, spec)
    if out.json_mode:
        out.json({"target": spec.target_name, "partitions": [
            {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows
        ], "open_approvals": [a.as_json() for a in approvals if not a.expired],
            "expired_approvals": [a.as_json() for a in approvals if a.expired]})
    else:
        out.result(f"latest state per partition of {spec.target_name}")
        out.result(render_status(rows))
        out.result("\n" + render_approvals(approvals))
    return 0


def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    lake = None if args.lake_spec == "none" else load_spec(args.lake_spec)
    duck = None if args.duckdb_spec == "none" else load_spec(args.duckdb_spec)
    spark = None if args.spark_spec == "none" else load_spec(args.spark_spec)
    if spark is not None and spark.source.format != "parquet":
        raise SpecError(f"--spark-spec {args.spark_spec}: its source is not a Parquet folder "
                        "(source.format: parquet); name a spec whose source is, or 'none'")
    windows = None if args.windows_spec == "none" else load_spec(args.windows_spec)
    inputs = None if args.inputs_spec == "none" else load_spec(args.inputs_spec)
    run_demo(load_spec(args.spec), args.partitions, out, lake, duck, spark, windows, inputs)
    return 0


def cmd_ui(args: argparse.Namespace, out: Output) -> int:
    from backfill_assets.cli.ui import launch

    return launch(args.port, out.result)


# --- entry point -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backfill-assets",
        description=textwrap.fill(DESCRIPTION, 88),
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, fn: Callable[[argparse.Namespace, Output], int],
                partitions: str | None = None, spec_default: str | None = None) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--spec", required=spec_default is None, default=spec_default, metavar="FILE",
                       help="the backfill spec (YAML)")
        p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
        p.add_argument("--quiet", action="store_true", help="no progress on stderr")
        p.add_argument("--embedded", action="store_true",
                       help="use the project's embedded PostgreSQL instead of the spec's variable (a spec that "
                            "names no database: its control store there, as without --embedded)")
        if partitions == "required":
            p.add_argument("--partitions", required=True, metavar="P",
                           help="2024-01-01..2024-01-31 (inclusive) or a comma list")
        elif partitions is not None:
            p.add_argument("--partitions", default=partitions or None, metavar="P",
                           help="2024-01-01..2024-01-31 (inclusive) or a comma list")
        p.set_defaults(fn=fn)
        return p

    command("inspect", "Inspect source and target read-only and check the spec against them.", cmd_inspect)
    command("profile", "Propose a business key and a total newest-wins ordering from the data.",
            cmd_profile, partitions="")
    command("plan", "Snapshot, build twice, fingerprint and compare; store the plan. Never writes the target.",
            cmd_plan, partitions="required")
    approve = command("approve", "Show a stored plan and record an approval of exactly that plan.", cmd_approve)
    approve.add_argument("--plan", required=True, metavar="PLAN_ID", help="the plan id (or a unique prefix)")
    approve.add_argument("--by", required=True, metavar="NAME", help="who approves")
    approve.add_argument("--yes", action="store_true", help="approve without asking on the terminal")
    apply_cmd = command("apply", "Replace and verify the partitions of an approved plan, one transaction each.", cmd_apply)
    apply_cmd.add_argument("--plan", required=True, metavar="PLAN_ID", help="the approved plan id")
    diff = command("diff", "Show what applying a plan changes: per partition the keys added, removed, changed and "
                           "unchanged, with examples (read-only).", cmd_diff, partitions="")
    diff.add_argument("--plan", required=True, metavar="PLAN_ID", help="the plan id (or a unique prefix)")
    diff.add_argument("--against", choices=("target", "stage_b"), default="target",
                      help="compare the approved stage with the target (default) or with stage B")
    diff.add_argument("--limit", type=int, default=10, metavar="N", help="example keys per partition (default 10)")
    audit = command("audit", "Check that every verified partition of the spec's target still holds what was verified: "
                             "a metadata signal first, the fingerprint where it cannot tell (read-only on the target; "
                             "each audit is recorded).", cmd_audit, partitions="")
    audit.add_argument("--full", action="store_true", help="fingerprint every partition, whatever the signals say")
    audit.add_argument("--limit", type=int, default=10, metavar="N",
                       help="differing keys named per drifted partition (default 10)")
    command("status", "Show the latest ledger state of every partition of the spec's target, and what each "
                      "open approval still covers.", cmd_status)
    ui = sub.add_parser("ui", help="Start the Dagster UI and daemon on loopback with the embedded PostgreSQL.",
                        description="Start the Dagster UI and daemon on loopback with the embedded PostgreSQL.")
    ui.add_argument("--port", type=int, default=3000, help="the UI's port on 127.0.0.1 (default 3000)")
    ui.set_defaults(fn=cmd_ui, json=False, quiet=False)
    demo_cmd = command("demo", "Run the whole flow on the embedded PostgreSQL with a messy sample source (inspect, "
                               "profile, plan, approve, apply, the ledger, the same backfill again), then the same "
                               "backfill into a Delta Lake table, then the whole process on DuckDB from a Delta "
                               "source into a Delta table, an audit of the targets (a hand fix found, then put back), "
                               "and hourly time windows over a daylight-saving change. It also writes the sample rows as the Parquet folder "
                               "deploy/examples/orders_spark.yaml reads, to run on Spark afterwards.",
                       cmd_demo, partitions="2024-01-01..2024-01-07", spec_default="backfills/orders_daily.yaml")
    demo_cmd.add_argument("--lake-spec", default="deploy/examples/orders_delta.yaml", metavar="FILE",
                          help="the Delta-target spec of the demo's step 9 ('none' to skip it)")
    demo_cmd.add_argument("--duckdb-spec", default="deploy/examples/orders_duckdb.yaml", metavar="FILE",
                          help="the DuckDB spec of the demo's step 10, lake to lake ('none' to skip it)")
    demo_cmd.add_argument("--spark-spec", default="deploy/examples/orders_spark.yaml", metavar="FILE",
                          help="the Spark spec whose Parquet source folder step 1 writes from the sample rows, "
                               "to run on Spark after the demo (docs/spark.md; 'none' to skip it)")
    demo_cmd.add_argument("--windows-spec", default="deploy/examples/events_hourly.yaml", metavar="FILE",
                          help="the spec of the demo's step 12: hours of a time stamp in New York over the night "
                               "its clocks fall back ('none' to skip it)")
    demo_cmd.add_argument("--inputs-spec", default="deploy/examples/events_devices.yaml", metavar="FILE",
                          help="the spec of the demo's step 13: those events joined with a dimension of their "
                               "devices, every input pinned ('none' to skip it)")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one command; ``stdout``/``stderr`` default to the process's own."""
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(json_mode=args.json, quiet=args.quiet or args.json, out=stdout, err=stderr)
    stderr = out.err
    try:
        with out:
            return args.fn(args, out)
    except Exception as err:  # noqa: BLE001 - ours and the driver's are reported; the rest is raised
        # A timeout the core did not map yet (the driver's, or a library's wrapping it) becomes
        # a transient error (exit 8), and a lock wait names what it waited for. Every command
        # comes through here.
        opened = getattr(args, "opened", None)
        explained = explain(err, *opened) if opened else as_transient(err, f"backfill-assets {args.command}")
        if explained is not None:
            err = explained
        elif not isinstance(err, (BackfillError, psycopg.Error)):
            raise
        if isinstance(err, BackfillError):
            print(f"error: {err}", file=stderr)
            return err.exit_code
        # Driver errors from queries carry no connection string; keep only the first line.
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"error: database error {err.__class__.__name__}: {first}", file=stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
