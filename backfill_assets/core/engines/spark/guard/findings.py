"""What the Spark guard refuses and where: a finding, its place in the text (line, column,
snippet), and the advice shared by several rules."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from backfill_assets.core.errors import TransformProblem

_CONSTANT_INSTEAD = "take the value from a source column, or write it as a constant literal"
_TZ_INSTEAD = ("keep TIMESTAMP values as they are, compare them with TIMESTAMPs, or turn them into numbers "
               "with unix_micros(ts) (and back with timestamp_micros(n)), which depend on no setting; write "
               "literals with an explicit UTC offset (TIMESTAMP '2024-01-01 00:00:00Z')")
_EXACT_INSTEAD = ("cast the value to an exact type first: DECIMAL(p,s) for numbers, or STRING "
                  "(CAST(x AS STRING) tells -0.0 from 0.0)")
_ORDER_INSTEAD = ("filter with WHERE, or keep rank() OVER (...) = 1 (the tool keeps the newest row of each "
                  "key itself)")


@dataclass(frozen=True)
class _Found:
    """A construct refused, at a character offset of the text (None: the guard cannot place it)."""

    kind: str
    construct: str
    location: int | None
    problem: str
    instead: str


class _Locator:
    """Character offsets of the text -> line, column and snippet."""

    def __init__(self, text: str) -> None:
        self.text = text

    def where(self, offset: int | None) -> tuple[int | None, int | None, str]:
        if offset is None or offset < 0 or offset > len(self.text):
            return None, None, ""
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        rest = self.text[offset:].split("\n", 1)[0].strip()
        return line, column, rest[:40] + ("..." if len(rest) > 40 else "")

    def keyword_before(self, offset: int | None, pattern: str) -> int | None:
        """Where the keyword ``pattern`` (a regular expression) ends just before ``offset``
        starts (only blanks and an opening parenthesis between), else ``offset``."""
        if offset is None:
            return None
        found = re.search(rf"\b(?:{pattern})\s*\(?\s*$", self.text[:offset], re.IGNORECASE)
        return found.start() if found else offset

    def word(self, word: str) -> int | None:
        """Where ``word`` first appears as a word (to place a keyword sqlglot does not place)."""
        found = re.search(rf"(?<![\w`]){re.escape(word)}(?![\w`])", self.text, re.IGNORECASE)
        return found.start() if found else None

    def last(self, offset: int | None, pattern: str) -> int | None:
        """Where ``pattern`` last matches before ``offset`` (None: nowhere)."""
        if offset is None:
            return None
        matches = list(re.finditer(pattern, self.text[:offset], re.IGNORECASE))
        return matches[-1].start() if matches else None


def _problems(found: Sequence[_Found], locate: _Locator) -> list[TransformProblem]:
    unique = {(f.kind, f.construct, f.location): f for f in found}
    ordered = sorted(unique.values(), key=lambda f: (f.location is None, f.location or 0, f.construct))
    return [TransformProblem(f.kind, f.construct, *locate.where(f.location), f.problem, f.instead) for f in ordered]


def _at(locate: _Locator, offset: int | None) -> str:
    line, column, snippet = locate.where(offset)
    if line is None:
        return ""
    return f" at line {line}, column {column}" + (f" (`{snippet}`)" if snippet else "")
