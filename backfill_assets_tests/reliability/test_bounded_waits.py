"""No wait without a bound: every command, against every relation it may touch, held by another
session in ACCESS EXCLUSIVE mode; and apply against rows held FOR UPDATE.

The matrix is generated from two lists, each read from the code rather than written here: the
commands (every subcommand of the command line's parser; every step, job and sensor of the
Dagster definitions) and the relations (the source, the target, the snapshot copy, both stages,
and every table the control schema's DDL creates). A command or relation added later falls into
it; one that cannot run against a spec's database must be listed in ``NOT_IN_MATRIX`` with the
reason, or the completeness tests fail.

Each case runs on its own copy of one prepared database (planned and approved, not applied):
another session takes the lock, the command runs, and it must end within ``lock_timeout`` plus
2 s, either done (it does not touch that relation) or with exit 8 (in Dagster: a retryable
failure) whose message names the relation and says it is safe to retry, having written
nothing (see ``check``).
The cases of one command are one test. It runs on the embedded server and on the machine's PostgreSQL started with default settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psycopg
import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from backfill_assets.cli import commands as cli
from backfill_assets.cli import demo
from backfill_assets.core.errors import TransientDatabaseError
from backfill_assets.core.lake.iceberg_catalog import CATALOG_TABLES as ICEBERG_CATALOG_TABLES
from backfill_assets.core.pg.db import DatabaseUrl, connect, connection_factory
from backfill_assets.core.preview import make_preview
from backfill_assets.core.spec import load_spec, spec_from_mapping
from backfill_assets.core.store import control
from backfill_assets.core.vocabulary import DEFAULT_LIMITS
from backfill_assets.dagster_layer import resources as dagster_resources
from backfill_assets.dagster_layer.assets import spec_assets
from backfill_assets.dagster_layer.definitions import build_definitions
from backfill_assets.dagster_layer.names import APPROVE_JOB, APPROVE_OP, RANGE_END, RANGE_START, UNLAUNCHABLE_JOB
from backfill_assets.dagster_layer.resources import PostgresResource, resource_key
from backfill_assets_tests.support.servers import default_settings_server, server_folder
from backfill_assets_tests.support.specs import DEMO_SPEC

LOCK_MS = 200
BOUND_S = LOCK_MS / 1000 + 2
PARTITIONS = "2024-01-01..2024-01-02"
RANGE = {RANGE_START: "2024-01-01", RANGE_END: "2024-01-02"}
SAFE = "safe to retry"
CONTROL = "backfill_control"
# A transform calling a SQL function of the user's: resolving the spec reads the source and
# the function's body (the transform guard), so every command has that path too.
LABEL_FUNCTION = sql.SQL(
    "CREATE FUNCTION public.matrix_label(text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT upper($1) $$")
SPEC = {**DEMO_SPEC, "lock_timeout_ms": LOCK_MS, "control_schema": CONTROL, "records_can_move": False,
        "transform_sql": "SELECT order_date, order_id, customer_id, updated_at, ingest_seq, amount, "
                         "public.matrix_label(status) AS status, note FROM source"}


# --- the two lists --------------------------------------------------------------------------

def control_tables() -> list[str]:
    """Every table the control schema's DDL creates."""
    texts = [ddl.as_string(None) for ddl in control._DDL]
    return sorted({m for text in texts for m in re.findall(r"CREATE TABLE IF NOT EXISTS \{schema\}\.(\w+)", text)})


RELATIONS = ["source", "target", "snapshot_copy", "stage_a", "stage_b", *control_tables()]

