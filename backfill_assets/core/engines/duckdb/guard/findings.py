"""What the DuckDB guard refuses and where: a finding, its place in the user's text (line,
column, snippet), and the findings and advice shared by several rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from backfill_assets.core.engines.duckdb.guard.names import _session_use
from backfill_assets.core.errors import TransformProblem

_CONSTANT_INSTEAD = "take the value from a source column, or write it as a constant literal"
_TZ_INSTEAD = ("work on TIMESTAMP values (make_timestamp(epoch_us(ts)) is the UTC time stamp of a TIMESTAMP "
               "WITH TIME ZONE, and depends on no setting), and write literals with an explicit UTC offset")
_EXACT_INSTEAD = ("cast the value to an exact type first: DECIMAL(p,s) for numbers, VARCHAR for intervals "
                  "(CAST(x AS VARCHAR) tells -0.0 from 0.0 and '1 month' from '30 days'), lower(x) for "
                  "case-insensitive text")


@dataclass(frozen=True)
class _Found:
    """A construct refused, at a byte offset of the user's text (None: the guard cannot place it)."""

    kind: str
    construct: str
    location: int | None
    problem: str
    instead: str


class _Locator:
    """Byte offsets of DuckDB's trees -> line, column and snippet of the user's text."""

    def __init__(self, text: str) -> None:
        self.data = text.encode("utf-8")

    def where(self, offset: int | None) -> tuple[int | None, int | None, str]:
        if offset is None or offset < 0 or offset > len(self.data):
            return None, None, ""
        head = self.data[:offset].decode("utf-8", "ignore")
        line = head.count("\n") + 1
        column = len(head) - (head.rfind("\n") + 1) + 1
        rest = self.data[offset:].decode("utf-8", "replace").split("\n", 1)[0].strip()
        return line, column, rest[:40] + ("..." if len(rest) > 40 else "")

    def describe(self, offset: int | None) -> str:
        line, column, snippet = self.where(offset)
        if line is None:
            return ""
        return f" at line {line}, column {column}" + (f" (`{snippet}`)" if snippet else "")

    def pattern(self, pattern: re.Pattern[bytes]) -> int | None:
        """Where ``pattern`` first matches (to place a clause the tree does not place)."""
        found = pattern.search(self.data)
        return found.start() if found else None

    def keyword_before(self, offset: int | None, word: str) -> int | None:
        """Where the last ``word`` (a keyword) before ``offset`` starts, else ``offset``."""
        if offset is None:
            return None
        found = self.data[:offset].upper().rfind(word.encode())
        return found if found >= 0 else offset


def _problems(found: Sequence[_Found], locate: _Locator) -> list[TransformProblem]:
    unique = {(f.kind, f.construct, f.location): f for f in found}
    ordered = sorted(unique.values(), key=lambda f: (f.location is None, f.location or 0, f.construct))
    return [TransformProblem(f.kind, f.construct, *locate.where(f.location), f.problem, f.instead) for f in ordered]


def _session(name: str, where: int | None) -> _Found:
    return _Found("session", name, where,
                  f"{name} reads {_session_use(name)}, not the data: it differs between sessions, settings, "
                  "machines or versions", _CONSTANT_INSTEAD)


def _clock(name: str, where: int | None) -> _Found:
    return _Found("volatility", name, where,
                  f"{name} reads the clock: every run gets another value",
                  "take the time from a source column, or write the date or time itself (DATE '2024-01-01')")
