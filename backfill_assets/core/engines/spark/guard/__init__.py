"""The guard of ``transform_sql`` in Apache Spark SQL's dialect: what sqlglot's Spark parser shows.

A transform reshapes the pinned snapshot, the relation ``source``, before newest-wins; the
two builds of a partition must be bit-identical, so the transform must give the same rows
from the same snapshot on every run. Building twice cannot catch a construct that depends on
the order rows arrive in, on the clock or on the session, when both builds share them: this
guard refuses such constructs before anything is built. What it cannot prove is refused.

There is no Spark in the guard (nothing the user wrote is executed, and no JVM is started).
It reads the statement with sqlglot's Spark parser, three ways:

1. the parse tree, for the shape and the names: each function is judged by the name it is
   written with, against an explicit allowlist of Spark built-ins (with the sqlglot class
   each name must parse into, so that its re-printing is known to mean the same);
2. the tree qualified against ``source`` (``sqlglot.optimizer.qualify`` with the columns
   given), to resolve every column to ``source``, a CTE, a subquery, a LATERAL VIEW or a
   lambda parameter;
3. the kinds of every value (integer, decimal, floating point, text, date, TIMESTAMP,
   TIMESTAMP_NTZ ...), derived by the guard from the source columns and Spark's own typing
   rules (sqlglot's ``annotate_types`` is not used: it types ``avg(decimal)`` as DOUBLE and a
   LATERAL VIEW column as the array it explodes). Where a value may be of several kinds the
   guard assumes the worst of them.

The statement returned is the tree re-printed by sqlglot in Spark SQL (identifiers quoted
with backticks: Spark reads a double-quoted name as a string literal; comments dropped). The
re-printed text is parsed and judged again: it must pass the guard and re-print to itself.

Refused, as a :class:`SpecError` (the shape, checked first):

- anything but exactly one query (SELECT, WITH ... SELECT, UNION / INTERSECT / EXCEPT of
  them): INSERT, CREATE, SET, CACHE, EXPLAIN ..., SELECT ... INTO, WITH RECURSIVE;
- a relation other than ``source`` or a CTE of the statement visible where it is read (a CTE
  shadows ``source``; one read before it is defined is a table of the catalog), a qualified
  table (``default.source``, ``global_temp.v``, a file query ``parquet.`/path```), a
  table-valued function in FROM (``range``, ``explode``, ``IDENTIFIER(...)`` ...),
  TABLESAMPLE, time travel (``VERSION AS OF``, ``TIMESTAMP AS OF``), hints (``/*+ ... */``),
  parameters (``?``, ``:name``, ``${var}``);
- a computed column of the result, of a CTE or of a subquery in FROM without a name
  (``AS``): Spark names it after its expression as Spark prints it, which the re-printed text
  may spell otherwise (``instr(s, 'a')`` is re-printed ``LOCATE('a', s)``);
- a statement sqlglot cannot re-print faithfully (an argument it drops), or whose columns it
  cannot resolve against ``source``.

Allowed as rows of their own: joins (INNER, LEFT/RIGHT/FULL, SEMI, ANTI, CROSS, NATURAL,
USING), subqueries, inline ``VALUES``, and the generators ``explode``/``explode_outer``/
``posexplode``/``posexplode_outer`` in ``LATERAL VIEW [OUTER]`` or as a named column of a
SELECT: a generator emits the elements of each row's array or map in their stored order, row
by row, so its rows are a function of the input rows alone, whatever order those arrive in
(the array or map itself is judged like any other value). Other generators (``inline``,
``stack``, ``json_tuple``) and LATERAL subqueries are refused.

Refused, as a :class:`TransformError` listing each construct with its line and column (the
kinds of :class:`TransformProblem`):

- **volatility**: ``rand``/``random``, ``randn``, ``uuid``, ``shuffle``, ``randstr``,
  ``uniform``, ``monotonically_increasing_id``, ``spark_partition_id``, ``input_file_name``,
  ``input_file_block_*``, ``reflect``/``java_method``/``try_reflect`` (any Java method), and
  the clock: ``current_timestamp``, ``now``, ``current_date``, ``curdate``, ``current_time``,
  ``localtimestamp``, ``unix_timestamp()`` without arguments.
- **session**: values of the session: ``current_user``, ``user``, ``session_user``,
  ``current_database``/``current_schema``/``current_catalog``/``current_path``, ``version``,
  ``current_timezone``, a ``${...}`` anywhere in the statement (Spark substitutes it from its
  configuration before parsing, inside string literals too), and the keywords Spark binds as
  functions when no column has their name (``user``, ``current_date`` ...: an unqualified
  column of that name is refused too). And what reads ``spark.sql.session.timeZone``: every
  conversion of a TIMESTAMP (LTZ) to or from text, DATE or TIMESTAMP_NTZ, written (``CAST``,
  ``to_date(ts)``, ``date(ts)``) or implicit (``ts > '2024-01-01'``, ``year(ts)``,
  ``concat(ts, '')``, ``coalesce(ts, d)``, UNION of a TIMESTAMP with text); arithmetic on a
  TIMESTAMP; ``date_format``, ``from_unixtime``, ``to_timestamp``, ``unix_timestamp`` and
  ``to_unix_timestamp`` (with arguments), ``to_date`` with a format, ``date_trunc``,
  ``make_timestamp*``, ``to_timestamp_ltz``/``_ntz``, ``convert_timezone``,
  ``months_between``, ``window``, ``to_json``/``from_json``/``to_csv``/``from_csv``, and
  ``hour``/``minute``/``second`` over anything but TIMESTAMP_NTZ; ``sequence`` over anything
  but integers; DATE plus an interval with a time part. Allowed over TIMESTAMP values:
  comparisons with other TIMESTAMPs, ``unix_micros``/``unix_millis``/``unix_seconds``,
  casts to and from numbers, ``hash``/``xxhash64``, ``count``/``min``/``max``, and
  ``from_utc_timestamp``/``to_utc_timestamp`` with a literal zone; a TIMESTAMP literal
  with an explicit UTC offset (``TIMESTAMP '2024-01-01 00:00:00Z'``). Functions over dates,
  integers, decimals and text are judged each by the allowlist.
- **order**: LIMIT and OFFSET (even with ORDER BY: the guard does not try to prove an order
  total); aggregates that pick a row or sketch (``first``, ``last``, ``any_value``,
  ``max_by``, ``min_by``, ``mode``, ``approx_count_distinct``, ``percentile_approx``/
  ``approx_percentile``, ``approx_top_k``, ``histogram_numeric``, ``count_min_sketch``);
  ``collect_list``/``array_agg``/``collect_set``, unless directly sorted by ``sort_array``
  or a one-argument ``array_sort`` (or only counted by ``size``), over exact values;
  ``listagg``/``string_agg`` unless ``WITHIN GROUP (ORDER BY ...)`` includes the aggregated
  value and the delimiter is written (sqlglot re-prints a missing one as ``','``, Spark
  defaults to ``''``); the window functions ``row_number``, ``ntile``, ``lag``, ``lead``,
  ``first_value``, ``last_value``, ``nth_value`` (``rank``, ``dense_rank``,
  ``percent_rank``, ``cume_dist`` give ties one value and are allowed); an aggregate over a
  ROWS frame other than the whole partition.
- **equal-but-different**: ``sum``/``try_sum`` over anything but integers, decimals and
  intervals; ``avg``/``mean``/``try_avg`` over anything but decimals and intervals (Spark
  averages integers in DOUBLE); the statistics, which Spark computes in DOUBLE whatever the
  input (``stddev*``, ``variance``, ``var_*``, ``corr``, ``covar_*``, ``skewness``,
  ``kurtosis``, ``regr_*`` but ``regr_count``): the last digits depend on the order of
  additions, which parallel aggregation does not fix (an exact sum that overflows fails the
  build in ANSI mode: it does not change the rows). Where rows are collapsed by equality,
  values of FLOAT or DOUBLE (-0.0 and 0.0, NaN), anywhere in the value (an array of
  doubles): GROUP BY keys (GROUPING SETS, ROLLUP, CUBE, ALL too), SELECT DISTINCT, UNION,
  INTERSECT, EXCEPT (ALL too), ``min``/``max``. A value whose kind the guard cannot learn
  is refused there too.
- **untrusted**: a function not on the allowlist (a UDF, a function qualified by a schema,
  a Spark built-in the guard does not vouch for, such as ``percentile``, ``median``,
  ``typeof``, ``to_char``, ``parse_json``, ``collate``), a spelling sqlglot re-prints as
  another function (``log10``/``log2``, re-printed ``log(10, x)``, which Spark computes
  differently; ``array_size``, re-printed ``size``), a window function used without OVER or
  an aggregate used in an unexpected place, PIVOT, TRANSFORM ... USING, LATERAL subqueries,
  named windows, DISTRIBUTE BY / SORT BY / CLUSTER BY, and any construct of the parse tree
  the guard does not recognise.

The guard judges functions as a fresh Spark session has them: the session that runs the
transform must not register functions of the same names, and must run both builds with the
same settings (ANSI mode, the session time zone, ``spark.sql.caseSensitive`` off, the default
collation, ``spark.sql.legacy.*``) on the same JVM configuration (transcendental functions,
case mappings and time zone rules are the JVM's).

The package, room by room: ``check`` is the entry point (parse, judge, re-print); ``parse``
reads the statement and the columns of ``source``; ``shape`` refuses what is a SpecError;
``rules`` visits the tree (the clauses of queries), ``functions`` judges each function by its
rule of the allowlist (``allowlist.txt``, read by ``allowlist``), ``timezone`` the conversions
and arithmetic that read the session time zone, ``valuekinds`` the kinds of every value;
``names``, ``nodes``, ``kinds`` and ``findings`` are what they share.
"""

from backfill_assets.core.engines.spark.guard.check import check_spark_transform

__all__ = ["check_spark_transform"]
