"""The allowlist of Spark built-in functions, read once from ``allowlist.txt`` beside this
module: each function's name, the sqlglot classes it may parse into, the rule that judges it
(a ``_rule_*`` method of ``functions._FunctionRules``) and the kinds of its result. The
columns and the rules are described at the top of the file."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

_ALLOWLIST_FILE = "allowlist.txt"


@dataclass(frozen=True)
class _Spec:
    """One row of the allowlist."""

    name: str
    classes: frozenset[str]
    rule: str
    result: tuple[str, ...]


def _allowlist() -> dict[str, _Spec]:
    """The allowlist file as specs by name ('-' in the classes: sqlglot does not know the name,
    it parses into Anonymous). Blank lines and lines starting with '#' are skipped."""
    text = resources.files(__package__).joinpath(_ALLOWLIST_FILE).read_text(encoding="utf-8")
    specs: dict[str, _Spec] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, classes, rule, result = line.split()
        if name in specs:  # a second row would silently replace the first
            raise ValueError(f"{_ALLOWLIST_FILE} lists {name} twice")
        names = frozenset("Anonymous" if c == "-" else c for c in classes.split(","))
        specs[name] = _Spec(name, names, rule, tuple(result.split("+")))
    return specs


_SPECS = _allowlist()
_SPEC_CLASSES = frozenset().union(*(spec.classes for spec in _SPECS.values())) - {"Anonymous"}

_AGGREGATE_RULES = frozenset({"sum", "avg", "minmax", "agg", "collect", "listagg", "stat", "sketch"})
_WINDOW_ONLY = frozenset({"first_value", "last_value", "nth_value", "lag", "lead", "row_number", "ntile"})
