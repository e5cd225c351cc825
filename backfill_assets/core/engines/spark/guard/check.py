"""The entry point of the Spark guard: parse, check the shape, qualify against ``source``,
apply the rules, and re-print the statement (which must pass the guard and re-print to
itself)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import traverse_scope

from backfill_assets.core.engines.spark.guard.findings import _Found, _Locator, _problems
from backfill_assets.core.engines.spark.guard.nodes import _DIALECT, _SOURCE
from backfill_assets.core.engines.spark.guard.parse import _parse, _Source
from backfill_assets.core.engines.spark.guard.rules import _Rules
from backfill_assets.core.engines.spark.guard.shape import _check_shape, _keywords, _substitutions
from backfill_assets.core.errors import SpecError, TransformError


def check_spark_transform(text: str, source_columns: Sequence[tuple[str, str]]) -> str:
    """Parse ``text`` with sqlglot's Spark parser and apply the rules; return the statement
    re-printed in Spark SQL (one statement, identifiers quoted with backticks, no comments),
    to be run with ``source`` registered as a temporary view.

    ``source_columns``: (name, Spark type text such as 'bigint', 'string', 'decimal(12,2)',
    'timestamp', as ``DataType.simpleString()`` gives it) of ``source``. A type the guard cannot
    read makes its column of an unknown kind (what depends on the kind is refused).

    Raises:
        SpecError: it does not parse, is not exactly one query, reads another relation, or
            does not resolve against ``source``.
        TransformError: constructs that can change its rows between runs, each a
            :class:`TransformProblem`, with its line and column in ``text``.
    """
    source = _Source.of(source_columns)
    tree, found = _examine(text, source)
    if found:
        raise TransformError(_problems(found, _Locator(text)))
    return _reprint(tree, source)


def _examine(text: str, source: _Source) -> tuple[exp.Expression, list[_Found]]:
    """The parse tree of ``text`` and what the rules refuse in it (SpecError: its shape)."""
    locate = _Locator(text)
    tree = _parse(text)
    _check_shape(tree, locate)
    found = _keywords(tree) + _substitutions(text, tree)
    qualified = tree.copy()
    try:
        qualify(qualified, schema=source.schema, dialect=_DIALECT, validate_qualify_columns=True)
        scopes = list(traverse_scope(qualified))
    except Exception as err:  # noqa: BLE001 - sqlglot raises several kinds on what it cannot resolve
        found += _Rules(locate, source, [], typed=False).check(tree)
        if found:  # what the parse tree shows is refused already; the rest needs the columns
            return tree, found
        listed = ", ".join(f"{name} {kind}" for name, kind in source.types.items())
        raise SpecError(f"transform_sql does not resolve against {_SOURCE} ({listed}): sqlglot says "
                        f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    found += _Rules(locate, source, scopes, typed=True).check(qualified)
    return tree, found


def _print(tree: exp.Expression) -> str:
    return tree.sql(dialect=_DIALECT, identify=True, comments=False, unsupported_level=ErrorLevel.RAISE)


def _reprint(tree: exp.Expression, source: _Source) -> str:
    """The statement as sqlglot prints it in Spark SQL: it must pass the guard too, and print
    to itself when read again."""
    try:
        text = _print(tree)
    except SqlglotError as err:
        raise SpecError(f"transform_sql is refused: sqlglot cannot re-print it in Spark SQL ({err})") from None
    try:
        again, found = _examine(text, source)
        same = _print(again) == text
    except SpecError as err:
        found, same = [_Found("untrusted", "the re-printed statement", None, str(err), "")], True
    except SqlglotError as err:
        found, same = [_Found("untrusted", "the re-printed statement", None, str(err), "")], True
    if found or not same:
        listed = "; ".join(f.problem for f in found) or "it prints otherwise when read again"
        raise SpecError(f"transform_sql is refused: sqlglot re-prints it as another statement ({listed})")
    return text
