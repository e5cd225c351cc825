"""Every command README.md and docs/*.md show in a fenced block is held here (issue 49): run by
this module, run by a named test of the suite, or not run, with why. HELD is the one table; a
command of the docs missing from it fails with its file and line, and so does a row whose
command the docs no longer show. How a command is read from a block: support/doc_commands.py.

What this module runs, as written (only paths, the database URL of ``export DATABASE_URL`` and
the plan id a ``<plan_id>`` stands for put in): the `make` commands' recipes (``make -n``), the
pool command of docs/dagster.md on an instance of its own, and on the embedded PostgreSQL with
the demo's data the command blocks of README.md and docs/cli.md (``my_events.yaml`` read as the
demo's spec) and docs/dagster.md's parallel plan, approving on a terminal as a person does.
Every ``backfill-assets`` command of the docs also parses with the real parser here, and every
file a command names exists (a spec also loads), whatever its row says."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backfill_assets.cli.commands import build_parser, main
from backfill_assets.core.spec import load_spec
from backfill_assets_tests.support.doc_commands import DocCommand, argv_of, block_commands, doc_commands, env_of
from backfill_assets_tests.support.specs import REPO

HERE, BY, NOT = "run here", "run by", "not run"
THIS = "backfill_assets_tests/test_doc_commands.py"
CLI = "backfill_assets_tests/cli/test_commands.py"
POOL = f"{THIS}::test_the_pool_command_of_dagster_md_sets_the_pool_limit_on_an_instance"
BLOCKS = f"{THIS}::test_the_command_blocks_run_as_written_on_the_demo_data"
DEMO = f"{CLI}::test_demo_runs_end_to_end_on_its_own_embedded_postgresql"
SPARK_PLAN = f"{CLI}::test_the_spark_example_plans_ready_from_the_parquet_folder_the_demo_writes"
UI = "backfill_assets_tests/cli/test_ui.py::test_make_ui_serves_the_code_location_and_ctrl_c_stops_everything_it_started"
LADDER = ("a rung of the test ladder: running it from a test would run the suite (or this test) inside itself; "
          "its recipe is checked here (make -n)")
ICEBERG = ("about 5 s more on a suite at its time budget (seven Iceberg commits); the same flow on an Iceberg "
           "table in the spec's own database is core/targets/test_lake_targets.py's whole-flow test, and the "
           "demo runs it into Delta (orders_delta.yaml)")
SPARK = ("needs a JVM and the Spark apply of seven partitions; plan is run as written after the demo "
         "(test_the_spark_example_plans_ready_from_the_parquet_folder_the_demo_writes), approve, apply and status "
         "on a Spark Parquet-folder spec by core/test_own_control_store.py")
SUITE = "runs tests of the suite itself, for minutes; make test runs the same tests"
PRODUCT = "backfills/orders_daily.yaml"  # what the README's my_events.yaml stands for here

# (doc, command as the docs show it) -> (how it is held, the test that runs it or why it is not run)
HELD: dict[tuple[str, str], tuple[str, str]] = {
    ("README.md", "make demo"): (BY, DEMO),
    ("README.md", "make test"): (NOT, LADDER),
    ("README.md", "make check"): (NOT, LADDER),
    ("README.md", "make test-core"): (NOT, LADDER),
    **{("README.md", f".venv/bin/backfill-assets {c}"): (HERE, BLOCKS) for c in (
        "inspect --spec my_events.yaml",
        "profile --spec my_events.yaml --partitions 2024-01-01..2024-01-07",
        "plan --spec my_events.yaml --partitions 2024-01-01..2024-01-07",
        "approve --spec my_events.yaml --plan <plan_id> --by you",
        "apply --spec my_events.yaml --plan <plan_id>",
        "status --spec my_events.yaml",
        "audit --spec my_events.yaml")},
    **{("docs/cli.md", f".venv/bin/backfill-assets {c}"): (HERE, BLOCKS) for c in (
        "inspect --spec backfills/orders_daily.yaml",
        "profile --spec backfills/orders_daily.yaml --partitions 2024-01-01..2024-01-07",
        "plan --spec backfills/orders_daily.yaml --partitions 2024-01-01..2024-01-07 --json",
        "approve --spec backfills/orders_daily.yaml --plan <plan_id> --by alice",
        "apply --spec backfills/orders_daily.yaml --plan <plan_id>",
        "status --spec backfills/orders_daily.yaml",
        "diff --spec backfills/orders_daily.yaml --plan <plan_id> [--partitions P] [--against target|stage_b] "
        "[--limit N]",
        "audit --spec backfills/orders_daily.yaml [--partitions P] [--full] [--limit N]")},
    ("docs/cli.md", ".venv/bin/backfill-assets demo"): (BY, DEMO),
    ("docs/cli.md", ".venv/bin/backfill-assets diff --spec backfills/orders_daily.yaml --embedded --plan 980832d2 "
                    "--partitions 2024-01-01..2024-01-03"): (BY, DEMO),
    ("docs/dagster.md", "make ui"): (BY, UI),
    ("docs/dagster.md", ".venv/bin/dagster instance concurrency set backfill_assets.orders_parallel.build 2"):
        (HERE, POOL),
    ("docs/dagster.md", "BACKFILL_SPECS=deploy/examples/orders_parallel.yaml .venv/bin/backfill-assets ui"):
        (NOT, "serves the Dagster UI until Ctrl-C, for a person to click through; make ui is run by "
              "cli/test_ui.py, and multi-run backfills of a parallel spec through a running webserver and "
              "daemon by dagster_layer/test_parallel.py"),
    **{("docs/dagster.md", f".venv/bin/backfill-assets {c}"): (HERE, BLOCKS) for c in (
        "plan --spec deploy/examples/orders_parallel.yaml --partitions 2024-01-01,2024-01-02,2024-01-05,2024-01-06 "
        "--embedded",
        "approve --spec deploy/examples/orders_parallel.yaml --plan <plan_id> --by alice --embedded",
        "status --spec deploy/examples/orders_parallel.yaml --embedded")},
    **{("docs/lake-targets.md", f".venv/bin/backfill-assets {c}"): (NOT, ICEBERG) for c in (
        "plan --spec deploy/examples/orders_iceberg.yaml --embedded --partitions 2024-01-01..2024-01-07",
        "approve --spec deploy/examples/orders_iceberg.yaml --embedded --plan <plan id> --by you",
        "apply --spec deploy/examples/orders_iceberg.yaml --embedded --plan <plan id>",
        "status --spec deploy/examples/orders_iceberg.yaml --embedded")},
    **{("docs/reliability.md", c): (NOT, SUITE) for c in (
        ".venv/bin/pytest backfill_assets_tests/reliability -q -rA",
        ".venv/bin/pytest backfill_assets_tests/core/engines/postgres/test_transform.py -q",
        "HYPOTHESIS_PROFILE=slow .venv/bin/pytest backfill_assets_tests/reliability/test_generated_backfills.py "
        "backfill_assets_tests/core/test_generated_sources.py backfill_assets_tests/core/fingerprint/test_partition.py "
        "-k generated")},
    ("docs/spark.md", "make demo"): (BY, DEMO),
    ("docs/spark.md", ".venv/bin/pip install -e '.[spark]'"):
        (NOT, "installs into the virtualenv; make installs the test extra, which pins the same pyspark and sqlglot"),
    ("docs/spark.md", ".venv/bin/backfill-assets plan --spec deploy/examples/orders_spark.yaml --embedded "
                      "--partitions 2024-01-01..2024-01-07"): (BY, SPARK_PLAN),
    **{("docs/spark.md", f".venv/bin/backfill-assets {c}"): (NOT, SPARK) for c in (
        "approve --spec deploy/examples/orders_spark.yaml --embedded --plan <plan id> --by you",
        "apply --spec deploy/examples/orders_spark.yaml --embedded --plan <plan id>",
        "status --spec deploy/examples/orders_spark.yaml --embedded")},
}


def _commands() -> list[DocCommand]:
    return doc_commands(REPO)


def _held_here_by(test: str) -> list[DocCommand]:
    """The commands of the docs, in their order, whose row says ``test`` runs them."""
    found = [c for c in _commands() if HELD.get((c.doc, c.text)) == (HERE, test)]
    assert found, f"no command of the docs is held by {test}"
    return found


# --- the table against the docs ---------------------------------------------------------------

def test_every_command_of_the_docs_is_in_the_table():
    missing = [f"{c.where}: {c.text}" for c in _commands() if (c.doc, c.text) not in HELD]
    assert not missing, "add to HELD (run here, run by a test, or not run and why): " + "; ".join(missing)


def test_every_row_of_the_table_is_a_command_the_docs_still_show():
    shown = {(c.doc, c.text) for c in _commands()}
    stale = [f"{doc}: {text}" for doc, text in HELD if (doc, text) not in shown]
    assert not stale, "no longer in the docs, remove from HELD: " + "; ".join(stale)


def test_every_test_the_table_names_exists():
    missing = []
    for how, what in set(HELD.values()):
        assert how in (HERE, BY, NOT), how
        if how == NOT:
            continue
        path, _, name = what.partition("::")
        source = (REPO / path).read_text(encoding="utf-8") if (REPO / path).is_file() else ""
        if not re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE):
            missing.append(what)
    assert not missing, f"HELD names tests that do not exist: {missing}"


def test_the_commands_not_run_are_named_in_development_md_with_why():
    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    section = text[text.index("### The docs' commands"):text.index("\n## ", text.index("### The docs' commands"))]
    notes = [" ".join(note.split()) for note in section.split("\n- ")[1:]]
    unnamed = [f"{doc}: {cmd}" for (doc, cmd), (how, _) in HELD.items()
               if how == NOT and not any(_named_in(note, doc, cmd) for note in notes)]
    assert not unnamed, f"docs/development.md, The docs' commands: name each in a note with why: {unnamed}"


def _named_in(note: str, doc: str, command: str) -> bool:
    """The note names the command's doc, its program and its first word: `make test`, `pip install`,
    `backfill-assets plan`, `approve` and `apply`."""
    program, first = argv_of(command)[:2]
    program = Path(program).name
    return doc in note and program in note and (f"{program} {first}" in note or f"`{first}`" in note)


def test_the_reader_finds_commands_prompts_continuations_and_variables_and_skips_output():
    lines = ["S=a.yaml", "# a comment", ".venv/bin/backfill-assets plan --spec $S \\",
             "    --partitions 2024-01-01   # why", "", "$ make demo", "export URL=x"]
    assert block_commands("sh", 10, lines) == [(12, ".venv/bin/backfill-assets plan --spec a.yaml --partitions "
                                                    "2024-01-01"), (15, "make demo")]
    output = ["plan 850fa9cd", "  status: ready", "$ .venv/bin/backfill-assets demo", "a=b"]
    assert block_commands("", 1, output) == [(3, ".venv/bin/backfill-assets demo")]
    assert block_commands("yaml", 1, ["make: demo"]) == []
    assert argv_of("A=1 x --plan <plan id> [--limit N] [--against target|stage_b]") == [
        "x", "--plan", "0123456789abcdef", "--limit", "3", "--against", "stage_b"]
    assert env_of("A=1 B=two x y") == {"A": "1", "B": "two"}


# --- what every command of the docs is held to, whatever its row ------------------------------

def _backfill_assets_commands() -> list[DocCommand]:
    return [c for c in _commands() if Path(argv_of(c.text)[0]).name == "backfill-assets"]


@pytest.mark.parametrize("command", _backfill_assets_commands(), ids=lambda c: c.where)
def test_every_backfill_assets_command_of_the_docs_parses_and_its_spec_loads(command):
    argv = argv_of(command.text.replace("my_events.yaml", PRODUCT))[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:
        raise AssertionError(f"{command.where}: {command.text} does not parse (exit {exit_.code})") from None
    if getattr(args, "spec", None):
        load_spec(REPO / args.spec)


def test_every_file_a_command_of_the_docs_names_exists():
    missing = []
    for command in _commands():
        words = [*argv_of(command.text)[1:], *env_of(command.text).values()]
        for word in words:
            if re.fullmatch(r"(backfills|deploy|backfill_assets_tests|docs)/[\w./-]*", word) and not (REPO / word).exists():
                missing.append(f"{command.where}: {word}")
    assert not missing, missing


def test_every_word_of_a_pytest_k_of_the_docs_selects_a_test_in_the_files_it_names():
    """A word that selects nothing (a test renamed or removed) leaves the docs' figure wrong."""
    unmatched = []
    for command in _commands():
        argv = argv_of(command.text)
        if Path(argv[0]).name != "pytest" or "-k" not in argv:
            continue
        files = [REPO / w for w in argv if w.endswith(".py")]
        names = " ".join(re.findall(r"^def (test_\w+)", "".join(f.read_text(encoding="utf-8") for f in files), re.M))
        words = set(argv[argv.index("-k") + 1].split()) - {"and", "or", "not"}
        unmatched += [f"{command.where}: {w}" for w in sorted(words) if w not in names]
    assert not unmatched, unmatched


