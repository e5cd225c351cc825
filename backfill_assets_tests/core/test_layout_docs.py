"""The layout the docs describe is the package's: docs/development.md ("Layout") names every
module of the core and of its folders, and docs/engines.md ("Where each engine lives") every
module of each build engine's folder and of core/lake/, so a module added without its line in
the docs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from backfill_assets_tests.support.specs import REPO

CORE = REPO / "backfill_assets" / "core"


def _modules(folder: Path) -> list[str]:
    """The modules and packages of ``folder``, by the name the docs give them."""
    names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
    return sorted(names)


def _section(doc: str, heading: str) -> str:
    text = (REPO / "docs" / doc).read_text(encoding="utf-8")
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _named(name: str, text: str) -> bool:
    return f"`{name}`" in text or f"`{name}/`" in text or f"`{name}.py`" in text


@pytest.mark.parametrize("folder", ["", "lake", "comparison", "pinned", "targets", "fingerprint", "store", "profile", "pg"])
def test_the_layout_in_development_md_names_every_module_of_the_core(folder):
    layout = _section("development.md", "## Layout")
    missing = [m for m in _modules(CORE / folder) if m != "engines" and not _named(m, layout)]
    assert missing == [], f"docs/development.md, Layout: add core/{folder} {missing}"


@pytest.mark.parametrize("engine", ["postgres", "duckdb", "spark"])
def test_where_each_engine_lives_in_engines_md_names_every_module_of_its_folder(engine):
    section = _section("engines.md", "### Where each engine lives")
    row = next(line for line in section.splitlines() if line.startswith(f"| `{engine}` |"))
    missing = [m for m in _modules(CORE / "engines" / engine) if not _named(m, row)]
    assert missing == [], f"docs/engines.md, Where each engine lives: add {engine}'s {missing}"


def test_where_each_engine_lives_in_engines_md_names_every_module_of_core_lake():
    section = _section("engines.md", "### Where each engine lives")
    missing = [m for m in _modules(CORE / "lake") if not _named(m, section)]
    assert missing == [], f"docs/engines.md, Where each engine lives: add core/lake's {missing}"


def test_the_core_lists_every_step_in_its_docstring_and_development_md_does_too():
    import backfill_assets.core as core

    layout = _section("development.md", "## Layout")
    steps = ["spec", "resolve", "plan", "stages", "approve", "preview", "coverage", "apply", "diff", "audit"]
    assert [s for s in steps if f"``{s}``" not in (core.__doc__ or "")] == []
    assert [s for s in steps if f"`{s}`" not in layout] == []


def test_development_md_states_no_exact_test_count():
    """A count of tests changes with the next commit: the docs say "about N", or how to count."""
    import re

    text = (REPO / "docs" / "development.md").read_text(encoding="utf-8")
    exact = re.findall(r"\(\d[\d,]* tests\)|\b\d[\d,]* tests collected", text)
    assert exact == [], f"docs/development.md: {exact}; write about N, or how to count them"
