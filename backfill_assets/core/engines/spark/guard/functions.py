"""The rules of functions: each function is judged by the rule its row of the allowlist names
(``_rule_<rule>``), after its name is checked against the allowlist."""

from __future__ import annotations

import re

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.allowlist import _SPECS, _WINDOW_ONLY, _Spec
from backfill_assets.core.engines.spark.guard.findings import _CONSTANT_INSTEAD, _EXACT_INSTEAD, _TZ_INSTEAD
from backfill_assets.core.engines.spark.guard.kinds import (
    _DATE,
    _DATE_FIELDS,
    _DECIMAL,
    _INTEGER,
    _INTERVAL,
    _LTZ,
    _NTZ,
    _NULL,
    _NUMBERS,
    _UNKNOWN,
    _inexact,
    _maybe_timestamp,
    _named,
    _strip,
)
from backfill_assets.core.engines.spark.guard.names import _LOSSY, _spark_name
from backfill_assets.core.engines.spark.guard.nodes import _is_function, _own_start, _unwrapped, _values
from backfill_assets.core.engines.spark.guard.timezone import _ValueRules


class _FunctionRules(_ValueRules):
    """The rules of the functions of the allowlist."""

    def _function(self, node: exp.Func, where: int | None) -> None:
        name = _spark_name(node, self.text)
        kind = type(node).__name__
        spec = _SPECS.get(name)
        construct = f"{name}()"
        if _own_start(node) is None:
            if self.inside(node) is None:  # a keyword: CURRENT_DATE, SESSION_USER ...
                where = self.locate.word(name) or where
            else:  # LISTAGG(...) WITHIN GROUP, POSITION(a IN b): the name before the first argument
                where = self.locate.keyword_before(where, re.escape(name))
        if isinstance(node.parent, exp.Dot) and node.arg_key == "expression":
            return  # a qualified function: refused as such
        if name in _LOSSY:
            self._untrusted(construct, where, _LOSSY[name], "write the computation with the functions it is "
                            "re-printed as, or another allowed function")
            return
        if spec is None:
            self._untrusted(construct, where, f"{name}() is not on the guard's list of Spark built-in functions it "
                            "judged deterministic (a user's function, or a built-in it does not vouch for)",
                            "use Spark's built-in deterministic functions, or write the expression inline")
            return
        if kind not in spec.classes:
            self._untrusted(construct, where, f"sqlglot reads {name}() here as {kind}, which the guard cannot vouch "
                            "for (its arguments, or how it is re-printed)", "write it with the usual arguments")
            return
        getattr(self, f"_rule_{spec.rule}")(node, spec, construct, where)

    def _rule_pure(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._pure(construct, where, _values(node))

    def _rule_coerce(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._coerce(construct, where, _values(node))

    def _rule_pairs(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        values = _values(node)
        self._coerce(construct, where, values[0::2])
        self._coerce(construct, where, values[1::2])

    def _rule_anytype(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        """Nothing to refuse: no argument is converted."""

    def _rule_lambda(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        """Nothing to refuse: the lambda's body is judged node by node."""

    def _rule_castfn(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        source = self.kinds(_values(node)[0]) if _values(node) else frozenset({_UNKNOWN})
        if _maybe_timestamp(source) and not set(spec.result) <= _NUMBERS:
            self._tz(construct, where, f"casting {_named(source)} to {spec.result[0].upper()}")

    def _rule_date(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if isinstance(node, exp.TsOrDsToDate) and node.args.get("format") is not None:
            self._tz(construct, where, "to_date with a format parses the text as a TIMESTAMP and")
            return
        if isinstance(node, exp.DateDiff) and node.args.get("unit") is not None:
            self._tz(construct, where, "datediff with a unit is timestampdiff, which")
            return
        for value in _values(node):
            kinds = self.kinds(value)
            if _maybe_timestamp(kinds):
                self._tz(construct, where, f"{construct} over {_named(kinds)}: converting a TIMESTAMP to a DATE")
                return

    def _rule_field(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if isinstance(node, exp.Extract):
            field, source = node.this, node.expression
        else:
            values = _values(node)
            if len(values) != 2:
                self._untrusted(construct, where, f"{construct} takes a field and a value",
                                f"{construct[:-1]}('year', d)")
                return
            field, source = values
        name = field.name.upper() if isinstance(field, (exp.Var, exp.Literal, exp.Column, exp.Identifier)) else ""
        kinds = self.kinds(source)
        if kinds <= {_NTZ, _NULL} or (kinds <= {_DATE, _NULL} and name in _DATE_FIELDS):
            return
        self._tz(construct, where, f"{construct} of {name or 'a field'} from {_named(kinds)}: "
                 "converting the value to a TIMESTAMP or a DATE")

    def _rule_ntz(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        kinds = self._union(*_values(node))
        if not kinds <= {_NTZ, _NULL}:
            self._tz(construct, where, f"{construct} over {_named(kinds)}: reading the time of day of a TIMESTAMP")

    def _rule_instant(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        kinds = self._union(*_values(node))
        if not kinds <= {_LTZ, _NULL}:
            self._tz(construct, where, f"{construct} over {_named(kinds)}: converting the value to a TIMESTAMP")

    def _rule_zone(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        values = _values(node)
        kinds = self.kinds(values[0]) if values else frozenset({_UNKNOWN})
        zone = node.args.get("zone")
        if not kinds <= {_LTZ, _NULL}:
            self._tz(construct, where, f"{construct} over {_named(kinds)}: converting the value to a TIMESTAMP")
        elif not (isinstance(zone, exp.Literal) and zone.is_string):
            self._add("session", construct, where, f"{construct} with a zone that is not a literal: the guard cannot "
                      "tell which zone it reads", "write the zone as a literal: from_utc_timestamp(ts, 'UTC')")

    def _rule_integers(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        kinds = self._union(*_values(node))
        if self.typed and not kinds <= {_INTEGER, _NULL}:
            self._tz(construct, where, f"{construct} over {_named(kinds)}: stepping through dates or TIMESTAMPs")

    def _rule_volatile(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._add("volatility", construct, where, f"{construct} is not deterministic: it gives another value on "
                  "every call (or reads a file, a partition or a Java method)",
                  "compute the value from the source's columns (e.g. xxhash64() or sha2() of the business key "
                  "instead of rand() or uuid())")

    def _rule_clock(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if isinstance(node.parent, exp.StrToUnix) and _own_start(node) is None:
            return  # unix_timestamp() without arguments: refused as such
        construct = construct.removesuffix("()") if _own_start(node) is None else construct
        self._add("volatility", construct, where, f"{construct} reads the clock: every run gets another value",
                  "take the time from a source column, or write the date or time itself (DATE '2024-01-01')")

    def _rule_session(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        construct = construct.removesuffix("()") if _own_start(node) is None else construct
        self._add("session", construct, where, f"{construct} reads the session (its user, catalog, settings or "
                  "Spark's version), not the data: it differs between sessions or versions", _CONSTANT_INSTEAD)

    def _rule_tz(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if isinstance(node, exp.StrToUnix) and isinstance(node.this, exp.CurrentTimestamp) \
                and _own_start(node.this) is None:
            self._add("volatility", construct, where, f"{construct} without arguments reads the clock: every run "
                      "gets another value", "take the time from a source column")
            return
        self._add("session", construct, where, f"{construct} reads the session time zone "
                  "(spark.sql.session.timeZone) to convert between TIMESTAMPs and text, dates or fields",
                  _TZ_INSTEAD)

    def _rule_order(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if spec.name in _WINDOW_ONLY:
            problem = (f"{construct} numbers or picks rows by their position in the window: rows that tie in its "
                       "ORDER BY get their positions in the order they arrive in")
            instead = ("use rank() or dense_rank() (tied rows get one value), or leave picking the newest row to "
                       "the tool")
        else:
            problem = (f"{construct} picks one row's value: which one depends on the order rows arrive in (and on "
                       "ties)")
            instead = "use min() or max() of the value itself, or GROUP BY it"
        self._add("order", construct, where, problem, instead)

    def _rule_sketch(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._add("order", construct, where, f"{construct} approximates from a sketch whose contents depend on the "
                  "order rows arrive in", "use an exact aggregate (count(DISTINCT x), min, max)")

    def _rule_stat(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._add("equal-but-different", construct, where, f"{construct} computes in DOUBLE whatever its input, "
                  "adding values in the order rows arrive in, which parallel aggregation does not fix: the last "
                  "digits differ between runs", "compute it from exact sums (sum(x), sum(x * x), count(x) over "
                  "DECIMAL values) in an outer query")

    def _rule_sum(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._exact_sum(node, construct, where, {_INTEGER, _DECIMAL, _INTERVAL, _NULL},
                        "cast to DECIMAL(p,s) before summing, e.g. sum(CAST(x AS DECIMAL(18,6)))")

    def _rule_avg(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        self._exact_sum(node, construct, where, {_DECIMAL, _INTERVAL, _NULL},
                        "cast to DECIMAL(p,s) first, e.g. avg(CAST(x AS DECIMAL(20,0))) for integers: Spark averages "
                        "integers and floating point in DOUBLE")

    def _exact_sum(self, node: exp.Func, construct: str, where: int | None, exact: set[str], instead: str) -> None:
        if not self.typed:
            return
        kinds = self._union(*_values(node))
        if not kinds <= exact:
            self._add("equal-but-different", construct, where, f"{construct} over {_named(kinds)} computes in "
                      "floating point (or in a kind the guard cannot learn), adding values in the order rows arrive "
                      "in, which parallel aggregation does not fix: the last digits differ between runs", instead)

    def _rule_minmax(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        values = _values(node)
        if len(values) != 1:
            self._untrusted(construct, where, f"{construct} takes one argument (sqlglot re-prints two as "
                            "greatest/least)", "use greatest() or least()")
            return
        kinds = self.kinds(values[0])
        if self.typed and _inexact(kinds):
            self._add("equal-but-different", construct, where, f"{construct} over {_named(kinds)}: values that "
                      "compare equal print differently (-0.0 and 0.0, NaN), and which one it keeps depends on the "
                      "order rows arrive in", _EXACT_INSTEAD)

    def _rule_agg(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if isinstance(node, exp.Any) and isinstance(node.this, (exp.Subquery, exp.Query)):
            self._untrusted("ANY", where, "a comparison with ANY (subquery) is not checked by the guard",
                            "use IN (subquery) or EXISTS")

    def _rule_collect(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        outer = node.parent
        while isinstance(outer, (exp.Filter, exp.Paren)):
            outer = outer.parent
        values = _values(node)
        kinds = _strip(self.kinds(values[0])) if values else frozenset({_UNKNOWN})
        sorter = self._spec(outer) if _is_function(outer) else None
        if sorter is not None and sorter.name in ("size", "cardinality"):
            return  # only counted
        if sorter is not None and sorter.name in ("sort_array", "array_sort") and outer.this is _unwrapped(node, outer):
            extra = [c for c in outer.iter_expressions() if c is not outer.this]
            plain = all(isinstance(c, exp.Boolean) for c in extra)  # no comparator
            if plain and (not self.typed or not _inexact(kinds)):
                return
            if plain:
                self._add("equal-but-different", construct, where, f"{construct} sorted over {_named(kinds)}: "
                          "values that compare equal print differently (-0.0 and 0.0), and their order in the "
                          "list depends on the order rows arrive in", _EXACT_INSTEAD)
                return
        self._add("order", construct, where, f"{construct} collects values in the order rows arrive in",
                  f"sort the list by its values: sort_array({construct[:-1]}(x))")

    def _rule_listagg(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        order = node.this
        if isinstance(order, exp.Order):
            value = order.this
            kinds = self.kinds(value)
            ordered = any(o.this == value for o in order.expressions)
            if ordered and node.args.get("separator") is None:
                self._untrusted(construct, where, f"{construct} without a delimiter: sqlglot re-prints it with ',' "
                                "where Spark's default is ''", f"write the delimiter: {construct[:-1]}(x, ',')")
                return
            if ordered and (not self.typed or not _inexact(kinds)):
                return
            if ordered:
                self._add("equal-but-different", construct, where, f"{construct} over {_named(kinds)}: values "
                          "that compare equal print differently, in the order rows arrive in", _EXACT_INSTEAD)
                return
        self._add("order", construct, where, f"{construct} joins values in the order rows arrive in unless its "
                  "WITHIN GROUP (ORDER BY ...) includes the aggregated value itself",
                  f"order by the aggregated value: {construct[:-1]}(x, ',') WITHIN GROUP (ORDER BY x)")

    def _rule_rank(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        if not isinstance(node.parent, exp.Window):
            self._untrusted(construct, where, f"{construct} is a window function used without OVER",
                            f"write {construct} OVER (...)")

    def _rule_generator(self, node: exp.Func, spec: _Spec, construct: str, where: int | None) -> None:
        parent = node.parent
        in_view = isinstance(parent, exp.Lateral) and parent.this is node
        in_select = isinstance(parent, (exp.Alias, exp.Aliases)) and isinstance(parent.parent, exp.Select) \
            and parent in parent.parent.expressions
        if not (in_view or in_select):
            self._untrusted(construct, where, f"{construct} is a generator: the guard checks it only in LATERAL VIEW "
                            "or as a named column of a SELECT", "use LATERAL VIEW explode(...) t AS x")
