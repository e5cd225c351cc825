"""The command line's rendering of the core's progress events on a terminal.

One line per step, redrawn in place as its partitions finish: a bar, done/total, the
partition, rows per second and the time left; the line stays when the step's last partition
is done. The two stage builds run at once, so their lines may take turns; each finished step
keeps its own line. One-off events are printed as plain lines.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import TextIO

from backfill_assets.core.progress import ProgressEvent

WIDTH = 20
_REDRAW = "\r\x1b[K"  # back to the start of the line and clear it


def plain(event: ProgressEvent) -> str:
    """The line printed for an event when stderr is not a terminal (and for one-off events)."""
    return f"  .. {event}"


def duration(seconds: float) -> str:
    """A short duration for people: 4.2s, 3m05s, 1h02m."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def bar_line(event: ProgressEvent, elapsed: float, rows: int) -> str:
    """One step's line: its bar, done/total and partition, rows per second, time left.

    ``elapsed`` is the time since the step started; ``rows`` its rows so far.
    """
    assert event.done is not None and event.total is not None
    done, total = event.done, event.total
    filled = WIDTH * done // total if total else WIDTH
    parts = [f"  .. {event.step} [{'#' * filled}{'-' * (WIDTH - filled)}] {done}/{total}"]
    if event.partition is not None:
        parts.append(event.partition)
    if rows and elapsed > 0:
        parts.append(f"{rows / elapsed:,.0f} rows/s")
    if event.last:
        parts.append(f"done in {duration(elapsed)}")
    elif done > 0 and elapsed > 0:
        parts.append(f"~{duration(elapsed / done * (total - done))} left")
    return "  ".join(parts)


class ProgressBar:
    """Draws progress events on a terminal stream; not thread-safe (the caller locks)."""

    def __init__(self, stream: TextIO, clock: Callable[[], float]):
        self.stream, self.clock = stream, clock
        self._started: dict[str, float] = {}
        self._rows: dict[str, int] = {}
        self._open = False  # a bar line is drawn and not yet ended

    def show(self, event: ProgressEvent) -> None:
        if not event.counted:
            self._write(plain(event), end=True, fit=False)
            return
        now = self.clock()
        if event.done == 0 or event.step not in self._started:
            self._started[event.step], self._rows[event.step] = now, 0
        self._rows[event.step] += event.rows or 0
        line = bar_line(event, now - self._started[event.step], self._rows[event.step])
        self._write(line, end=event.last, fit=True)

    def end_line(self) -> None:
        """End a bar line left half drawn (before an error message or a result)."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def _write(self, text: str, *, end: bool, fit: bool) -> None:
        if fit:  # a bar line that wrapped could not be redrawn in place
            text = text[: max(shutil.get_terminal_size().columns - 1, 20)]
        self.stream.write(_REDRAW + text + ("\n" if end else ""))
        self.stream.flush()
        self._open = not end
