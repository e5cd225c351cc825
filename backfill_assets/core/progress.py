"""What the core reports while it works, as typed events that each front-end renders.

The CLI draws a progress bar from them (or prints plain lines), Dagster logs them throttled
by step, and the benchmark times the steps from them; none of them reads the text. A step's
per-partition events carry ``done`` of ``total`` (a step announces itself with ``done=0``
before its first partition); any other event is a one-off line for people.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# The steps, in the product's order; "stage a" and "stage b" run at the same time.
STEPS = ("inspect", "snapshot", "stage a", "stage b", "plan", "apply")


@dataclass(frozen=True)
class ProgressEvent:
    """One thing the core did.

    Attributes:
        step: one of :data:`STEPS`.
        message: for people: the detail of a per-partition event, or a one-off line.
        partition: the partition label a per-partition event is about.
        done, total: partitions of the step finished so far, and in all.
        rows: the rows this event is about (a partition built or replaced, a copy).
        status: the partition's or the step's outcome ("built", "verified", "ready", ...).
    """

    step: str
    message: str = ""
    partition: str | None = None
    done: int | None = None
    total: int | None = None
    rows: int | None = None
    status: str | None = None

    @property
    def counted(self) -> bool:
        """True for a step's per-partition events (and its ``done=0`` announcement)."""
        return self.done is not None and self.total is not None

    @property
    def last(self) -> bool:
        """True for the event that finishes its step's partitions."""
        return self.counted and self.done == self.total

    def __str__(self) -> str:
        if not self.counted:
            return f"{self.step}: {self.message}"
        head = f"{self.step}: {self.done}/{self.total}"
        if self.partition is not None:
            head += f" {self.partition}"
        return f"{head}: {self.message}" if self.message else head


Progress = Callable[[ProgressEvent], None]


def quiet(_: ProgressEvent) -> None:
    """A progress sink that drops every event."""
