"""The command line renders progress events: a bar on a terminal, plain lines otherwise,
nothing with --quiet or --json."""

from __future__ import annotations

import io
import os

from backfill_assets.cli import commands as cli
from backfill_assets.core.progress import ProgressEvent
from backfill_assets_tests.support.cli_runs import run, write_spec

DAYS = ["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04"]


def stage_events() -> list[ProgressEvent]:
    start = ProgressEvent("stage a", "building 4 partition(s)", done=0, total=4, status="started")
    return [ProgressEvent("snapshot", "copying 400 row(s) into c.snap", rows=400), start] + [
        ProgressEvent("stage a", "100 row(s)", partition=day, done=i, total=4, rows=100, status="built")
        for i, day in enumerate(DAYS, 1)
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def render(**kwargs: object) -> str:
    err, clock = io.StringIO(), Clock()
    out = cli.Output(json_mode=False, out=io.StringIO(), err=err, clock=clock, **kwargs)
    with out:
        for event in stage_events():
            out.progress(event)
            clock.now += 1.0
    return err.getvalue()


def test_on_a_terminal_each_step_is_one_line_redrawn_with_done_total_rate_and_time_left():
    text = render(quiet=False, tty=True)
    lines = text.split("\n")
    assert lines[0] == "\r\x1b[K  .. snapshot: copying 400 row(s) into c.snap"
    draws = lines[1].split("\r\x1b[K")[1:]  # the step's one line, redrawn for each event
    assert len(lines) == 3 and lines[2] == "" and len(draws) == 5
    assert draws[0] == "  .. stage a [--------------------] 0/4"
    assert draws[1] == "  .. stage a [#####---------------] 1/4  2024-01-01  100 rows/s  ~3.0s left"
    assert draws[4] == "  .. stage a [####################] 4/4  2024-01-04  100 rows/s  done in 4.0s"


def test_a_half_drawn_bar_line_is_ended_before_anything_else_is_printed():
    err = io.StringIO()
    with cli.Output(json_mode=False, quiet=False, out=io.StringIO(), err=err, tty=True, clock=Clock()) as out:
        out.progress(stage_events()[2])
        assert not err.getvalue().endswith("\n")
        out.result("the plan")
        out.progress(stage_events()[3])
    assert err.getvalue().split("\n") == ["\r\x1b[K  .. stage a [#####---------------] 1/4  2024-01-01",
                                         "\r\x1b[K  .. stage a [##########----------] 2/4  2024-01-02", ""]


def test_off_a_terminal_progress_is_plain_lines():
    assert render(quiet=False, tty=False).splitlines() == [
        "  .. snapshot: copying 400 row(s) into c.snap",
        "  .. stage a: 0/4: building 4 partition(s)",
        *(f"  .. stage a: {i}/4 {day}: 100 row(s)" for i, day in enumerate(DAYS, 1)),
    ]


def test_quiet_prints_no_progress_even_on_a_terminal():
    assert render(quiet=True, tty=True) == "" and render(quiet=True, tty=False) == ""


def test_a_pseudo_terminal_on_stderr_gets_the_bar():
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as err:
        out = cli.Output(json_mode=False, quiet=False, out=io.StringIO(), err=err)
        out.progress(stage_events()[2])
        out.end_line()
    drawn = os.read(leader, 4096).decode()
    os.close(leader)
    assert "\x1b[K  .. stage a [#####---------------] 1/4  2024-01-01" in drawn


def test_plan_with_quiet_or_json_prints_nothing_on_stderr(demo_db, url_env, tmp_path, capsys):
    spec = str(write_spec(tmp_path))
    for flag in ("--quiet", "--json"):
        code, out, err = run(capsys, "plan", "--spec", spec, "--partitions", "2024-01-01", flag)
        assert code == 0 and out and err == ""