CLI_COMMANDS: dict[str, Callable[[Path, str], list[str]]] = {
    "inspect": lambda spec, plan: ["inspect", "--spec", str(spec)],
    "profile": lambda spec, plan: ["profile", "--spec", str(spec), "--partitions", PARTITIONS],
    "plan": lambda spec, plan: ["plan", "--spec", str(spec), "--partitions", PARTITIONS],
    "approve": lambda spec, plan: ["approve", "--spec", str(spec), "--plan", plan, "--by", "matrix", "--yes"],
    "apply": lambda spec, plan: ["apply", "--spec", str(spec), "--plan", plan],
    "diff": lambda spec, plan: ["diff", "--spec", str(spec), "--plan", plan],
    "status": lambda spec, plan: ["status", "--spec", str(spec)],
    "audit": lambda spec, plan: ["audit", "--spec", str(spec)],
}
DAGSTER_STEPS = ("snapshot", "stages", "target")  # each spec's multi-assets
DAGSTER_JOBS = (APPROVE_JOB,)
DAGSTER_SENSORS = ("approval_sensor", "source_snapshot_sensor", "approvals_board")
NOT_IN_MATRIX = {
    "demo": "runs the commands above on the project's own embedded database with its own specs",
    "ui": "starts the Dagster webserver and daemon; the steps, jobs and sensors they run are in the matrix",
    UNLAUNCHABLE_JOB: "opens no connection: it only reports why an approval was not launched",
}
COMMANDS = [*(f"cli:{c}" for c in CLI_COMMANDS), *(f"step:{s}" for s in DAGSTER_STEPS),
            *(f"job:{j}" for j in DAGSTER_JOBS), *(f"sensor:{s}" for s in DAGSTER_SENSORS)]


def test_every_command_line_command_is_in_the_matrix_or_says_why_not():
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    assert set(sub.choices) == set(CLI_COMMANDS) | (set(NOT_IN_MATRIX) & set(sub.choices))


def test_every_dagster_step_job_and_sensor_is_in_the_matrix_or_says_why_not():
    spec = spec_from_mapping(SPEC)
    defs = build_definitions([spec])
    steps = {a.node_def.name.split("__", 1)[1] for a in defs.assets if isinstance(a, dg.AssetsDefinition)}
    jobs = {j.name for j in defs.jobs}
    asset_jobs = {j for j in jobs if j.startswith(f"{spec.name}__")}  # they run the steps above
    assert steps == set(DAGSTER_STEPS)
    assert jobs - asset_jobs == set(DAGSTER_JOBS) | (set(NOT_IN_MATRIX) & jobs)
    assert {s.name for s in defs.sensors} == set(DAGSTER_SENSORS)


def test_the_matrix_covers_every_table_in_the_control_schema(prepared):
    with psycopg.connect(prepared.url(prepared.template)) as conn:
        found = {f"{CONTROL}.{r[0]}" for r in conn.execute(
            sql.SQL("SELECT tablename FROM pg_tables WHERE schemaname = %(s)s"), {"s": CONTROL})}
    assert found <= set(prepared.names.values()), f"not in the matrix: {sorted(found - set(prepared.names.values()))}"


# --- the prepared database ------------------------------------------------------------------

