"""What each build engine (``engine.type``) supports: the source formats it reads, the target
formats it writes, the spec options (and the rules that limit one) and the engine settings it
takes.

An allow-list: the spec refuses at load time whatever the engine's :class:`Supports` does not
name (core.spec), with what the engine does support in the message. Each engine declares its
own, as data, in its folder (``core/engines/<type>/supports.toml``), with the class of its
build engine, the class of its ``engine`` settings and its Dagster resource's; :data:`ENGINE_TYPES`
names them, one line per engine. Reading them imports of an engine only its settings class (its
``settings.py``: pydantic alone), never its build engine: a spec never loads an engine's
libraries.
"""

from __future__ import annotations

import importlib
import importlib.resources
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The build engines, by ``engine.type``, in the order messages list them; the first is the
# engine of a spec without ``engine``. A new engine is one line here and its folder
# (docs/engines.md).
ENGINE_TYPES = ("postgres", "duckdb", "spark")
DEFAULT_ENGINE = ENGINE_TYPES[0]

# The spec options not every engine takes; a spec uses one when it sets it (true, present,
# non-zero, non-empty).
OPTIONS = ("records_can_move", "parallel", "replace_batch_rows", "trusted_functions", "partition_window", "inputs")

# How the messages name a format in prose; any other is named by its key.
FORMAT_NAMES = {"postgres": "PostgreSQL", "delta": "Delta", "iceberg": "Iceberg", "parquet": "Parquet",
                "jdbc": "JDBC"}


@dataclass(frozen=True)
class Rule:
    """A case in which an engine refuses an option it supports: the option is in use and every
    condition the rule gives holds (the spec's ``target`` format is this one; each field of the
    option's value named in ``above`` is above its number). ``refused`` is the whole message."""

    refused: str
    target: str = ""
    above: Mapping[str, int] = field(default_factory=dict)

    def holds(self, value: object, target: str) -> bool:
        """Whether the rule refuses the option set to ``value`` in a spec writing a ``target`` format."""
        if self.target and target != self.target:
            return False
        return all(getattr(value, name) > most for name, most in self.above.items())


@dataclass(frozen=True)
class Option:
    """How an engine takes one of :data:`OPTIONS`: supported (only with the source formats of
    ``needs``, for the reason ``why``, when it names some; never where one of its ``rules``
    holds), or refused for the reason ``refused`` (``yet``: refused for now, not by design)."""

    needs: tuple[str, ...] = ()
    why: str = ""
    refused: str = ""
    yet: bool = False
    rules: tuple[Rule, ...] = ()


def supported(*needs: str, why: str = "") -> Option:
    """An option the engine takes (with a source of one of ``needs``, when given: ``why`` says
    why it needs one)."""
    return Option(needs=needs, why=why)


def refused(reason: str, *, yet: bool = False) -> Option:
    """An option the engine refuses; ``reason`` says why, and what to do instead."""
    return Option(refused=reason, yet=yet)


# The rows of the capability table (docs/engines.md), in its order: what each engine can do,
# declared in its supports.toml (an option's row from its ``[options.<name>]``, any other's from
# ``[capabilities.<name>]``). A test checks that every cell that says an engine can names the
# tests that show it there, and that every refused option and command refuses with its reason.
CAPABILITIES = {
    "diff": "`diff`: which keys and columns differ",
    "profile": "`profile`: a key and a tiebreak proposed with evidence, never a guess",
    "parallel": "multi-run backfills in Dagster (`parallel`)",
    "records_can_move": "moved records (`records_can_move`)",
    "replace_batch_rows": "small partitions replaced in batches (`replace_batch_rows`)",
    "trusted_functions": "the user's own functions in a transform (`trusted_functions`)",
    "partition_window": "partitions that are time windows of a time stamp (`partition_window`)",
    "inputs": "a transform over several inputs, each pinned (`inputs`)",
    "source_sensor": "source sensor",
    "audit": "`audit`: each verified partition checked against its verification, a metadata signal first",
    "memory": "memory within the engine's limit",
    "own_control_store": "runs with no PostgreSQL of the user's",
    "jdbc_timestamp": "JDBC `timestamp without time zone`",
}


@dataclass(frozen=True)
class Capability:
    """One cell of the capability table: the engine can (``how``), can in part (``limited``:
    what it cannot), cannot (``refused``: why; ``yet``: not built yet, not by design), or the
    question does not arise (``na``: why); ``tests`` name the tests that show it on this engine
    (``path::test``), ``measured`` a figure of BENCHMARKS.md."""

    how: str = ""
    limited: str = ""
    refused: str = ""
    yet: bool = False
    na: str = ""
    tests: tuple[str, ...] = ()
    measured: str = ""

    @property
    def can(self) -> bool:
        return not (self.refused or self.na)

    def cell(self) -> str:
        if self.refused:
            return f"{'not yet' if self.yet else 'refused'}: {self.refused}"
        if self.na:
            return f"-: {self.na}"
        if self.limited:
            return f"in part: {self.limited}"
        return f"yes: {self.how}" if self.how else "yes"


