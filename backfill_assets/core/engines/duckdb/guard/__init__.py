"""The guard of ``transform_sql`` in DuckDB's dialect: what DuckDB's own parser and binder show.

A transform reshapes the pinned snapshot, the relation ``source``, before newest-wins; the
two builds of a partition must be bit-identical, so the transform must give the same rows
from the same snapshot on every run. Building twice cannot catch a construct that depends on
the order rows arrive in, on the clock or on the session, when both builds share them: this
guard refuses such constructs before anything is built. What it cannot prove is refused.

It reads three things, from a private in-memory DuckDB that holds nothing but an empty,
typed ``source`` (nothing the user wrote is executed):

1. the parse tree (``json_serialize_sql``), for the shape and the names;
2. the bound plan (``json_serialize_plan``), for what the binder chose: each function's
   variant, each cast (implicit ones too), the types of GROUP BY keys and DISTINCT targets;
3. the plan of a probe, the statement with each checked aggregate's argument wrapped in a
   no-op ``greatest(...)``, whose position names the aggregate: the type it aggregates.

Refused, as a :class:`SpecError` (the shape, checked first):

- anything but exactly one SELECT (INSERT, COPY, PRAGMA, SET, ATTACH, CREATE, PIVOT, EXPLAIN,
  DESCRIBE/SHOW/SUMMARIZE, a data-modifying CTE), a parameter, WITH RECURSIVE;
- a relation other than ``source`` or a CTE of the statement, a schema- or catalog-qualified
  table, a table function (``read_parquet``, ``range``, ``glob``, ``duckdb_tables`` ...), time
  travel (``AT (...)``), ``USING SAMPLE`` and ``TABLESAMPLE``.

Refused, as a :class:`TransformError` listing each construct with its place (the kinds of
:class:`TransformProblem`):

- **volatility**: a function DuckDB labels VOLATILE or with side effects (``random``,
  ``uuid``, ``nextval`` ...), or CONSISTENT_WITHIN_QUERY for the variant bound (``now``,
  ``current_date``, ``get_current_timestamp``, one-argument ``age`` (labelled CONSISTENT,
  but it reads the clock) ...): only CONSISTENT functions are allowed.
- **session**: values of the session, settings, environment or catalog, by name whatever
  their label (``current_setting``, ``getenv``, ``current_user``, ``current_schema``,
  ``version``, ``duckdb_*``, ``pragma_*`` ...), including the keywords DuckDB binds as
  functions (``CURRENT_DATE``, ``USER`` ...: an unqualified column of that name is refused
  too); variants over TIMESTAMP WITH TIME ZONE (``year(ts)``, ``date_trunc('day', ts)``,
  ``strftime(ts, ...)``) and casts between time zone types and others (implicit ones too:
  ``ts > '2024-01-01'``), which read the TimeZone setting. A string literal with an explicit
  UTC offset may be cast.
- **order**: LIMIT and OFFSET (even with ORDER BY: the guard does not try to prove an order
  total), DISTINCT ON, POSITIONAL and ASOF joins, ``rowid``; aggregates that pick a row or
  sketch (``first``, ``last``, ``any_value``, ``arbitrary``, ``arg_min``/``arg_max``/
  ``min_by``/``max_by`` (ties), ``mode``, ``approx_quantile``, ``json_group_array`` ...);
  ``list``/``array_agg``/``string_agg``/``group_concat``/``listagg`` unless their ORDER BY
  includes the aggregated value (ARRAY(subquery) is one of them); the window functions
  ``row_number``, ``first_value``, ``last_value``, ``nth_value``, ``lag``, ``lead``,
  ``ntile``, ``fill`` (``rank``, ``dense_rank``, ``percent_rank``, ``cume_dist`` give ties
  one value and are allowed); an aggregate over a ROWS frame other than the whole partition.
- **equal-but-different**: sums, averages, products and statistics computed in FLOAT or
  DOUBLE (``sum``, ``avg``, ``fsum``, ``stddev*``, ``var*``, ``corr``, ``covar*``,
  ``regr_*``, ``entropy``, ``geomean`` ...): the result depends on the order of additions,
  which parallel aggregation does not fix. Where rows are collapsed or ordered by equality,
  values that compare equal but print differently (-0.0 and 0.0, INTERVAL '1 month' and
  '30 days', 'a' and 'A' under a collation): GROUP BY keys, DISTINCT, UNION, INTERSECT,
  EXCEPT, and ``min``/``max``/``median``/``quantile*``/``histogram``/list aggregates over
  such types. An aggregated value whose type the guard cannot learn is refused.
- **untrusted**: a function DuckDB's catalog does not list (a user's macro, an extension's
  function), an aggregate or window function the guard does not know, a variant the guard
  cannot tell, and any construct of the parse tree the guard does not recognise.

The guard judges functions as a fresh DuckDB has them: the connection that runs the
transform must not define macros or functions of the same names (a macro in its default
schema would shadow a built-in), and must run both builds with the same settings.

The package, room by room: ``check`` is the entry point (parse, judge, re-print);
``database`` is the private DuckDB (the parse tree, the plan, ``source``); ``shape`` refuses
what is a SpecError; ``rules`` judges the parse tree, ``probe`` learns the types aggregates
aggregate, ``plan`` judges the bound plan; ``catalog``, ``names``, ``datatypes``, ``nodes``
and ``findings`` are what they share.
"""

from backfill_assets.core.engines.duckdb.guard.check import check_duck_transform
from backfill_assets.core.engines.duckdb.guard.database import type_sql

__all__ = ["check_duck_transform", "type_sql"]
