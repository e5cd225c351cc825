"""The Dagster layer logs the core's progress events throttled by their step field."""

from __future__ import annotations

from types import SimpleNamespace

from backfill_assets.core.progress import ProgressEvent
from backfill_assets.dagster_layer.assets import _progress


def step(name: str, done: int, total: int = 3) -> ProgressEvent:
    partition = None if done == 0 else f"2024-01-0{done}"
    return ProgressEvent(name, "", partition=partition, done=done, total=total, rows=10 * done)


def logged(events: list[ProgressEvent]) -> list[str]:
    lines: list[str] = []
    with _progress(SimpleNamespace(log=SimpleNamespace(info=lines.append)), interval=3600) as progress:
        for event in events:
            progress(event)
    return lines


def test_each_step_logs_its_first_and_last_event_and_holds_the_rest_until_a_one_off_line():
    one_off = ProgressEvent("snapshot", "something for people")
    events = [step("stage a", 0), step("stage b", 0), step("stage a", 1), step("stage b", 1), step("stage a", 2),
              one_off, step("stage a", 3), step("stage b", 2), step("stage b", 3), ProgressEvent("plan", "p: ready")]
    assert logged(events) == [
        "stage a: 0/3", "stage b: 0/3",
        "stage a: 2/3 2024-01-02", "stage b: 1/3 2024-01-01", "snapshot: something for people",  # held, then the line
        "stage a: 3/3 2024-01-03", "stage b: 3/3 2024-01-03", "plan: p: ready",
    ]


def test_an_event_still_held_when_the_step_ends_is_logged():
    assert logged([step("apply", 0), step("apply", 1)]) == ["apply: 0/3", "apply: 1/3 2024-01-01"]


def test_a_steps_last_event_is_logged_when_it_happens_not_when_the_next_line_comes():
    lines: list[str] = []
    with _progress(SimpleNamespace(log=SimpleNamespace(info=lines.append)), interval=3600) as progress:
        for done in range(4):
            progress(step("stage a", done))
        assert lines == ["stage a: 0/3", "stage a: 3/3 2024-01-03"]
