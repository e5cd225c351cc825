"""DuckDB's own functions as a fresh database lists them, with the stability of each variant."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from backfill_assets.core.engines.duckdb.guard.datatypes import _zoned_name
from backfill_assets.core.engines.duckdb.guard.names import _AGGREGATE_MACROS, _NOT_IN_CATALOG


@dataclass(frozen=True)
class _Overload:
    parameters: tuple[str, ...]
    returns: str
    stability: str | None
    side_effects: bool

    @property
    def consistent(self) -> bool:
        return self.stability == "CONSISTENT" and not self.side_effects

    @property
    def zoned(self) -> bool:
        return any(_zoned_name(t) for t in (*self.parameters, self.returns))


class _Catalog:
    """DuckDB's own functions, as ``duckdb_functions()`` of a fresh database lists them."""

    _QUERY = ("SELECT function_name, function_type, stability, has_side_effects, parameter_types, return_type "
              "FROM duckdb_functions() WHERE function_type IN ('scalar', 'aggregate', 'macro', 'window')")

    def __init__(self, rows: Sequence[tuple]) -> None:
        self.kinds: dict[str, set[str]] = {}
        self.scalars: dict[str, list[_Overload]] = {}
        for name, kind, stability, side_effects, parameters, returns in rows:
            self.kinds.setdefault(name.lower(), set()).add(kind)
            if kind == "scalar":
                self.scalars.setdefault(name.lower(), []).append(
                    _Overload(tuple(parameters or ()), str(returns or ""), stability, bool(side_effects)))

    @classmethod
    def read(cls, conn: duckdb.DuckDBPyConnection) -> _Catalog:
        return cls(conn.execute(cls._QUERY).fetchall())

    def known(self, name: str) -> bool:
        return name in self.kinds or name in _NOT_IN_CATALOG

    def aggregate(self, name: str) -> bool:
        return "aggregate" in self.kinds.get(name, set()) or name in _AGGREGATE_MACROS

    def always_volatile(self, name: str) -> bool:
        overloads = self.scalars.get(name, [])
        return bool(overloads) and all(o.stability == "VOLATILE" or o.side_effects for o in overloads)

    def never_consistent(self, name: str) -> bool:
        overloads = self.scalars.get(name, [])
        return bool(overloads) and not any(o.consistent for o in overloads)