# --- run here: make's recipes -----------------------------------------------------------------

# What the docs say each target runs (README.md, docs/dagster.md's comment on `make ui`).
RECIPES = {
    "demo": ".venv/bin/backfill-assets demo",
    "ui": ".venv/bin/backfill-assets ui --port 3000",
    "check": '-m "not postgres and not spark"',
    "test-core": '-m "not spark and not slow"',
    "test": "--dist worksteal --durations=15",
}


def test_the_make_commands_of_the_docs_have_the_recipes_they_say():
    makes = [c for c in _commands() if c.text.startswith("make ")]
    assert {c.text.split()[1] for c in makes} == set(RECIPES)
    for command in makes:
        done = subprocess.run([*command.text.split()[:1], "-n", *command.text.split()[1:]], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{command.where}: {command.text}: {done.stderr}"
        assert RECIPES[command.text.split()[1]] in done.stdout, (command.where, done.stdout)
    other_port = subprocess.run(["make", "-n", "ui", "UI_PORT=3001"], cwd=REPO, capture_output=True, text=True,
                                timeout=60)
    assert ".venv/bin/backfill-assets ui --port 3001" in other_port.stdout, other_port.stdout


# --- run here: the pool command ---------------------------------------------------------------

def test_the_pool_command_of_dagster_md_sets_the_pool_limit_on_an_instance(tmp_path):
    """On an instance of its own (Dagster's default storage in a new DAGSTER_HOME), not the
    PostgreSQL-backed one of deploy/dagster.yaml the doc sets it on: the command is the same."""
    (command,) = _held_here_by(POOL)
    argv = argv_of(command.text)
    dagster = Path(sys.executable).parent / Path(argv[0]).name
    (tmp_path / "dagster.yaml").write_text("", encoding="utf-8")
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    done = subprocess.run([str(dagster), *argv[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from dagster import DagsterInstance

    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.event_log_storage.get_concurrency_info(argv[-2]).slot_count == int(argv[-1])


# --- run here: the command blocks on the demo's data ------------------------------------------

def _on_a_terminal(argv: list[str], answer: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """``main(argv)`` with stdin a terminal on which ``answer`` is typed."""
    leader, follower = pty.openpty()
    os.write(leader, f"{answer}\n".encode())
    try:
        with open(follower, encoding="utf-8") as tty:
            monkeypatch.setattr("sys.stdin", tty)
            return main(argv)
    finally:
        os.close(leader)


@pytest.mark.postgres  # the embedded PostgreSQL under the test's home, as --embedded starts it
def test_the_command_blocks_run_as_written_on_the_demo_data(home, tmp_path, monkeypatch, capsys):
    from backfill_assets.cli import demo
    from backfill_assets.core.pg import embedded
    from backfill_assets.core.pg.db import connect
    from backfill_assets.core.vocabulary import DEFAULT_LIMITS

    url = embedded.database_url()
    with connect(url, DEFAULT_LIMITS) as conn:
        demo.load(conn)
    monkeypatch.setenv("DATABASE_URL", url.reveal())  # docs/cli.md: export DATABASE_URL=... (the spec's variable)
    monkeypatch.chdir(tmp_path)
    plan_ids: dict[str, str] = {}
    for command in _held_here_by(BLOCKS):
        text = command.text.replace("my_events.yaml", PRODUCT)
        if "<plan_id>" in text:
            text = text.replace("<plan_id>", plan_ids[command.doc])
        argv = [str(REPO / w) if (REPO / w).is_file() else w for w in argv_of(text)[1:]]
        code = _on_a_terminal(argv, "yes", monkeypatch) if argv[0] == "approve" else main(argv)
        out, err = capsys.readouterr()
        assert code == 0, f"{command.where}: {command.text}: exit {code}: {err}"
        if argv[0] == "plan":
            found = json.loads(out)["plan_id"] if "--json" in argv else re.search(r"^plan ([0-9a-f]{64})$", out, re.M)[1]
            plan_ids[command.doc] = found
        if argv[0] == "approve":
            assert f"approved plan {plan_ids[command.doc]}" in out, out
        if argv[0] == "apply":
            assert "verified" in out, out