@dataclass(frozen=True)
class Supports:
    """One engine's allow-list.

    ``reads`` and ``writes`` say in words what its sources and targets are (``a lake
    source``); ``options`` maps each of :data:`OPTIONS` it takes or refuses with a reason (an
    option it does not name is refused); ``settings`` are the ``engine`` keys besides ``type``
    it takes (the fields of ``settings_spec``, its variant of core.spec_settings.EngineSpec);
    ``notes`` add, for a format it does not read or write, why not; ``label`` is how the
    capability table names it; ``resource`` its Dagster resource, where the code location
    configures a session for it: the resource's ``key`` and the "module:Class" of its
    ``settings`` (dagster-free: only the Dagster layer imports it and makes the resource).
    """

    engine: str
    # Its build engine (core.build.BuildEngine), as "module:Class": imported only when a spec
    # names the engine, so that loading a spec never loads an engine's libraries.
    builds: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    reads: str
    writes: str
    options: Mapping[str, Option] = field(default_factory=dict)
    settings: tuple[str, ...] = ()
    notes: Mapping[str, str] = field(default_factory=dict)
    capabilities: Mapping[str, Capability] = field(default_factory=dict)
    # The pydantic class of its ``engine`` mapping (type: Literal[<engine>] and its settings).
    settings_spec: Any = None
    label: str = ""
    resource: Mapping[str, str] = field(default_factory=dict)


def engine_problems(supports: Supports, source: str, target: str, options: Iterable[str],
                    engines: Mapping[str, Supports]) -> list[str]:
    """What ``supports`` refuses of a spec that reads a ``source`` format, writes a ``target``
    format and uses ``options``: each problem names what is refused and what the engine
    supports (an option that needs other sources is not named again when the source itself is
    refused). ``engines`` (every engine's, core.supports) tell which engine would take
    a refused format."""
    problems = []
    label = _label(supports.engine)
    if source not in supports.sources:
        hint = _hint(supports, source, "source", [e for e in engines.values() if source in e.sources], "read")
        problems.append(f"{label} reads {supports.reads}: source.format is {_either(supports.sources)}, "
                        f"not {source}{hint}")
    if target not in supports.targets:
        hint = _hint(supports, target, "target", [e for e in engines.values() if target in e.targets], "written")
        problems.append(f"{label} writes {supports.writes}: target.format is {_either(supports.targets)}, "
                        f"not {target}{hint}")
    for name in options:
        option = supports.options.get(name, Option(refused="remove it"))
        if option.refused:
            yet = " yet" if option.yet else ""
            problems.append(f"{name} is not supported on engine {supports.engine}{yet}: {option.refused}")
        elif option.needs and source in supports.sources and source not in option.needs:
            needs = _either([_name(f) for f in option.needs])
            why = f": {option.why}" if option.why else ""
            problems.append(f"{name} needs {_article(needs)} {needs} source on engine {supports.engine}, "
                            f"not {source}{why}")
    return problems


def rule_problems(supports: Supports, target: str, options: Mapping[str, object]) -> list[str]:
    """What the rules of ``supports``' options refuse of a spec writing a ``target`` format with
    ``options`` in use (each option's name -> its value in the spec)."""
    return [rule.refused for name, value in options.items() if name in supports.options
            for rule in supports.options[name].rules if rule.holds(value, target)]


def setting_problems(supports: Supports, settings: Iterable[str], engines: Mapping[str, Supports]) -> list[str]:
    """The ``engine`` settings among ``settings`` that ``supports`` does not take, with the
    settings it does and the engine each refused one belongs to (``engines``: every engine's)."""
    wrong = [s for s in settings if s not in supports.settings]
    if not wrong:
        return []
    takes = f"the settings {_both(supports.settings)}" if supports.settings else "no settings"
    owners = [f"{_both(e.settings)} {'are settings' if len(e.settings) > 1 else 'is a setting'} of `type: {e.engine}`"
              for e in engines.values() if e is not supports and set(wrong) & set(e.settings)]
    hint = f" ({'; '.join(owners)})" if owners else ""
    return [f"{_label(supports.engine)} takes {takes}, not {_both(wrong)}{hint}"]


def _hint(supports: Supports, fmt: str, role: str, others: Sequence[Supports], verb: str) -> str:
    """Which engines take a format ``supports`` refuses, and the engine's own note on it."""
    parts = []
    others = [e for e in others if e is not supports]
    if others:
        chosen = [f"`engine: {{type: {e.engine}}}`" for e in others if e.engine != DEFAULT_ENGINE]
        by = " or ".join(chosen)
        if any(e.engine == DEFAULT_ENGINE for e in others):
            default = f"the {DEFAULT_ENGINE} engine: remove `engine`"
            by = f"{by}, or by {default}" if by else default
        name = _name(fmt)
        parts.append(f"{_article(name)} {name} {role} is {verb} by {by}")
    if fmt in supports.notes:
        parts.append(supports.notes[fmt])
    return f" ({'; '.join(parts)})" if parts else ""


