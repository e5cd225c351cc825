"""Reading with sqlglot's Spark parser: the one query of ``transform_sql``, and the columns of
``source`` with their kinds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from backfill_assets.core.engines.spark.guard.kinds import _UNKNOWN, Kinds, _type_kinds
from backfill_assets.core.engines.spark.guard.nodes import _DIALECT, _SOURCE
from backfill_assets.core.errors import SpecError

_TYPE_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\s+[A-Za-z][A-Za-z0-9_]*)*(\s*[<(][A-Za-z0-9_<>(),:\s]*[>)])?")


@dataclass(frozen=True)
class _Source:
    """``source``'s columns: their types as given, as sqlglot's schema, and their kinds."""

    types: dict[str, str]
    schema: dict[str, dict[str, str]]
    kinds: dict[str, Kinds]

    @classmethod
    def of(cls, columns: Sequence[tuple[str, str]]) -> _Source:
        """The columns (name, Spark type text as ``DataType.simpleString()`` gives it). A type
        the guard cannot read is of an unknown kind: what depends on its kind is refused."""
        if not columns:
            raise SpecError(f"{_SOURCE} has no columns to check transform_sql against")
        types: dict[str, str] = {}
        schema: dict[str, str] = {}
        kinds: dict[str, Kinds] = {}
        for name, type_text in columns:
            if not isinstance(name, str) or not name or name.lower() in kinds:
                raise SpecError(f"{_SOURCE} column {name!r} ({type_text!r}) is not a column the guard can check "
                                "(no name, or the name of another column in another case)")
            parsed = _data_type(str(type_text))
            types[name] = str(type_text)
            schema[name] = parsed.sql(dialect=_DIALECT) if parsed is not None else "STRING"  # only names matter
            kinds[name.lower()] = _type_kinds(parsed) if parsed is not None else frozenset({_UNKNOWN})
        return cls(types, {_SOURCE: schema}, kinds)


def _data_type(type_text: str) -> exp.DataType | None:
    """A Spark type text as sqlglot reads it, if it is one whole type (None otherwise)."""
    if not _TYPE_TEXT.fullmatch(type_text):
        return None
    try:
        statements = sqlglot.parse(f"SELECT CAST(NULL AS {type_text})", read=_DIALECT)
    except SqlglotError:
        return None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select) or len(statements[0].expressions) != 1:
        return None
    cast = statements[0].expressions[0]
    if not isinstance(cast, (exp.Cast, exp.TryCast)) or not isinstance(cast.to, exp.DataType):
        return None
    if cast.to.this is None or cast.to.is_type(exp.DataType.Type.USERDEFINED):
        return None
    return cast.to


def _parse(text: str) -> exp.Expression:
    """The one statement of ``text`` (SpecError otherwise)."""
    try:
        statements = [s for s in sqlglot.parse(text, read=_DIALECT) if s is not None]
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        where = f" at line {first['line']}, column {first['col']}" if first.get("line") else ""
        description = first.get("description") or str(err).splitlines()[0]
        raise SpecError(f"transform_sql does not parse: sqlglot says {description}{where}") from None
    except Exception as err:  # noqa: BLE001 - sqlglot's parser raises ValueError, IndexError ... on some input
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise SpecError(f"transform_sql does not parse: sqlglot says {first}") from None
    if len(statements) != 1:
        raise SpecError(f"transform_sql must be exactly one SELECT statement; it has {len(statements)}")
    statement = statements[0]
    if not isinstance(statement, exp.Query) or isinstance(statement, exp.Subquery):
        kind = statement.this.upper() if isinstance(statement, exp.Command) else type(statement).__name__.upper()
        if isinstance(statement, exp.Subquery):
            kind = "parenthesised query"
        raise SpecError(f"transform_sql must be a SELECT; it is {_article(kind)} {kind}")
    return statement


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"
