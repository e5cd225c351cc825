"""``backfill-assets``: a thin command line over the core.

Exit codes: 0 done; 1 unexpected error; 2 bad spec or arguments; 3 cannot connect;
4 source data refused (ties, NULL ordering values, changed immutable source); 5 plan
refused (the two builds differ or break the grain); 6 approval; 7 verification;
8 transient (lock or statement timeout, another run holds the lock): safe to retry.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import psycopg

from backfill_assets.core import embedded
from backfill_assets.core.db import ConnectionFactory, DatabaseUrl, connection_factory, url_from_env
from backfill_assets.core.errors import BackfillError
from backfill_assets.core.plan import Plan, make_plan
from backfill_assets.core.profile import Profile, profile_source
from backfill_assets.core.catalog import inspect_tables
from backfill_assets.core.spec import PartitionRequest, Spec, load_spec

EXIT_CODES = """exit codes:
  0  done                       5  plan refused: stages differ or break the grain
  1  unexpected error           6  approval missing or does not match
  2  bad spec or arguments      7  verification failed
  3  cannot connect             8  transient (lock/statement timeout, busy): retry
  4  source data refused (ties, NULL ordering values, changed immutable source)
"""


class Output:
    """stdout for results, stderr for progress; progress is silent with --quiet or --json."""

    def __init__(self, *, json_mode: bool, quiet: bool, out: TextIO | None = None, err: TextIO | None = None):
        self.json_mode, self.quiet = json_mode, quiet
        self.out, self.err = out or sys.stdout, err or sys.stderr
        self._lock = threading.Lock()  # the two stage builds report from two threads

    def progress(self, message: str) -> None:
        if not self.quiet:
            with self._lock:
                print(f"  .. {message}", file=self.err, flush=True)

    def result(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def json(self, value: Any) -> None:
        print(json.dumps(value, indent=2, ensure_ascii=False), file=self.out, flush=True)


def _url(spec: Spec, args: argparse.Namespace) -> DatabaseUrl:
    if args.embedded:
        return embedded.database_url()
    return url_from_env(spec.database_url_env)


def _factory(spec: Spec, args: argparse.Namespace) -> ConnectionFactory:
    return connection_factory(_url(spec, args), application_name=f"backfill_assets:{spec.name}")


# --- rendering ---------------------------------------------------------------------------


def render_plan(plan: Plan) -> str:
    doc = plan.document
    snap = doc["snapshot"]
    lines = [
        f"plan {plan.plan_id}",
        f"  status:            {plan.status}",
        f"  target:            {doc['target']} (plan does not write to it)",
        f"  source:            {doc['source']}",
        f"  snapshot:          {snap['id']} ({snap['mode']}, fingerprint {snap['fingerprint'][:16]}...)",
        f"  transform version: {doc['transform_version']}",
        "",
        f"  {'partition':<12} {'A=B':<4} {'rows':>7} {'total':>14}  {'content hash':<18} "
        f"{'read':>6} {'null key':>8} {'collapsed':>9}",
    ]
    for p in doc["partitions"]:
        a, src = p["stage_a"], p["source"]
        lines.append(
            f"  {p['partition']:<12} {'yes' if p['match'] else 'NO':<4} {a['row_count']:>7} "
            f"{a['total'] if a['total'] is not None else '-':>14}  {a['content_hash'][:16]}.. "
            f"{src['rows_read']:>6} {src['null_key_rows_dropped']:>8} {src['duplicates_collapsed']:>9}"
        )
        if not p["match"]:
            b = p["stage_b"]
            lines.append(
                f"  {'  stage B':<12} {'':<4} {b['row_count']:>7} "
                f"{b['total'] if b['total'] is not None else '-':>14}  {b['content_hash'][:16]}.."
            )
    if plan.problems:
        lines += ["", "  problems:"] + [f"    - {p}" for p in plan.problems]
    return "\n".join(lines)


def render_profile(profile: Profile) -> str:
    lines = [
        f"profile of {profile.table}: {profile.row_count} row(s) in {len(profile.partitions)} partition(s)",
        f"  {'column':<24} {'type':<28} {'nulls':>7} {'distinct/partition':>19}",
    ]
    for c in profile.columns:
        lines.append(f"  {c.name:<24} {c.type_name:<28} {c.null_count:>7} {c.distinct_per_partition:>19}")
    lines += ["", f"  business key: {profile.business_key or 'none proposed'}", f"    {profile.key_reason}"]
    if profile.orderings:
        lines.append("  orderings tried (newest first):")
        for t in profile.orderings:
            verdict = "total" if t.total else f"{t.tied_keys} tied key(s), {t.null_count} NULL(s)"
            lines.append(f"    {', '.join(t.columns):<40} {verdict}")
    lines.append(f"  ordering: {profile.ordering_reason}")
    if profile.business_key and profile.ordering:
        lines += ["", "  proposed spec lines:", f"    business_key: [{', '.join(profile.business_key)}]", "    ordering:"]
        lines += [f"      - {{column: {c}, direction: desc}}" for c in profile.ordering]
    return "\n".join(lines)


# --- commands ----------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace, out: Output) -> int:
    spec = load_spec(args.spec)
    factory = _factory(spec, args)
    with factory() as conn:
        inspection = inspect_tables(conn, factory, spec)
    if out.json_mode:
        out.json(inspection.as_dict())
    else:
        s = inspection.server
        out.result(f"{s.engine} {s.version} ({s.encoding})")
        for label, cols in (("source " + str(spec.source_ref), inspection.source_columns),
                            ("target " + str(spec.target_ref), inspection.target_columns)):
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
    factory = _factory(spec, args)
    with factory() as conn:
        partitions = None
        if args.partitions:
            inspection = inspect_tables(conn, factory, spec)
            kind = inspection.partition_kind or "text"
            partitions = PartitionRequest(args.partitions).resolve(kind)
        profile = profile_source(conn, spec, partitions)
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
        out.result(render_plan(plan))
    if plan.status != "ready":
        print("error: the plan is refused: " + "; ".join(plan.problems)
              + ". Nothing was written to the target.", file=out.err)
        return 5
    return 0


def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    from backfill_assets import demo

    spec = load_spec(args.spec)
    out.result("== backfill-assets demo, on the embedded PostgreSQL (under "
               f"{embedded.home()}) ==")
    url = embedded.database_url()
    factory = connection_factory(url, application_name="backfill_assets:demo")
    with factory() as conn:
        demo.load(conn)
    out.result(f"\n-- 1. loaded a messy sample source {spec.source_ref} and a stale target {spec.target_ref}")
    out.result("\n-- 2. inspect (read-only)")
    with factory() as conn:
        inspection = inspect_tables(conn, factory, spec)
        out.result(f"{inspection.server.engine} {inspection.server.version}; target keys: "
                   + "; ".join(f"{n} ({', '.join(c)})" for n, c in inspection.target_unique_keys))
        out.result("\n-- 3. profile: propose a key and a tiebreak from the data")
        out.result(render_profile(profile_source(conn, spec, None)))
    request = PartitionRequest(args.partitions)
    out.result(f"\n-- 4. plan {args.partitions}: snapshot, build twice, fingerprint, compare")
    plan = make_plan(spec, request, factory, progress=out.progress)
    out.result(render_plan(plan))
    out.result("\n-- 5. plan again from the same source: the same plan id")
    again = make_plan(spec, request, factory, progress=out.progress)
    out.result(f"plan {again.plan_id} ({'same' if again.plan_id == plan.plan_id else 'DIFFERENT'})")
    out.result(
        f"\nThe target was not touched. Plan {plan.plan_id[:16]} would replace partitions "
        f"{', '.join(p['partition'] for p in plan.document['partitions'])} of {spec.target_ref} "
        "with the rows fingerprinted above; replacing them needs an approval of that exact plan."
    )
    return 0 if plan.status == "ready" and again.plan_id == plan.plan_id else 5


# --- entry point -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="backfill-assets",
        description="Idempotent, verified backfills of partitioned PostgreSQL tables.",
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
                       help="use the project's embedded PostgreSQL instead of the spec's variable")
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
    command("demo", "Run the whole flow on the embedded PostgreSQL with a messy sample source.",
            cmd_demo, partitions="2024-01-01..2024-01-07", spec_default="backfills/orders_daily.yaml")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = Output(json_mode=args.json, quiet=args.quiet or args.json)
    try:
        return args.fn(args, out)
    except BackfillError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except psycopg.Error as err:
        # Driver errors from queries carry no connection string; keep only the first line.
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"error: database error {err.__class__.__name__}: {first}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