def _label(engine: str) -> str:
    return f"engine {engine} (the default)" if engine == DEFAULT_ENGINE else f"engine {engine}"


def _name(fmt: str) -> str:
    return FORMAT_NAMES.get(fmt, fmt)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"


def _either(items: Sequence[str]) -> str:
    return _joined(items, "or")


def _both(items: Sequence[str]) -> str:
    return _joined(items, "and")


def _joined(items: Sequence[str], word: str) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def _option(data: Mapping[str, Any]) -> Option:
    if data.get("refused"):
        return refused(str(data["refused"]), yet=bool(data.get("yet", False)))
    rules = tuple(Rule(refused=str(r["refused"]), target=str(r.get("target", "")),
                       above={str(k): int(v) for k, v in r.get("above", {}).items()})
                  for r in data.get("rules", ()))
    return Option(needs=tuple(str(n) for n in data.get("needs", [])), why=str(data.get("why", "")), rules=rules)


def imported(path: str) -> Any:
    """What ``"module:name"`` names, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _capability(name: str, data: Mapping[str, object], options: Mapping[str, Option]) -> Capability:
    """A row's cell from ``data`` (its table in supports.toml); an option's from its Option too."""
    tests = tuple(str(t) for t in data.get("tests", ()))  # type: ignore[union-attr]
    measured = str(data.get("measured", ""))
    option = options.get(name)
    if option is not None:
        if option.refused:
            return Capability(refused=option.refused, yet=option.yet, tests=tests, measured=measured)
        needs = f"with {_article(_either([_name(f) for f in option.needs]))} {_either([_name(f) for f in option.needs])} source" \
            if option.needs else ""
        limited = f"only {needs}: {option.why}" if option.needs else ""
        return Capability(how=str(data.get("how", "")), limited=limited, tests=tests, measured=measured)
    return Capability(how=str(data.get("how", "")), limited=str(data.get("limited", "")),
                      refused=str(data.get("refused", "")), yet=bool(data.get("yet", False)),
                      na=str(data.get("na", "")), tests=tests, measured=measured)


def declared(engine: str) -> Supports:
    """What ``engine`` declares it supports (its ``supports.toml``)."""
    path = importlib.resources.files("backfill_assets.core.engines").joinpath(engine, "supports.toml")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    if data.get("engine") != engine:
        raise ValueError(f"{path} declares engine {data.get('engine')!r}, not {engine!r}")
    options = {name: _option(o) for name, o in data.get("options", {}).items()}
    tables = {**data.get("capabilities", {}), **data.get("options", {})}
    settings_spec = imported(data["settings"])
    return Supports(
        engine=engine, builds=data["builds"], sources=tuple(data["sources"]), targets=tuple(data["targets"]),
        reads=data["reads"], writes=data["writes"],
        settings=tuple(name for name in settings_spec.model_fields if name != "type"), settings_spec=settings_spec,
        options=options, notes=dict(data.get("notes", {})), label=str(data.get("label", engine)),
        resource={str(k): str(v) for k, v in data.get("resource", {}).items()},
        capabilities={name: _capability(name, tables[name], options) for name in CAPABILITIES if name in tables},
    )


# Every engine's allow-list by its ``engine.type``, read once.
SUPPORTS: dict[str, Supports] = {engine: declared(engine) for engine in ENGINE_TYPES}


def capability_table(engines: Mapping[str, Supports] | None = None) -> str:
    """The capability table of docs/engines.md, as Markdown: a row per :data:`CAPABILITIES`, a
    column per engine, each cell what the engine declares (a row it does not declare: "not
    declared")."""
    engines = SUPPORTS if engines is None else engines
    lines = ["| | " + " | ".join(e.label or e.engine for e in engines.values()) + " |",
             "|---|" + "---|" * len(engines)]
    for name, label in CAPABILITIES.items():
        cells = [(e.capabilities[name].cell() if name in e.capabilities else "not declared").replace("|", "\\|")
                 for e in engines.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


TABLE_START, TABLE_END = "<!-- capabilities: generated, do not edit -->", "<!-- /capabilities -->"


def write_capability_table(path: str) -> None:
    """Put :func:`capability_table` between the markers of ``path`` (docs/engines.md)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"{head}{TABLE_START}\n{capability_table()}\n{TABLE_END}{tail}")


if __name__ == "__main__":  # python -m backfill_assets.core.supports [docs/engines.md]: the table, or written there
    import sys
    if len(sys.argv) > 1:
        write_capability_table(sys.argv[1])
    else:
        print(capability_table())
