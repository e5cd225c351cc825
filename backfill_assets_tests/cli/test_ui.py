"""`make ui`, the first instruction of docs/dagster.md, as a new user runs it from a clone: the
UI answers on loopback with the code location loaded, and Ctrl-C stops it and everything it
started (the webserver, the daemon, their code servers and the embedded PostgreSQL)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from backfill_assets_tests.support.dagster_server import LOCATION, free_port, wait_http
from backfill_assets_tests.support.specs import REPO

pytestmark = [pytest.mark.postgres, pytest.mark.dagster, pytest.mark.slow]

WORKSPACE = """{ workspaceOrError { __typename ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename
    ... on RepositoryLocation { repositories { jobs { name } sensors { name } } }
    ... on PythonError { message } } } } } }"""


def _graphql(port: int, query: str) -> dict:
    body = json.dumps({"query": query}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


def _loaded_location(port: int, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = _graphql(port, WORKSPACE)["workspaceOrError"]["locationEntries"]
        entry = next(e for e in entries if e["name"] == LOCATION)
        if entry["loadStatus"] == "LOADED":
            return entry["locationOrLoadError"]
        time.sleep(1)
    raise AssertionError(f"the code location {LOCATION} did not load in {timeout} s")


def _session_processes(sid: int) -> list[psutil.Process]:
    """The live processes of one session (a terminal's: what Ctrl-C reaches), zombies left out."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, PermissionError):
            continue
    return alive


def _wait_gone(what: str, still_there, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while still_there():
        assert time.monotonic() < deadline, f"{what} still running {timeout} s after Ctrl-C: {still_there()}"
        time.sleep(0.5)


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's default action, as a shell at a terminal gives its commands. A suite started in
    the background (``make test &``, a CI runner's script) runs with SIGINT ignored, which its
    children inherit: `make ui` would then never see the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_make_ui_serves_the_code_location_and_ctrl_c_stops_everything_it_started(tmp_path: Path, server_dir: Path):
    port = free_port()
    venv = Path(sys.prefix)
    home = server_dir / "home"  # a fresh project home: the embedded PostgreSQL and Dagster's instance
    env = {**os.environ, "BACKFILL_ASSETS_HOME": str(home)}
    env.pop("BACKFILL_SPECS", None)
    env.pop("DAGSTER_PG_URL", None)
    log = tmp_path / "ui.log"
    # `make ui` itself, with this interpreter's virtualenv (never re-installed here: -o).
    command = ["make", "-s", "-o", f"{venv}/.installed", "ui", f"VENV={venv}", f"UI_PORT={port}"]
    with open(log, "wb") as out:
        ui = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_as_a_terminal_starts_it)
    try:
        wait_http(f"http://127.0.0.1:{port}/server_info", [ui], timeout=180)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:
            assert page.status == 200 and b"Dagster" in page.read()
        location = _loaded_location(port)
        assert location["__typename"] == "RepositoryLocation", location
        (repository,) = location["repositories"]
        assert "orders_daily__build_stages" in {j["name"] for j in repository["jobs"]}
        assert {"approval_sensor", "source_snapshot_sensor", "approvals_board"} <= {
            s["name"] for s in repository["sensors"]}
        assert f"Dagster UI on http://127.0.0.1:{port}" in log.read_text(errors="replace")
    except BaseException:
        print(log.read_text(errors="replace")[-6000:])
        os.killpg(ui.pid, signal.SIGKILL)
        raise
    os.killpg(ui.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: to the whole foreground group
    try:
        # make waits for its recipe (`backfill-assets ui`, which exits 0) and then dies of the same SIGINT.
        assert ui.wait(timeout=60) in (0, -signal.SIGINT), log.read_text(errors="replace")[-6000:]
        _wait_gone("a process `make ui` started", lambda: _session_processes(ui.pid))
        _wait_gone("the embedded PostgreSQL", lambda: (home / "pgdata" / "postmaster.pid").exists())
    finally:
        for proc in _session_processes(ui.pid):
            proc.kill()
