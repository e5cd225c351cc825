"""The rules of the session time zone: every conversion of a TIMESTAMP to or from text, DATE or
TIMESTAMP_NTZ (written or implicit), and arithmetic on TIMESTAMPs and dates."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.findings import _TZ_INSTEAD
from backfill_assets.core.engines.spark.guard.kinds import (
    _DATE,
    _INTERVAL,
    _LTZ,
    _NULL,
    _NUMBERS,
    _OFFSET_LITERAL,
    _UNKNOWN,
    _date_interval,
    _maybe_timestamp,
    _named,
    _strip,
    _type_kinds,
)
from backfill_assets.core.engines.spark.guard.names import _written
from backfill_assets.core.engines.spark.guard.nodes import _DIALECT, _operator, _own_start
from backfill_assets.core.engines.spark.guard.valuekinds import _KindRules


class _ValueRules(_KindRules):
    """The rules over operators, casts and conditionals that may convert a TIMESTAMP."""

    def _tz(self, construct: str, where: int | None, problem: str) -> None:
        if self.typed:
            self._add("session", construct, where, problem + " reads the session time zone "
                      "(spark.sql.session.timeZone)", _TZ_INSTEAD)

    def _pure(self, construct: str, where: int | None, values: Sequence[exp.Expression]) -> None:
        """Arguments Spark converts to the parameter types: a TIMESTAMP is read in the time zone."""
        for value in values:
            kinds = self.kinds(value)
            if _maybe_timestamp(kinds):
                self._tz(construct, where, f"{construct} over {_named(kinds)}: converting a TIMESTAMP to the "
                         "type it takes (text, a date, a number of another kind)")
                return

    def _coerce(self, construct: str, where: int | None, values: Sequence[exp.Expression | None]) -> None:
        """Values Spark brings to one type: a TIMESTAMP may meet only TIMESTAMPs (and NULL)."""
        kinds = [_strip(self.kinds(v)) - {_NULL} if v is not None else frozenset() for v in values]
        if any(_maybe_timestamp(k) for k in kinds) and not all(k <= {_LTZ} for k in kinds):
            named = _named(frozenset().union(*kinds))
            self._tz(construct, where, f"{construct} of {named}: Spark brings them to one type, and converting "
                     "a TIMESTAMP to or from another type")

    def _cast(self, node: exp.Cast | exp.TryCast, where: int | None) -> None:
        source, target = _strip(self.kinds(node.this)), _strip(_type_kinds(node.to))
        written = _written(node, self.text)  # date(x), int(x), to_timestamp(x) ...
        construct = f"{written}()" if written else f"CAST(... AS {node.to.sql(dialect=_DIALECT)})"
        place = self.locate.keyword_before(where, "CAST|TRY_CAST") if _own_start(node) is None else where
        if _LTZ in target and not source <= {_LTZ, _NULL, *_NUMBERS}:
            literal = node.this
            if isinstance(literal, exp.Literal) and literal.is_string and _OFFSET_LITERAL.fullmatch(literal.name):
                return
            self._tz(construct, place, f"casting {_named(source)} to TIMESTAMP")
        elif _maybe_timestamp(source) and not target <= {_LTZ, *_NUMBERS}:
            self._tz(construct, place, f"casting {_named(source)} to {_named(target)}")

    def _in(self, node: exp.In, where: int | None) -> None:
        query = node.args.get("query")
        values: list[exp.Expression | None] = [node.this, *node.expressions]
        if query is not None:
            values += self._branch_columns(query, 0)
        self._coerce("IN", where, values)

    def _arithmetic(self, node: exp.Expression, where: int | None) -> None:
        operands = list(node.iter_expressions())
        kinds = [self.kinds(o) for o in operands]
        if any(_maybe_timestamp(k) for k in kinds):
            self._tz(_operator(node), where, f"arithmetic on {_named(frozenset().union(*kinds))}: "
                     "a TIMESTAMP plus or minus an interval or another TIMESTAMP")
            return
        if any(_DATE in k for k in kinds):
            for operand, operand_kinds in zip(operands, kinds, strict=True):
                whole_days = isinstance(operand, exp.Interval) and _date_interval(operand)
                if (_INTERVAL in operand_kinds or _UNKNOWN in operand_kinds) and not whole_days:
                    self._tz(_operator(node), where, "a DATE plus an interval that is not a literal of whole days, "
                             "weeks, months or years (INTERVAL '1' HOUR, make_dt_interval(...)) becomes a TIMESTAMP, "
                             "and that")
                    return

    def _conditional(self, node: exp.Expression, where: int | None) -> None:
        if isinstance(node, exp.If):
            results = [node.args.get("true"), node.args.get("false")]
        else:
            results = [i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
            if node.this is not None:  # CASE x WHEN v ...: x is compared with each v
                self._coerce("CASE", where, [node.this, *[i.this for i in node.args.get("ifs") or []]])
        self._coerce("CASE" if isinstance(node, exp.Case) else "IF", where, [r for r in results if r is not None])

    def _values(self, node: exp.Values, where: int | None) -> None:
        rows = [row.expressions for row in node.expressions if isinstance(row, exp.Tuple)]
        for index in range(max((len(r) for r in rows), default=0)):
            self._coerce("VALUES", where, [r[index] if index < len(r) else None for r in rows])
