"""The shell commands README.md and docs/*.md show in fenced code blocks, as a reader would type
them: what test_doc_commands.py holds to its table.

A block tagged ``sh``, ``bash``, ``shell`` or ``console`` is commands: every line that is not
blank or a comment is one, a trailing ``\\`` joins the next line to it, a ``$ `` prompt and a
trailing ``# comment`` are dropped. A block without a tag is output, unless a line starts with
a ``$ `` prompt or with a program the docs run (then that line is a command). Blocks tagged
otherwise (yaml, sql, python, ...) hold no command. A line that only sets a variable
(``S=file``, ``export NAME=value``) is no command of its own: the commands after it in its
block are read with ``$S`` replaced by its value, as the shell would."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

SHELL_TAGS = {"sh", "bash", "shell", "console"}
# How a command starts in a block without a tag (its other lines are a command's output).
PROGRAMS = (".venv/bin/", "make ", "backfill-assets ", "pip ", "python", "pytest ", "dagster ")
_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")
_COMMENT = re.compile(r"(^|\s)#.*$")


@dataclass(frozen=True)
class DocCommand:
    doc: str  # the file, relative to the repository: README.md, docs/cli.md
    line: int  # the line the command starts on (1-based)
    text: str  # the command, its words separated by one space

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files(repo: Path) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def _blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """Each fenced block: its tag, the line number of its first line, its lines."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        opening = re.match(r"^\s*(`{3,}|~{3,})\s*([^\s`]*)", lines[i])
        if not opening:
            i += 1
            continue
        fence, tag = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines))
        found.append((tag.lower(), i + 2, lines[i + 1:end]))
        i = end + 1
    return found


def _is_command_line(line: str, tagged: bool) -> bool:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return False
    return tagged or stripped.startswith("$ ") or stripped.startswith(PROGRAMS)


def block_commands(tag: str, first: int, lines: list[str]) -> list[tuple[int, str]]:
    """The commands of one block as (line number, command), variables set in it replaced."""
    if tag and tag not in SHELL_TAGS:
        return []
    tagged = bool(tag)
    commands: list[tuple[int, str]] = []
    variables: dict[str, str] = {}
    i = 0
    while i < len(lines):
        start = i
        if not _is_command_line(lines[i], tagged):
            i += 1
            continue
        parts = [lines[i].strip()]
        while parts[-1].endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1][:-1]
            i += 1
            parts.append(lines[i].strip())
        i += 1
        text = " ".join(_COMMENT.sub("", p).strip() for p in parts)
        text = " ".join(text.removeprefix("$ ").split())
        if assignment := _ASSIGNMENT.match(text):
            variables[assignment.group(1)] = assignment.group(2)
            continue
        for name, value in variables.items():
            text = re.sub(rf"\${name}\b", value, text)
        commands.append((first + start, text))
    return commands


def doc_commands(repo: Path) -> list[DocCommand]:
    """Every command of every fenced block of README.md and docs/*.md."""
    found = []
    for path in doc_files(repo):
        doc = str(path.relative_to(repo))
        for tag, first, lines in _blocks(path.read_text(encoding="utf-8")):
            found += [DocCommand(doc, line, text) for line, text in block_commands(tag, first, lines)]
    return found


# What a reader puts in for the docs' placeholders, to parse a command as the program would.
PLACEHOLDERS = {
    r"<plan[ _]id>": "0123456789abcdef",
    r"\[([^\]]*)\]": r"\1",  # an optional part: given
    r"\btarget\|stage_b\b": "stage_b",
    r"(--partitions) P\b": r"\1 2024-01-01",
    r"(--limit) N\b": r"\1 3",
}


def argv_of(command: str) -> list[str]:
    """The words of ``command`` with its placeholders put in and leading ``NAME=value``
    settings dropped."""
    for pattern, value in PLACEHOLDERS.items():
        command = re.sub(pattern, value, command)
    words = shlex.split(command)
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def env_of(command: str) -> dict[str, str]:
    """The ``NAME=value`` settings a command starts with."""
    env = {}
    for word in shlex.split(command):
        if not (setting := _ASSIGNMENT.match(word)):
            break
        env[setting.group(1)] = setting.group(2)
    return env
