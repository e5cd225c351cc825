"""DuckDB's types as its plan serializes them: their names, the types inside them, and which
ones compare equal but print differently or read the TimeZone setting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from backfill_assets.core.engines.duckdb.guard.nodes import _Node

_FLOATS = frozenset({"FLOAT", "DOUBLE"})
_INEXACT = _FLOATS | {"INTERVAL"}


def _type_name(t: _Node | None) -> str:
    if not isinstance(t, dict):
        return "an unknown type"
    kind, info = str(t.get("id")), t.get("type_info") or {}
    if kind == "DECIMAL" and "width" in info:
        return f"DECIMAL({info['width']},{info['scale']})"
    if kind == "LIST" and isinstance(info.get("child_type"), dict):
        return _type_name(info["child_type"]) + "[]"
    if kind == "VARCHAR" and info.get("collation"):
        return f"VARCHAR COLLATE {info['collation']}"
    return kind


def _parts(t: _Node) -> Iterator[_Node]:
    """A type and every type inside it (list elements, struct fields, map keys and values)."""
    yield t
    yield from _inner_types(t.get("type_info"))


def _inner_types(value: Any) -> Iterator[_Node]:
    if isinstance(value, dict):
        if "id" in value and "type_info" in value:
            yield from _parts(value)
            return
        for item in value.values():
            yield from _inner_types(item)
    elif isinstance(value, list):
        for item in value:
            yield from _inner_types(item)


def _inexact(t: _Node) -> bool:
    """Whether equal values of the type can print differently."""
    return any(p.get("id") in _INEXACT or (p.get("id") == "VARCHAR" and (p.get("type_info") or {}).get("collation"))
               for p in _parts(t))


def _zoned_name(type_text: str) -> bool:
    return "TIME ZONE" in type_text.upper() or type_text.upper().startswith("TIMESTAMPTZ")


def _zoned(t: _Node | None) -> bool:
    return isinstance(t, dict) and any(_zoned_name(str(p.get("id"))) for p in _parts(t))
