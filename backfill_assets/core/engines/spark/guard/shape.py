"""The shape of the statement, refused as a SpecError: exactly one query that reads only
``source`` and its own CTEs and names its computed columns; and the keywords and ``${...}``
substitutions the parse tree alone shows."""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.findings import _CONSTANT_INSTEAD, _at, _Found, _Locator
from backfill_assets.core.engines.spark.guard.nodes import _DIALECT, _SOURCE, _arg, _lambda_parameter, _start
from backfill_assets.core.errors import SpecError

# Keywords Spark binds as functions when no column of that name is in scope.
_VALUE_KEYWORDS = {
    "current_date": "volatility", "current_timestamp": "volatility", "current_time": "volatility",
    "localtimestamp": "volatility", "current_user": "session", "user": "session", "session_user": "session",
}


def _check_shape(tree: exp.Expression, locate: _Locator) -> None:
    """Exactly one query that reads only ``source`` and its own CTEs, and names its columns."""
    problems: list[str] = []
    for node in tree.walk():
        def at(node: exp.Expression = node) -> str:
            return _at(locate, _start(node))
        if isinstance(node, exp.With) and node.args.get("recursive"):
            problems.append(f"WITH RECURSIVE{at()} is not allowed (the guard does not check recursive queries)")
        elif isinstance(node, exp.Into):
            problems.append(f"SELECT ... INTO{at()} is not allowed: a transform only reads")
        elif isinstance(node, (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Create, exp.Drop, exp.Command)):
            problems.append(f"{type(node).__name__.upper()}{at()} is not allowed: a transform only reads")
        elif isinstance(node, exp.Hint):
            problems.append(f"a hint (/*+ ... */){_at(locate, locate.last(_start(node), r'/[*][+]'))} is not "
                            "allowed")
        elif isinstance(node, (exp.Placeholder, exp.Parameter, exp.SessionParameter)):
            problems.append(f"a parameter{at()} is not allowed: transform_sql is run as it is written")
        elif isinstance(node, exp.TableSample):
            place = locate.last(_start(node), r"\bTABLESAMPLE\b")
            problems.append(f"TABLESAMPLE{_at(locate, place)} is not allowed: a sample picks rows at random")
        elif isinstance(node, exp.Table) and not node.find_ancestor(exp.Hint):
            problems += _table_problems(node, at())
    problems += _unnamed_columns(tree, locate)
    if problems:
        raise SpecError("transform_sql is refused: " + "; ".join(dict.fromkeys(problems)))


def _table_problems(table: exp.Table, at: str) -> list[str]:
    if not isinstance(table.this, exp.Identifier):
        name = table.this.sql(dialect=_DIALECT) if table.this is not None else "a table function"
        return [(f"it calls the table function {name}{at}: a transform may read only '{_SOURCE}' (table "
                 "functions read files or the catalog, or make rows of their own)")]
    problems = []
    name = table.name
    if table.args.get("db") or table.args.get("catalog"):
        problems.append(f"it reads {table.sql(dialect=_DIALECT)}{at}: a qualified table is a table of the "
                        f"catalog (or a file), not the snapshot; write '{_SOURCE}'")
    elif name.lower() not in _visible_ctes(table) | {_SOURCE}:
        problems.append(f"it reads {name}{at}; a transform may read only the snapshot as '{_SOURCE}' "
                        "(other tables and views are mutable external state)")
    if table.args.get("version") is not None:
        problems.append(f"time travel (VERSION / TIMESTAMP AS OF){at} is not allowed: a transform reads the "
                        "pinned snapshot")
    return problems


def _visible_ctes(table: exp.Expression) -> set[str]:
    """The CTE names Spark resolves at ``table``: those of every enclosing WITH, but in a CTE's
    own body only the CTEs defined before it."""
    visible: set[str] = set()
    child, node = table, table.parent
    while node is not None:
        if isinstance(node, exp.With):  # ``child`` is one of its CTEs
            for cte in node.expressions:
                if cte is child:
                    break
                visible.add(cte.alias_or_name.lower())
        elif isinstance(node, exp.Query) and isinstance(with_ := _arg(node, "with"), exp.With) and child is not with_:
            visible |= {cte.alias_or_name.lower() for cte in with_.expressions}
        child, node = node, node.parent
    return visible


def _unnamed_columns(tree: exp.Expression, locate: _Locator) -> list[str]:
    """Computed columns whose names are visible (the result, CTEs, subqueries in FROM) and
    that have no name of their own."""
    problems = []
    for select in _named_selects(tree):
        for projection in select.expressions:
            if isinstance(projection, (exp.Alias, exp.Aliases, exp.Column, exp.Star, exp.QueryTransform)):
                continue
            problems.append(f"the computed column{_at(locate, _start(projection))} has no name: "
                            "write it with AS (Spark names such a column after its expression, which the re-printed "
                            "statement may spell otherwise)")
    return problems


def _named_selects(tree: exp.Expression) -> Iterator[exp.Select]:
    queries: list[exp.Expression] = [tree]
    for node in tree.walk():
        if isinstance(node, exp.CTE) or (isinstance(node, exp.Subquery)
                                         and isinstance(node.parent, (exp.From, exp.Join))):
            queries.append(node.this)
    for query in queries:
        while isinstance(query, (exp.SetOperation, exp.Subquery)):
            query = query.this
        if isinstance(query, exp.Select):
            yield query


def _keywords(tree: exp.Expression) -> list[_Found]:
    """Unqualified columns named like the keywords Spark binds as functions when no column of
    that name is in scope (``user``, ``current_date`` ...)."""
    found = []
    for column in tree.find_all(exp.Column):
        name = column.name.lower()
        if not column.table and name in _VALUE_KEYWORDS and not _lambda_parameter(column):
            kind = _VALUE_KEYWORDS[name]
            reads = "the clock" if kind == "volatility" else "the session's user"
            found.append(_Found(kind, name, _start(column), f"{name} reads {reads} when no column of that name is in "
                                "scope: it differs between runs or sessions",
                                f"{_CONSTANT_INSTEAD} (a column named {name} must be qualified: {_SOURCE}.{name})"))
    return found


def _substitutions(text: str, tree: exp.Expression) -> list[_Found]:
    """``${...}``, which Spark replaces from its configuration before it parses the text."""
    if "${" not in tree.sql(dialect=_DIALECT, comments=False):
        return []
    where = text.find("${")
    return [_Found("session", "${...}", where if where >= 0 else None,
                   "Spark replaces ${...} with a value of the session's configuration (or of the environment) "
                   "before it parses the statement, inside string literals too",
                   "write the value itself, or split the text: '$' || '{...}'")]