@dataclass
class Prepared:
    """A server's database planned and approved (not applied): what every case copies."""

    admin_url: str
    template: str
    folder: Path
    plan_id: str = ""
    review_id: str = ""  # the plan's change preview, which the approval gate approves
    names: dict[str, str] | None = None  # relation role -> schema.table
    spec: dict = dataclasses.field(default_factory=lambda: SPEC)
    tags: dict = dataclasses.field(default_factory=lambda: RANGE)  # the Dagster steps' partitions

    def url(self, database: str) -> str:
        info = conninfo_to_dict(self.admin_url)
        info["dbname"] = database
        return make_conninfo(**info)

    def spec_file(self, variable: str) -> Path:
        """The matrix spec reading its URL from ``variable``."""
        path = self.folder / f"{variable}.yaml"
        path.write_text(yaml.safe_dump({**self.spec, "database_url_env": variable}))
        return path

    @contextlib.contextmanager
    def templated(self, monkeypatch: pytest.MonkeyPatch, variable: str) -> Iterator[tuple[str, Path]]:
        """The template database, made afresh with the demo source (and the transform's
        function) until the block ends; yields its URL and a spec file naming it."""
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.template))
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(drop)
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        url = self.url(self.template)
        with connect(DatabaseUrl(url, "a matrix template"), DEFAULT_LIMITS) as conn:
            demo.load(conn, moved=False)
            conn.execute(LABEL_FUNCTION)
        monkeypatch.setenv(variable, url)
        try:
            yield url, self.spec_file(variable)
        finally:
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                admin.execute(drop)

    @contextlib.contextmanager
    def copies(self, names: list[str]) -> Iterator[list[Callable[[], str]]]:
        """A copy of the template per name, made one after the other by a thread of their own
        while the cases run (a copy is the server's work, mostly waiting on its disk, as a case
        mostly waits on the lock it meets); yields, per name, what waits for that copy and
        gives its URL. Every copy made is dropped at the end."""
        made: list[str] = []
        failed: list[BaseException] = []
        ready = [threading.Event() for _ in names]

        def make() -> None:
            try:
                with psycopg.connect(self.admin_url, autocommit=True) as admin:
                    for name, event in zip(names, ready):
                        # FILE_COPY: a copy of the folder, faster than WAL_LOG for a small database.
                        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                            sql.Identifier(name), sql.Identifier(self.template)))
                        made.append(name)
                        event.set()
            except BaseException as err:  # noqa: BLE001 - raised in the case that waits for the copy
                failed.append(err)
                for event in ready:
                    event.set()

        def url_of(n: int) -> Callable[[], str]:
            def wait() -> str:
                ready[n].wait()
                if names[n] not in made:
                    raise failed[0]
                return self.url(names[n])
            return wait

        maker = threading.Thread(target=make)
        maker.start()
        try:
            yield [url_of(n) for n in range(len(names))]
        finally:
            maker.join()
            with psycopg.connect(self.admin_url, autocommit=True) as admin:
                for name in made:
                    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(argv, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def default_server_url() -> Iterator[str]:
    """The machine's PostgreSQL (Debian's), started with its default settings."""
    with server_folder("pgdefault") as folder, default_settings_server(folder / "server") as url:
        yield url


@pytest.fixture(scope="module", params=["embedded", "default-settings"])
def prepared(request, admin_url, tmp_path_factory, monkeypatch_module) -> Iterator[Prepared]:
    server = admin_url if request.param == "embedded" else request.getfixturevalue("default_server_url")
    prep = Prepared(server, f"bfa_matrix_{request.param.replace('-', '_')}", tmp_path_factory.mktemp("matrix"))
    with prep.templated(monkeypatch_module, "BFA_MATRIX_TEMPLATE") as (url, spec_file):
        prep.plan_id, prep.review_id = plan_and_approve(spec_file, PARTITIONS)
        with psycopg.connect(url) as conn:
            (snap,) = conn.execute(sql.SQL("SELECT snapshot_table FROM {}").format(
                sql.Identifier(CONTROL, "snapshot_copies"))).fetchone()
        prep.names = {
            "source": "public.orders_raw", "target": "public.orders_daily",
            "snapshot_copy": snap if "." in snap else f"{CONTROL}.{snap}",
            "stage_a": f"{CONTROL}.orders_daily__stage_a", "stage_b": f"{CONTROL}.orders_daily__stage_b",
            **{t: f"{CONTROL}.{t}" for t in control_tables()},
        }
        yield prep


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


# --- one case ---------------------------------------------------------------------------------

@dataclass
class Outcome:
    seconds: float
    code: int  # 0 done, 8 transient (for Dagster: a retryable failure), else another failure
    message: str
    released: bool = False  # it ended only after the watchdog ended the holding session


def written(conn: psycopg.Connection, names: dict[str, str]) -> dict[str, tuple]:
    """What a command may have written: the target's rows (a lake target's: the catalog's
    pointer to its current metadata) and every control table's, as text (the ledger's record
    of a failure aside)."""
    state = {}
    for role in [r for r in ("target", "iceberg_tables") if r in names] + control_tables():
        schema, table = names[role].split(".")
        where = sql.SQL("WHERE t.status NOT IN ('failed', 'not-attempted')" if table == "ledger" else "")
        state[role] = conn.execute(sql.SQL(
            "SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {} AS t {}"
        ).format(sql.Identifier(schema, table), where)).fetchone()
    return state


# What a plan (or a Dagster snapshot or stages step) stopped by a lock may leave behind: its own
# scratch work (a snapshot taken again, a stage partition rebuilt from it), which the next plan
# redoes or reuses and apply checks again against what was approved. Never the target, a plan,
# an approval or the ledger.
SCRATCH = {"snapshots", "snapshot_copies", "stage_builds"}
BUILDERS = {"cli:plan", "step:snapshot", "step:stages"}


def problems(command: str, relation: str, outcome: Outcome, before: dict, after: dict) -> list[str]:
    """What is wrong with how ``command`` ended while another session held ``relation``."""
    found = []
    if outcome.released:
        found.append(f"waited until the holding session was ended, {RELEASE_AFTER_S} s on")
    elif outcome.code == 8 and outcome.seconds >= BOUND_S:
        found.append(f"took {outcome.seconds:.1f} s (bound {BOUND_S} s)")
    if outcome.code not in (0, 8):
        found.append(f"ended with {outcome.code}, not 0 or 8: {outcome.message[:300]}")
    if outcome.code == 8:
        if relation not in outcome.message:
            found.append(f"does not name {relation}: {outcome.message[:300]}")
        if SAFE not in outcome.message:
            found.append(f"does not say it is {SAFE}: {outcome.message[:300]}")
        if command in BUILDERS:
            before = {k: v for k, v in before.items() if k not in SCRATCH}
            after = {k: v for k, v in after.items() if k not in SCRATCH}
        changed = sorted(k for k in before if before[k] != after[k])
        if changed:
            found.append(f"wrote {changed}")
    return found


def _step_seconds(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> float:
    """From the step's start to its end, as the run's event log records them (the run's own
    setup is Dagster's, not the step's)."""
    logged = [e for e in instance.all_logs(result.run_id) if e.dagster_event is not None]
    starts = [e.timestamp for e in logged if e.dagster_event.event_type_value == "STEP_START"]
    ends = [e.timestamp for e in logged
            if e.dagster_event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_UP_FOR_RETRY")]
    return max(ends) - min(starts)


def _run_outcome(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> Outcome:
    """A run: done, or failed by a retryable error (8) or another (1), with its errors' text."""
    seconds = _step_seconds(instance, result)
    if result.success:
        return Outcome(seconds, 0, "")
    texts, retryable = [], False
    for event in result.all_events:
        if event.is_step_failure:
            error = event.step_failure_data.error
            while error is not None:
                texts.append(f"{error.cls_name}: {error.message}")
                retryable = retryable or error.cls_name == "RetryRequested"
                error = error.cause
    return Outcome(seconds, 8 if retryable else 1, "\n".join(texts))


def run_command(command: str, prep: Prepared, url: str, variable: str) -> Outcome:
    kind, name = command.split(":")
    spec = spec_from_mapping({**prep.spec, "database_url_env": variable})
    resources = {resource_key(spec): PostgresResource(database_url=url, variable=variable)}
    start = time.monotonic()
    if kind == "cli":
        code, _, err = run_cli(CLI_COMMANDS[name](prep.spec_file(variable), prep.plan_id))
        return Outcome(time.monotonic() - start, code, err)
    instance = dg.DagsterInstance.ephemeral()  # for Dagster's kinds only: it takes tens of milliseconds
    if kind == "step":
        selected = {"snapshot": ["snapshot"], "stages": ["stage_a", "stage_b"], "target": ["target"]}[name]
        return _run_outcome(instance, dg.materialize(
            spec_assets(spec), selection=[dg.AssetKey([spec.name, k]) for k in selected],
            instance=instance, resources=resources, tags=prep.tags, raise_on_error=False))
    if kind == "job":
        job = build_definitions([spec]).resolve_job_def(name)
        return _run_outcome(instance, job.execute_in_process(
            run_config={"ops": {APPROVE_OP: {"config": {
                "plan_id": prep.plan_id, "review_id": prep.review_id, "approved_by": "matrix"}}}},
            resources=resources, instance=instance, raise_on_error=False))
    sensor = build_definitions([spec]).resolve_sensor_def(name)
    start = time.monotonic()  # the tick itself, not the definitions it is part of
    try:
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            sensor.evaluate_tick(context)
    except (TransientDatabaseError, dg.DagsterUserCodeExecutionError) as err:  # the tick fails; the next tries again
        cause = err if isinstance(err, TransientDatabaseError) else err.__cause__
        return Outcome(time.monotonic() - start, 8 if isinstance(cause, TransientDatabaseError) else 1, str(cause))
    return Outcome(time.monotonic() - start, 0, "")


# A command still waiting this long after the lock was taken is set free (the holder's session
# is ended), so that a missing bound fails the case instead of hanging the suite.
RELEASE_AFTER_S = BOUND_S + 5


@contextlib.contextmanager
def holding(url: str, statement: sql.Composable) -> Iterator[threading.Event]:
    """Another session that ran ``statement`` in a transaction, kept open until the block ends
    or, at the latest, :data:`RELEASE_AFTER_S` (the event yielded is set if it came to that)."""
    released = threading.Event()
    holder = psycopg.connect(url)
    holder.execute(statement)
    pid = holder.info.backend_pid

    def release() -> None:
        released.set()
        with psycopg.connect(url, autocommit=True) as other:
            other.execute(sql.SQL("SELECT pg_terminate_backend(%(pid)s)"), {"pid": pid})

    watchdog = threading.Timer(RELEASE_AFTER_S, release)
    watchdog.start()
    try:
        yield released
    finally:
        watchdog.cancel()
        watchdog.join()
        if not released.is_set():
            holder.rollback()
        holder.close()  # ended by the watchdog: nothing to roll back


def lock_table(relation: str) -> sql.Composable:
    return sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(*relation.split(".")))


Setup = sql.Composable | Callable[[Prepared, str], Prepared] | None


def one_case(command: str, prep: Prepared, url: str, variable: str, relation: str,
             statement: sql.Composable, setup: Setup = None) -> list[str]:
    """``setup``: a statement run on the copy first, or a function of the copy's variable that
    readies it and returns what the case works from (a plan made in the copy, say)."""
    if callable(setup):
        prep = setup(prep, variable)
    with psycopg.connect(url) as conn:
        if isinstance(setup, sql.Composable):
            conn.execute(setup)
            conn.commit()
        before = written(conn, prep.names)
    with holding(url, statement) as released:
        outcome = run_command(command, prep, url, variable)
        outcome.released = released.is_set()
    with psycopg.connect(url) as conn:
        after = written(conn, prep.names)
    return [f"{command} with {relation} held: {p}" for p in problems(command, relation, outcome, before, after)] \
        + ([f"blocked:{relation}"] if outcome.code == 8 else [])


def run_cases(prep: Prepared, command: str, cases: list[tuple[str, sql.Composable]], monkeypatch,
              setup: Setup = None) -> tuple[list[str], set[str]]:
    """Run ``command`` once per (relation, statement holding it), each on its own copy of the
    prepared database (made while the cases before it run); return the problems found and the
    relations that blocked it."""
    # One try: what is measured is how the first attempt ends (Dagster retries wait 2 s each).
    monkeypatch.setattr(dagster_resources, "MAX_TRANSIENT_RETRIES", 0)
    tag = re.sub(r"\W", "_", command)
    names = [f"bfa_case_{tag}_{n}"[:63] for n in range(len(cases))]
    variables = [f"BFA_MATRIX_{tag.upper()}_{n}" for n in range(len(cases))]
    results = []
    with prep.copies(names) as urls:
        for url_of, variable, case in zip(urls, variables, cases):
            url = url_of()  # the copy, made meanwhile
            monkeypatch.setenv(variable, url)
            results.append(one_case(command, prep, url, variable, *case, setup))
    found = [p for r in results for p in r if not p.startswith("blocked:")]
    blocked = {p.removeprefix("blocked:") for r in results for p in r if p.startswith("blocked:")}
    return found, blocked


# What must block each command: the relations it cannot do without (a floor; the matrix holds
# every relation, and each may block or not, but always within the bound).
MUST_BLOCK = {
    "cli:inspect": set(),  # reads the catalog only (a PostgreSQL target's transform is checked by plan)
    "cli:profile": {"source"},
    "cli:plan": {"source", "stage_a", "stage_b", "plans"},
    "cli:approve": {"target", "stage_a", "approvals"},
    "cli:apply": {"target", "stage_a", "approvals", "ledger"},
    "cli:diff": {"target", "stage_a"},
    "cli:status": {"source", "approvals", "ledger"},  # the source: each open approval's transform is checked
    "cli:audit": {"ledger", "audits"},  # what was verified, and the audits before
    "step:snapshot": {"source", "snapshots"},
    "step:stages": {"stage_a", "stage_b", "plans"},
    "step:target": {"target", "stage_a", "ledger"},
    f"job:{APPROVE_JOB}": {"target", "approvals", "previews"},
    "sensor:approval_sensor": {"approvals"},
    "sensor:approvals_board": {"plans", "previews", "approvals", "ledger"},  # the control store alone
    "sensor:source_snapshot_sensor": {"source"},
}


def test_every_command_has_a_floor_of_relations_that_must_block_it():
    assert set(MUST_BLOCK) == set(COMMANDS)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_ends_in_bounded_time_naming_the_locked_relation(prepared, command, monkeypatch):
    cases = [(prepared.names[role], lock_table(prepared.names[role])) for role in RELATIONS]
    found, blocked = run_cases(prepared, command, cases, monkeypatch)
    assert not found, "\n".join(found)
    floor = {prepared.names[role] for role in MUST_BLOCK[command]}
    assert floor <= blocked, f"{command} was not stopped by {sorted(floor - blocked)}"


ROW_LOCKS = {  # relation role -> a statement holding rows of it FOR UPDATE
    "ledger": sql.SQL("SELECT 1 FROM {} FOR UPDATE").format(sql.Identifier(CONTROL, "ledger")),
    "target": sql.SQL("SELECT 1 FROM public.orders_daily WHERE order_date = '2024-01-01' FOR UPDATE"),
}


# A ledger row of the approval being applied (an earlier run's), to hold FOR UPDATE.
EARLIER_RUN = sql.SQL(
    "INSERT INTO {} (run_id, plan_id, approval_id, snapshot_id, target_table, partition, transform_version, "
    "status, run_started_at) SELECT 'earlier', a.plan_id, a.approval_id, 'x', a.target_table, '2023-12-31', "
    "'v1', 'not-attempted', now() FROM {} AS a"
).format(sql.Identifier(CONTROL, "ledger"), sql.Identifier(CONTROL, "approvals"))


@pytest.mark.slow
@pytest.mark.parametrize("command", ["cli:apply", "step:target"])
def test_apply_ends_in_bounded_time_against_rows_held_for_update(prepared, command, monkeypatch):
    cases = [(prepared.names[role], statement) for role, statement in ROW_LOCKS.items()]
    found, blocked = run_cases(prepared, command, cases, monkeypatch, setup=EARLIER_RUN)
    assert not found, "\n".join(found)
    assert prepared.names["target"] in blocked


def test_a_connection_carries_the_spec_limits_from_its_first_statement(db_url):
    from backfill_assets.core.pg.db import enforce_limits
    from backfill_assets.core.vocabulary import WORK_MEM, Limits

    limits = Limits(lock_timeout_ms=1234, statement_timeout_ms=56789)
    with connect(db_url, limits) as conn:
        # Set at connect time: the server reports them as given by the client's options.
        rows = dict(conn.execute(sql.SQL(
            "SELECT name, source FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout')")).fetchall())
        assert rows == {"lock_timeout": "client", "statement_timeout": "client"}
        assert conn.execute(sql.SQL("SHOW lock_timeout")).fetchone()[0] == "1234ms"
        assert conn.execute(sql.SQL("SHOW work_mem")).fetchone()[0] == WORK_MEM
    # A session opened without them (as through a pooler that drops startup options) gets them.
    with psycopg.connect(db_url.reveal(), autocommit=True) as plain:
        enforce_limits(plain, limits)
        assert plain.execute(sql.SQL("SHOW statement_timeout")).fetchone()[0] == "56789ms"
    # The server's own work_mem, where asked for (the benchmark's naive side).
    with connect(db_url, Limits(1234, 56789, work_mem=None)) as conn:
        assert conn.execute(sql.SQL("SELECT source FROM pg_settings WHERE name = 'work_mem'")).fetchone()[0] != "client"


# --- a lake target: its Iceberg SQL catalog, kept in the spec's database ---------------------

LAKE_COMMANDS = ["cli:plan", "cli:approve", "cli:apply", "cli:diff", "cli:status", "step:target"]


@pytest.fixture(scope="module")
def lake_prepared(admin_url, tmp_path_factory, monkeypatch_module) -> Iterator[Prepared]:
    """A database whose Iceberg target exists (one partition applied, which creates the
    catalog's tables and the table). Each case plans and approves a second partition in its
    own copy (:func:`plan_day_two`): a plan names the catalog by its database."""
    folder = tmp_path_factory.mktemp("lake_matrix")
    spec = {**SPEC, "target": {"format": "iceberg", "table": "sales.orders_daily",
                               "catalog": {"type": "sql", "warehouse": str(folder / "warehouse")}}}
    prep = Prepared(admin_url, "bfa_matrix_lake", folder, spec=spec,
                    tags={RANGE_START: "2024-01-02", RANGE_END: "2024-01-02"})
    with prep.templated(monkeypatch_module, "BFA_LAKE_TEMPLATE") as (url, spec_file):
        code, _, err = run_cli(["apply", "--spec", str(spec_file), "--plan", plan_and_approve(spec_file, "2024-01-01")[0]])
        assert code == 0, err
        with psycopg.connect(url) as conn:
            found = conn.execute(sql.SQL(
                "SELECT schemaname, tablename FROM pg_tables WHERE tablename = ANY(%(names)s) ORDER BY 2"),
                {"names": list(ICEBERG_CATALOG_TABLES)}).fetchall()
        assert [t for _, t in found] == sorted(ICEBERG_CATALOG_TABLES), found
        prep.names = {"source": "public.orders_raw", **{t: f"{CONTROL}.{t}" for t in control_tables()},
                      **{t: f"{s}.{t}" for s, t in found}}
        yield prep


def plan_and_approve(spec_file: Path, partitions: str) -> tuple[str, str]:
    """Plan, approve on the command line and preview in Dagster's way: the plan id and the
    review id of its change preview (what the approval gate's link carries)."""
    code, out, err = run_cli(["plan", "--spec", str(spec_file), "--partitions", partitions, "--json"])
    assert code == 0, err
    plan_id = json.loads(out)["plan_id"]
    code, _, err = run_cli(["approve", "--spec", str(spec_file), "--plan", plan_id, "--by", "matrix", "--yes"])
    assert code == 0, err
    spec = load_spec(spec_file)
    factory = connection_factory(DatabaseUrl(os.environ[spec.database_url_env], "the matrix"), DEFAULT_LIMITS)
    with factory() as conn:
        return plan_id, make_preview(conn, factory, spec, plan_id).review_id


def plan_day_two(prep: Prepared, variable: str) -> Prepared:
    plan_id, review_id = plan_and_approve(prep.spec_file(variable), "2024-01-02")
    return dataclasses.replace(prep, plan_id=plan_id, review_id=review_id)


@pytest.mark.slow
@pytest.mark.parametrize("command", LAKE_COMMANDS)
def test_a_command_on_a_lake_target_ends_in_bounded_time_while_its_catalog_is_held(lake_prepared, command, monkeypatch):
    cases = [(lake_prepared.names[t], lock_table(lake_prepared.names[t])) for t in ICEBERG_CATALOG_TABLES]
    found, blocked = run_cases(lake_prepared, command, cases, monkeypatch, setup=plan_day_two)
    assert not found, "\n".join(found)
    if command in ("cli:approve", "cli:apply", "cli:diff", "step:target"):  # they read the lake table
        assert lake_prepared.names["iceberg_tables"] in blocked
