"""The capability table of docs/engines.md is what the engines declare, and each declaration
holds: a cell that says an engine can names tests of it on that engine (or a figure of
BENCHMARKS.md), and a cell that says it cannot is what the engine answers when asked."""

from __future__ import annotations

import itertools
import re

import pytest

from backfill_assets.core.build import build_engine_class, refuse_unless_supported
from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import spec_from_mapping
from backfill_assets.core.supports import (
    CAPABILITIES,
    ENGINE_TYPES,
    OPTIONS,
    SUPPORTS,
    TABLE_END,
    TABLE_START,
    capability_table,
)
from backfill_assets_tests.support.spec_samples import OPTION_VALUES, refused_with, sample_mapping
from backfill_assets_tests.support.specs import REPO

COMMANDS = ("diff", "profile")  # the rows that are commands an engine may refuse (BuildEngine.REFUSES)


def test_the_table_in_the_docs_is_what_the_engines_declare():
    text = (REPO / "docs" / "engines.md").read_text(encoding="utf-8")
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == capability_table(), "run `.venv/bin/python -m backfill_assets.core.supports docs/engines.md`"


@pytest.mark.parametrize("engine", ENGINE_TYPES)
def test_every_engine_declares_every_row(engine):
    assert set(SUPPORTS[engine].capabilities) == set(CAPABILITIES)


def _function(path: str, name: str) -> str:
    """The text of test ``name`` in ``path`` (its decorators' module too: the file)."""
    text = (REPO / path).read_text(encoding="utf-8")
    found = re.search(rf"^def {re.escape(name)}\(.*?(?=^(?:def |class |@)|\Z)", text, re.M | re.S)
    assert found is not None, f"{path} has no test {name}"
    return text


@pytest.mark.parametrize("engine, name", list(itertools.product(ENGINE_TYPES, CAPABILITIES)))
def test_what_an_engine_says_it_can_do_names_its_tests_there(engine, name):
    capability = SUPPORTS[engine].capabilities[name]
    if capability.can:
        assert capability.tests or capability.measured, f"{engine} says it can {name} but names no test of it"
    for test in capability.tests:
        path, _, function = test.partition("::")
        text = _function(path, function)
        # A test of another engine's capability is no test of this one: its file is about
        # this engine, or runs it (by name).
        assert engine == "postgres" or engine in path or engine in text, f"{test} does not run engine {engine}"
    if capability.measured:
        assert f"| {capability.measured}" in (REPO / "BENCHMARKS.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("engine, name", [(e, n) for e in ENGINE_TYPES for n in COMMANDS])
def test_a_command_runs_or_is_refused_with_its_reason(engine, name):
    capability = SUPPORTS[engine].capabilities[name]
    refuses = build_engine_class(spec_from_mapping(sample_mapping(engine, SUPPORTS[engine].sources[0],
                                                            SUPPORTS[engine].targets[0]))).REFUSES
    assert (name in refuses) == bool(capability.refused)
    if capability.refused:
        spec = spec_from_mapping(sample_mapping(engine, SUPPORTS[engine].sources[0], SUPPORTS[engine].targets[0]))
        with pytest.raises(SpecError, match=re.escape(capability.refused)):
            refuse_unless_supported(spec, name)


@pytest.mark.parametrize("engine, name", [(e, n) for e in ENGINE_TYPES for n in OPTIONS])
def test_a_refused_option_is_refused_with_its_reason(engine, name):
    capability = SUPPORTS[engine].capabilities[name]
    if not capability.refused:
        return
    for source in SUPPORTS[engine].sources:
        refusal = refused_with(sample_mapping(engine, source, SUPPORTS[engine].targets[0], **{name: OPTION_VALUES[name]}))
        assert refusal is not None and capability.refused in refusal


@pytest.mark.parametrize("engine", ENGINE_TYPES)
def test_a_spec_without_its_own_database_is_refused_where_the_engine_says_so(engine):
    capability = SUPPORTS[engine].capabilities["own_control_store"]
    data = sample_mapping(engine, SUPPORTS[engine].sources[0], SUPPORTS[engine].targets[0])
    data.pop("database_url_env")
    refusal = refused_with(data)
    if capability.refused:
        assert refusal is not None and "database_url_env" in refusal
    elif capability.can:
        assert refusal is None
