"""The Spark name of a function node: as written in the text, else as sqlglot names or prints
it; and the spellings sqlglot re-prints as another function."""

from __future__ import annotations

import re

from sqlglot import exp

from backfill_assets.core.engines.spark.guard.allowlist import _SPECS
from backfill_assets.core.engines.spark.guard.nodes import _DIALECT, _inside

# The Spark name of a node that has no position (sqlglot built it from a keyword or a syntax of
# its own: CURRENT_DATE, POSITION(a IN b), EXTRACT(... FROM ...), TRIM(BOTH ...), a % b ...).
_CLASS_NAMES = {
    "CurrentDate": "current_date", "CurrentTimestamp": "current_timestamp", "CurrentTime": "current_time",
    "Localtimestamp": "localtimestamp", "Localtime": "localtime", "CurrentUser": "current_user",
    "SessionUser": "session_user", "CurrentCatalog": "current_catalog", "CurrentSchema": "current_schema",
    "CurrentDatabase": "current_database", "StrPosition": "locate", "Extract": "extract", "Trim": "trim",
    "Substring": "substring", "Overlay": "overlay", "Mod": "mod", "GroupConcat": "listagg", "Struct": "struct",
    "Array": "array", "Coalesce": "coalesce", "Bracket": "element_at", "Exists": "exists", "Any": "any",
    "Count": "count", "Ceil": "ceil", "Floor": "floor", "Rand": "rand", "Log": "log", "Ln": "ln",
    "BitwiseLeftShift": "shiftleft", "BitwiseRightShift": "shiftright", "RegexpLike": "rlike",
    "ArraySize": "size", "TsOrDsAdd": "date_add", "StrToUnix": "unix_timestamp", "Space": "space",
}

# Spellings sqlglot re-prints as another function, with another result.
_LOSSY = {
    "log10": "sqlglot re-prints log10(x) as log(10, x), which Spark computes as ln(x) / ln(10): "
             "log10(1000) is 3.0, log(10, 1000) is 2.9999999999999996",
    "log2": "sqlglot re-prints log2(x) as log(2, x), which Spark computes as ln(x) / ln(2)",
    "array_size": "sqlglot re-prints array_size(x) as size(x), which some settings make -1 for NULL",
    "to_char": "sqlglot re-prints to_char(x, format) as a cast to STRING, dropping the format",
    "to_number": "sqlglot re-prints to_number(x, format) without its format",
    "parse_json": "sqlglot re-prints parse_json(x) as x",
    "unix_date": "sqlglot re-prints unix_date(d) as a three-argument datediff",
}


def _written(node: exp.Expression, text: str) -> str | None:
    """The function name as written, where sqlglot kept its position."""
    start, end = (node.meta.get("start"), node.meta.get("end")) if node.meta else (None, None)
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    word = text[start:end + 1].strip("`").lower()
    return word if re.fullmatch(r"[a-z_][a-z0-9_]*", word) else None


def _name_before(node: exp.Expression, text: str) -> str | None:
    """The name written just before the first argument of a call sqlglot did not place
    (``string_agg(x, ',')``, ``approx_percentile(x, 0.5)``)."""
    inside = _inside(node)
    if inside is None:
        return None
    found = re.search(r"`?([A-Za-z_][A-Za-z0-9_]*)`?\s*\(\s*$", text[:inside])
    return found.group(1).lower() if found else None


def _spark_name(node: exp.Expression, text: str) -> str:
    """The Spark name of a function node: as written, else as sqlglot names or prints it."""
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    written = _written(node, text)
    if written:
        return written
    before = _name_before(node, text)
    if before is not None:
        spec = _SPECS.get(before)
        if before in _LOSSY or (spec is not None and type(node).__name__ in spec.classes):
            return before
    if type(node).__name__ in _CLASS_NAMES:
        return _CLASS_NAMES[type(node).__name__]
    printed = re.match(r"[A-Za-z_][A-Za-z0-9_]*", node.sql(dialect=_DIALECT))
    return printed.group(0).lower() if printed else type(node).__name__.lower()
