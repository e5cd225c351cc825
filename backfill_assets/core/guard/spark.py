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
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, SqlglotError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope

from backfill_assets.core.errors import SpecError, TransformError, TransformProblem

_SOURCE = "source"
_DIALECT = "spark"

Kinds = frozenset[str]

# --- kinds of values ---------------------------------------------------------------------------

_INTEGER, _DECIMAL, _FLOAT, _STRING, _BINARY = "integer", "decimal", "float", "string", "binary"
_BOOLEAN, _DATE, _LTZ, _NTZ, _INTERVAL = "boolean", "date", "timestamp", "timestamp_ntz", "interval"
_NULL, _UNKNOWN = "null", "unknown"
_CONTAINERS = frozenset({"array", "map", "struct"})
_UNKNOWN_VALUE = exp.Var(this="?")  # a column the guard cannot see (of SELECT *, say): of an unknown kind
_NUMBERS = frozenset({_INTEGER, _DECIMAL, _FLOAT})

_TYPE_KINDS = {
    "TINYINT": _INTEGER, "SMALLINT": _INTEGER, "INT": _INTEGER, "BIGINT": _INTEGER,
    "DECIMAL": _DECIMAL, "FLOAT": _FLOAT, "DOUBLE": _FLOAT,
    "TEXT": _STRING, "VARCHAR": _STRING, "CHAR": _STRING, "BINARY": _BINARY, "BOOLEAN": _BOOLEAN,
    "DATE": _DATE, "TIMESTAMP": _LTZ, "TIMESTAMPTZ": _LTZ, "TIMESTAMPLTZ": _LTZ, "TIMESTAMPNTZ": _NTZ,
    "INTERVAL": _INTERVAL, "NULL": _NULL, "ARRAY": "array", "MAP": "map", "STRUCT": "struct",
}

# A time stamp literal with an explicit UTC offset, which needs no session time zone to read.
_OFFSET_LITERAL = re.compile(r".*\d:\d{2}(:\d{2}(\.\d+)?)?\s*(Z|UTC|GMT|[+-]\d{1,2}(:?\d{2}){0,2})",
                             re.IGNORECASE | re.DOTALL)
# EXTRACT / date_part fields that a DATE answers without a time zone.
_DATE_FIELDS = frozenset({
    "YEAR", "Y", "YEARS", "YR", "YRS", "YEAROFWEEK", "QUARTER", "QTR", "MONTH", "MON", "MONS", "MONTHS",
    "WEEK", "W", "WEEKS", "DAY", "D", "DAYS", "DAYOFWEEK", "DOW", "DAYOFWEEK_ISO", "DOW_ISO", "DOY",
})
_TYPE_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\s+[A-Za-z][A-Za-z0-9_]*)*(\s*[<(][A-Za-z0-9_<>(),:\s]*[>)])?")
_DATE_UNITS = frozenset({"YEAR", "YEARS", "MONTH", "MONTHS", "WEEK", "WEEKS", "DAY", "DAYS"})
# Keywords Spark binds as functions when no column of that name is in scope.
_VALUE_KEYWORDS = {
    "current_date": "volatility", "current_timestamp": "volatility", "current_time": "volatility",
    "localtimestamp": "volatility", "current_user": "session", "user": "session", "session_user": "session",
}

# --- the allowlist -----------------------------------------------------------------------------
#
# Each Spark function the guard knows: the sqlglot classes its name may parse into ('-': sqlglot
# does not know it, Anonymous), the rule that judges it, and the kinds of its result:
#
# rules: pure      deterministic; an argument that may be a TIMESTAMP is refused (Spark converts
#                  it to the parameter type with the session time zone)
#        coerce    deterministic; its arguments are brought to one type, so a TIMESTAMP may only
#                  meet TIMESTAMPs (pairs: keys with keys, values with values)
#        anytype   deterministic for arguments of every kind (no conversion to text or dates)
#        lambda    a higher-order function: its arguments as anytype, its lambda is judged itself
#        castfn    bigint(x) ...: a cast to the type of its result
#        date      reads its arguments as DATE (a TIMESTAMP is converted with the time zone)
#        field     EXTRACT / date_part: over DATE for date fields, or over TIMESTAMP_NTZ
#        ntz       hour/minute/second: only over TIMESTAMP_NTZ
#        instant   unix_micros ...: only over TIMESTAMP
#        zone      from_utc_timestamp / to_utc_timestamp: a TIMESTAMP and a literal zone
#        integers  sequence: over integers only
#        volatile, clock, session, tz, order, sketch, stat: refused
#        sum, avg, minmax, agg, collect, listagg: aggregates; rank: ranking window functions;
#        generator: explode and posexplode, in LATERAL VIEW or as a column of a SELECT
# results: kinds, joined with '+': a kind, or same (the kinds of the arguments), first (of the
#        first argument), elem (the elements of the first argument), body (of the lambdas),
#        rounded (floor/ceil: integers from floating point), quotient (a division)
_ALLOWLIST = """
abs Abs pure same
acos Acos pure float
acosh Acosh pure float
asin Asin pure float
asinh Asinh pure float
atan Atan pure float
atan2 Atan2 pure float
atanh Atanh pure float
cbrt Cbrt pure float
cos Cos pure float
cosh Cosh pure float
cot Cot pure float
csc Csc pure float
sec Sec pure float
sin Sin pure float
sinh Sinh pure float
tan Tan pure float
tanh Tanh pure float
degrees Degrees pure float
radians Radians pure float
exp Exp pure float
expm1 - pure float
ln Ln pure float
log Ln,Log pure float
log1p - pure float
sqrt Sqrt pure float
pi Pi pure float
e - pure float
pow Pow pure float
power Pow pure float
hypot - pure float
rint Rint pure float
sign Sign pure float
signum Sign pure float
ceil Ceil pure rounded
ceiling Ceil pure rounded
floor Floor pure rounded
round Round pure same
bround - pure same
negative Negative pure same
positive - pure same
mod Mod pure same
pmod - pure same
try_mod - pure same
try_add SafeAdd pure same
try_subtract SafeSubtract pure same
try_multiply SafeMultiply pure same
try_divide SafeDivide pure quotient
factorial Factorial pure integer
conv - pure string
bin - pure string
hex Hex pure string
unhex Unhex pure binary
shiftleft BitwiseLeftShift pure same
shiftright BitwiseRightShift pure same
shiftrightunsigned - pure same
bit_count BitwiseCount pure integer
bit_get Getbit pure integer
getbit Getbit pure integer
width_bucket WidthBucket pure integer
isnan IsNan pure boolean
nanvl Nanvl pure same
zeroifnull - pure same
nullifzero - pure same
greatest Greatest coerce same
least Least coerce same
ascii Ascii pure integer
base64 ToBase64 pure string
unbase64 FromBase64 pure binary
bit_length BitLength pure integer
octet_length - pure integer
length Length pure integer
len Length pure integer
char_length Length pure integer
character_length Length pure integer
btrim - pure string
trim Trim pure string
ltrim Trim pure string
rtrim Trim pure string
chr Chr pure string
char Chr pure string
concat Concat pure same
concat_ws ConcatWs pure string
contains Contains pure boolean
startswith StartsWith pure boolean
endswith EndsWith pure boolean
elt Elt pure same
encode Encode pure binary
decode Decode pure string
find_in_set - pure integer
format_number - pure string
format_string Format pure string
printf - pure string
initcap Initcap pure string
instr StrPosition pure integer
locate StrPosition pure integer
position StrPosition pure integer
lcase Lower pure string
lower Lower pure string
ucase Upper pure string
upper Upper pure string
left Left pure string
right Right pure string
levenshtein Levenshtein pure integer
lpad Pad pure same
rpad Pad pure same
md5 MD5 pure string
sha SHA pure string
sha1 SHA pure string
sha2 SHA2 pure string
crc32 - pure integer
hash - anytype integer
xxhash64 - anytype integer
overlay Overlay pure same
regexp_count RegexpCount pure integer
regexp_extract RegexpExtract pure string
regexp_extract_all RegexpExtractAll pure array+string
regexp_instr RegexpInstr pure integer
regexp_like RegexpLike pure boolean
rlike RegexpLike pure boolean
regexp RegexpLike,- pure boolean
regexp_replace RegexpReplace pure string
regexp_substr RegexpSubstr pure string
repeat Repeat pure string
replace Replace pure string
reverse Reverse pure same
soundex Soundex pure string
space Space pure string
split RegexpSplit pure array+string
split_part SplitPart pure string
substr Substring pure same
substring Substring pure same
substring_index SubstringIndex pure string
translate Translate pure string
url_encode - pure string
url_decode - pure string
mask - pure string
luhn_check - pure boolean
to_binary ToBinary pure binary
get_json_object JSONExtractScalar pure string
json_array_length - pure integer
json_object_keys JSONKeys pure array+string
is_valid_utf8 - pure boolean
make_valid_utf8 - pure string
validate_utf8 - pure string
coalesce Coalesce coerce same
ifnull Coalesce coerce same
nvl Coalesce coerce same
nvl2 Nvl2 coerce same
nullif Nullif coerce first
equal_null EqualNull coerce boolean
isnull - anytype boolean
isnotnull - anytype boolean
bigint - castfn integer
smallint - castfn integer
tinyint - castfn integer
decimal - castfn decimal
binary - castfn binary
year Year date integer
month Month date integer
day Day date integer
dayofmonth DayOfMonth date integer
dayofweek DayOfWeek date integer
dayofyear DayOfYear date integer
weekofyear WeekOfYear date integer
quarter Quarter date integer
weekday - date integer
add_months AddMonths date date
last_day LastDay date date
next_day NextDay date date
trunc DateTrunc date date
date_add TsOrDsAdd date date
date_sub TsOrDsAdd date date
dateadd TsOrDsAdd date date
datediff DateDiff date integer
date_diff DateDiff date integer
to_date TsOrDsToDate date date
date_from_unix_date DateFromUnixDate pure date
make_date - pure date
make_dt_interval - pure interval
make_ym_interval - pure interval
make_interval MakeInterval pure interval
extract Extract field integer
date_part - field integer
datepart - field integer
hour Hour ntz integer
minute Minute ntz integer
second Second ntz integer
unix_micros UnixMicros instant integer
unix_millis UnixMillis instant integer
unix_seconds UnixSeconds instant integer
timestamp_seconds - pure timestamp
timestamp_millis - pure timestamp
timestamp_micros - pure timestamp
from_utc_timestamp AtTimeZone zone timestamp
to_utc_timestamp FromTimeZone zone timestamp
sequence GenerateSeries integers array+same
array Array coerce array+same
array_append ArrayAppend coerce first
array_prepend ArrayPrepend coerce first
array_compact ArrayCompact anytype first
array_contains ArrayContains coerce boolean
array_distinct ArrayDistinct anytype first
array_except ArrayExcept coerce first
array_intersect ArrayIntersect coerce first
array_union - coerce first
array_insert ArrayInsert anytype first
array_join ArrayToString pure string
array_max ArrayMax anytype elem
array_min ArrayMin anytype elem
array_position ArrayPosition coerce integer
array_remove ArrayRemove coerce first
array_repeat - anytype array+first
arrays_overlap - coerce boolean
arrays_zip ArraysZip anytype array+struct+same
array_sort ArraySort lambda first
sort_array ArraySort anytype first
size ArraySize anytype integer
cardinality - anytype integer
slice ArraySlice anytype first
flatten Flatten anytype elem
element_at Bracket anytype elem
try_element_at Bracket anytype elem
get - anytype elem
transform Transform lambda array+body
filter ArrayFilter lambda first
exists Exists lambda boolean
forall - lambda boolean
aggregate Reduce lambda body+second
reduce Reduce lambda body+second
zip_with - lambda array+body
map_filter - lambda first
transform_keys - lambda first+body
transform_values - lambda first+body
map VarMap pairs map+same
map_from_arrays Map anytype map+elem
map_from_entries MapFromEntries anytype map+elem
map_keys MapKeys anytype array+elem
map_values - anytype array+elem
map_entries - anytype array+struct+elem
map_contains_key MapContainsKey coerce boolean
map_concat - coerce first
str_to_map StrToMap pure map+string
named_struct Struct anytype struct+same
struct Struct anytype struct+same
rand Rand volatile float
random Rand volatile float
randn Randn volatile float
uuid Uuid volatile string
shuffle Shuffle volatile first
randstr Randstr volatile string
uniform Uniform volatile same
monotonically_increasing_id - volatile integer
spark_partition_id - volatile integer
input_file_name - volatile string
input_file_block_start - volatile integer
input_file_block_length - volatile integer
reflect - volatile string
java_method - volatile string
try_reflect - volatile string
now - clock timestamp
current_timestamp CurrentTimestamp clock timestamp
current_date CurrentDate clock date
curdate CurrentDate clock date
current_time CurrentTime clock unknown
localtimestamp Localtimestamp clock timestamp_ntz
localtime Localtime clock unknown
current_user CurrentUser session string
user - session string
session_user SessionUser session string
current_database CurrentDatabase session string
current_schema CurrentSchema session string
current_catalog CurrentCatalog session string
current_path - session string
version - session string
current_timezone CurrentTimezone session string
date_format TimeToStr tz string
from_unixtime UnixToStr tz string
to_timestamp StrToTime tz timestamp
try_to_timestamp - tz timestamp
to_timestamp_ltz - tz timestamp
to_timestamp_ntz - tz timestamp_ntz
unix_timestamp StrToUnix tz integer
to_unix_timestamp StrToUnix tz integer
date_trunc TimestampTrunc tz timestamp
make_timestamp TimestampFromParts tz timestamp
try_make_timestamp - tz timestamp
make_timestamp_ltz - tz timestamp
make_timestamp_ntz - tz timestamp_ntz
convert_timezone ConvertTimezone tz timestamp
months_between MonthsBetween tz float
window - tz struct+timestamp
session_window - tz struct+timestamp
window_time - tz timestamp
to_json JSONFormat tz string
from_json FromJson tz unknown
to_csv - tz string
from_csv - tz unknown
first First order first
last Last order first
first_value FirstValue order first
last_value LastValue order first
nth_value NthValue order first
any_value AnyValue order first
max_by ArgMax order first
min_by ArgMin order first
mode Mode order first
lag Lag order first
lead Lead order first
row_number RowNumber order integer
ntile Ntile order integer
approx_count_distinct ApproxDistinct sketch integer
percentile_approx ApproxQuantile sketch first
approx_percentile ApproxQuantile sketch first
approx_top_k ApproxTopK sketch unknown
histogram_numeric - sketch unknown
count_min_sketch - sketch binary
stddev Stddev stat float
std - stat float
stddev_pop StddevPop stat float
stddev_samp StddevSamp stat float
variance Variance stat float
var_samp Variance stat float
var_pop VariancePop stat float
corr Corr stat float
covar_pop CovarPop stat float
covar_samp CovarSamp stat float
skewness Skewness stat float
kurtosis Kurtosis stat float
regr_avgx RegrAvgx stat float
regr_avgy RegrAvgy stat float
regr_intercept RegrIntercept stat float
regr_r2 RegrR2 stat float
regr_slope RegrSlope stat float
regr_sxx RegrSxx stat float
regr_sxy RegrSxy stat float
regr_syy RegrSyy stat float
sum Sum sum same
try_sum - sum same
avg Avg avg same
mean - avg same
try_avg - avg same
min Min minmax first
max Max minmax first
count Count agg integer
count_if CountIf agg integer
bool_and LogicalAnd agg boolean
bool_or LogicalOr agg boolean
every - agg boolean
some - agg boolean
any Any agg boolean
bit_and BitwiseAndAgg agg same
bit_or BitwiseOrAgg agg same
bit_xor BitwiseXorAgg agg same
regr_count RegrCount agg integer
grouping Grouping anytype integer
grouping_id GroupingId anytype integer
collect_list ArrayAgg collect array+same
array_agg ArrayAgg collect array+same
collect_set ArrayUniqueAgg collect array+same
listagg GroupConcat listagg string
string_agg GroupConcat listagg string
rank Rank rank integer
dense_rank DenseRank rank integer
percent_rank PercentRank rank float
cume_dist CumeDist rank float
explode Explode generator elem
explode_outer _ExplodeOuter generator elem
posexplode Posexplode generator elem
posexplode_outer PosexplodeOuter generator elem
"""


@dataclass(frozen=True)
class _Spec:
    name: str
    classes: frozenset[str]
    rule: str
    result: tuple[str, ...]


def _allowlist() -> dict[str, _Spec]:
    specs = {}
    for line in _ALLOWLIST.strip().splitlines():
        name, classes, rule, result = line.split()
        names = frozenset("Anonymous" if c == "-" else c for c in classes.split(","))
        specs[name] = _Spec(name, names, rule, tuple(result.split("+")))
    return specs


_SPECS = _allowlist()
_SPEC_CLASSES = frozenset().union(*(spec.classes for spec in _SPECS.values())) - {"Anonymous"}

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

_AGGREGATE_RULES = frozenset({"sum", "avg", "minmax", "agg", "collect", "listagg", "stat", "sketch"})
_WINDOW_ONLY = frozenset({"first_value", "last_value", "nth_value", "lag", "lead", "row_number", "ntile"})

# Parse-tree classes that need no rule of their own (their parts are walked and judged).
_PLAIN_CLASSES = frozenset({
    "Select", "Union", "Intersect", "Except", "With", "CTE", "Subquery", "From", "Join", "Where", "Group",
    "Having", "Order", "Ordered", "Alias", "Aliases", "TableAlias", "Identifier", "Column", "Star", "Paren",
    "Tuple", "Literal", "Boolean", "Null", "HexString", "DataType", "DataTypeParam", "ColumnDef", "Var",
    "Interval", "IntervalSpan", "Table", "Values", "Lateral", "Window", "WindowSpec", "Distinct", "Filter",
    "Limit", "Offset", "Lambda", "Not", "And", "Or", "Xor", "Is", "Neg", "BitwiseAnd", "BitwiseOr",
    "BitwiseXor", "BitwiseNot", "DPipe", "Like", "ILike", "Escape", "EQ", "NEQ", "GT", "GTE", "LT", "LTE",
    "NullSafeEQ", "NullSafeNEQ", "In", "Between", "Add", "Sub", "Mul", "Div", "IntDiv", "Dot", "PropertyEQ",
    "GroupingSets", "Rollup", "Cube", "IgnoreNulls", "RespectNulls", "Cast", "TryCast", "Case", "If", "Bracket",
    "JSONPath", "JSONPathRoot", "JSONPathKey", "JSONPathSubscript",
})
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_PREDICATES = (*_COMPARISONS, exp.And, exp.Or, exp.Xor, exp.Not, exp.Is, exp.In, exp.Between, exp.Like,
               exp.ILike, exp.Escape, exp.Exists)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg)

_SELECT_ARGS = frozenset({
    "expressions", "from", "from_", "joins", "laterals", "where", "group", "having", "order", "limit",
    "offset", "distinct", "with", "with_",
})
_SET_ARGS = frozenset({"this", "expression", "distinct", "with", "with_", "order", "limit", "offset"})
_TABLE_ARGS = frozenset({"this", "alias", "db", "catalog", "sample", "version"})
_JOIN_ARGS = frozenset({"this", "kind", "side", "method", "on", "using"})
_CLAUSE_WORDS = {"pivots": "PIVOT", "windows": "WINDOW", "distribute": "DISTRIBUTE BY", "sort": "SORT BY",
                 "cluster": "CLUSTER BY", "qualify": "QUALIFY", "hint": "a hint", "into": "INTO"}
_JOIN_KINDS = frozenset({"", "INNER", "OUTER", "CROSS", "SEMI", "ANTI"})

_CONSTANT_INSTEAD = "take the value from a source column, or write it as a constant literal"
_TZ_INSTEAD = ("keep TIMESTAMP values as they are, compare them with TIMESTAMPs, or turn them into numbers "
               "with unix_micros(ts) (and back with timestamp_micros(n)), which depend on no setting; write "
               "literals with an explicit UTC offset (TIMESTAMP '2024-01-01 00:00:00Z')")
_EXACT_INSTEAD = ("cast the value to an exact type first: DECIMAL(p,s) for numbers, or STRING "
                  "(CAST(x AS STRING) tells -0.0 from 0.0)")
_ORDER_INSTEAD = ("filter with WHERE, or keep rank() OVER (...) = 1 (the tool keeps the newest row of each "
                  "key itself)")


@dataclass(frozen=True)
class _Found:
    """A construct refused, at a character offset of the text (None: the guard cannot place it)."""

    kind: str
    construct: str
    location: int | None
    problem: str
    instead: str


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


# --- the text and the tree ----------------------------------------------------------------------


class _Locator:
    """Character offsets of the text -> line, column and snippet."""

    def __init__(self, text: str) -> None:
        self.text = text

    def where(self, offset: int | None) -> tuple[int | None, int | None, str]:
        if offset is None or offset < 0 or offset > len(self.text):
            return None, None, ""
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        rest = self.text[offset:].split("\n", 1)[0].strip()
        return line, column, rest[:40] + ("..." if len(rest) > 40 else "")

    def keyword_before(self, offset: int | None, pattern: str) -> int | None:
        """Where the keyword ``pattern`` (a regular expression) ends just before ``offset``
        starts (only blanks and an opening parenthesis between), else ``offset``."""
        if offset is None:
            return None
        found = re.search(rf"\b(?:{pattern})\s*\(?\s*$", self.text[:offset], re.IGNORECASE)
        return found.start() if found else offset


    def word(self, word: str) -> int | None:
        """Where ``word`` first appears as a word (to place a keyword sqlglot does not place)."""
        found = re.search(rf"(?<![\w`]){re.escape(word)}(?![\w`])", self.text, re.IGNORECASE)
        return found.start() if found else None

    def last(self, offset: int | None, pattern: str) -> int | None:
        """Where ``pattern`` last matches before ``offset`` (None: nowhere)."""
        if offset is None:
            return None
        matches = list(re.finditer(pattern, self.text[:offset], re.IGNORECASE))
        return matches[-1].start() if matches else None


def _problems(found: Sequence[_Found], locate: _Locator) -> list[TransformProblem]:
    unique = {(f.kind, f.construct, f.location): f for f in found}
    ordered = sorted(unique.values(), key=lambda f: (f.location is None, f.location or 0, f.construct))
    return [TransformProblem(f.kind, f.construct, *locate.where(f.location), f.problem, f.instead) for f in ordered]


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


def _arg(node: exp.Expression, key: str) -> object:
    """An argument of a node, under its name in this sqlglot or the next (``from``/``from_``)."""
    value = node.args.get(key)
    return value if value is not None else node.args.get(f"{key}_")


def _own_start(node: exp.Expression) -> int | None:
    start = node.meta.get("start") if node.meta else None
    return start if isinstance(start, int) else None


def _start(node: exp.Expression) -> int | None:
    """Where a node's text starts: its own position, else the first position inside it, else
    that of the nearest ancestor that has one."""
    inside = _inside(node)
    if inside is not None:
        return inside
    parent = node.parent
    while parent is not None:
        if (own := _own_start(parent)) is not None:
            return own
        parent = parent.parent
    return None


def _inside(node: exp.Expression) -> int | None:
    """The first position sqlglot kept in a node or inside it."""
    own = _own_start(node)
    if own is not None:
        return own
    return min((s for n in node.walk() if (s := _own_start(n)) is not None), default=None)


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


# --- the shape (SpecError) -------------------------------------------------------------------


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


def _at(locate: _Locator, offset: int | None) -> str:
    line, column, snippet = locate.where(offset)
    if line is None:
        return ""
    return f" at line {line}, column {column}" + (f" (`{snippet}`)" if snippet else "")


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
        if isinstance(node, exp.CTE) or (isinstance(node, exp.Subquery) and isinstance(node.parent, (exp.From, exp.Join))):
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


def _lambda_parameter(column: exp.Expression) -> exp.Lambda | None:
    """The lambda whose parameter ``column`` (a column or identifier in its body) names."""
    name = column.name.lower()
    node = column.parent
    while node is not None:
        if isinstance(node, exp.Lambda) and name in {str(p.name).lower() for p in node.expressions}:
            return node
        node = node.parent
    return None


# --- the rules -----------------------------------------------------------------------------------


def _strip(kinds: Kinds) -> Kinds:
    """The kinds inside containers: an array's elements, a map's keys and values."""
    inner = kinds - _CONTAINERS
    return inner or frozenset({_UNKNOWN})


def _inexact(kinds: Kinds) -> bool:
    return _FLOAT in kinds or _UNKNOWN in kinds


def _maybe_timestamp(kinds: Kinds) -> bool:
    return _LTZ in kinds or _UNKNOWN in kinds


def _named(kinds: Kinds) -> str:
    names = {_LTZ: "TIMESTAMP", _NTZ: "TIMESTAMP_NTZ", _FLOAT: "FLOAT/DOUBLE", _UNKNOWN: "a kind the guard "
             "cannot learn"}
    return ", ".join(names.get(k, k.upper()) for k in sorted(kinds))


class _Rules:
    """The rules over the (qualified) tree; ``typed``: whether the columns are resolved."""

    def __init__(self, locate: _Locator, source: _Source, scopes: list[Scope],
                 typed: bool) -> None:
        self.locate = locate
        self.text = locate.text
        self.typed = typed
        self.columns = source.kinds
        self.scope_of: dict[int, Scope] = {id(c): scope for scope in scopes for c in scope.columns}
        self.memo: dict[int, Kinds] = {}
        self.insides: dict[int, int | None] = {}
        self.found: list[_Found] = []

    def check(self, tree: exp.Expression) -> list[_Found]:
        for node in reversed(list(tree.walk(bfs=True))):  # each node after the nodes inside it
            starts = [s for c in node.iter_expressions() if (s := self.insides.get(id(c))) is not None]
            own = _own_start(node)
            self.insides[id(node)] = min([*starts, own] if own is not None else starts, default=None)
        for node in tree.walk():
            self._visit(node)
        return list(self.found)

    def inside(self, node: exp.Expression) -> int | None:
        """The first position sqlglot kept in a node or inside it."""
        return self.insides[id(node)] if id(node) in self.insides else _inside(node)

    def start(self, node: exp.Expression) -> int | None:
        """Where a node's text starts (else that of the nearest ancestor that has a position)."""
        inside = self.inside(node)
        if inside is not None:
            return inside
        return next((own for a in _ancestors(node) if (own := _own_start(a)) is not None), None)

    def _add(self, kind: str, construct: str, where: int | None, problem: str, instead: str) -> None:
        self.found.append(_Found(kind, construct, where, problem, instead))

    def _untrusted(self, construct: str, where: int | None, problem: str, instead: str) -> None:
        self._add("untrusted", construct, where, problem, instead)

    # --- kinds -----------------------------------------------------------------------------

    def kinds(self, node: exp.Expression | None) -> Kinds:
        """The kinds the value of ``node`` may have (over-approximated)."""
        if node is None:
            return frozenset({_NULL})
        if not self.typed:
            return frozenset({_UNKNOWN})
        key = id(node)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = frozenset({_UNKNOWN})  # a cycle is unknown
        result = self._kinds(node) or frozenset({_UNKNOWN})
        self.memo[key] = result
        return result

    def _kinds(self, node: exp.Expression) -> Kinds:
        if _implicit(node) or isinstance(node, (exp.Alias, exp.Paren, exp.IgnoreNulls, exp.RespectNulls,
                                                  exp.Filter)):
            return self.kinds(node.this)
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Identifier):  # a lambda's parameter, in its body
            lam = _lambda_parameter(node)
            return self._parameter(lam, node.name.lower()) if lam is not None else frozenset({_UNKNOWN})
        if isinstance(node, exp.Literal):
            return frozenset({_literal_kind(node)})
        if isinstance(node, exp.Boolean):
            return frozenset({_BOOLEAN})
        if isinstance(node, exp.Null):
            return frozenset({_NULL})
        if isinstance(node, exp.HexString):
            return frozenset({_BINARY})
        if isinstance(node, (exp.Cast, exp.TryCast)):
            return _type_kinds(node.to)
        if isinstance(node, exp.Interval):
            return frozenset({_INTERVAL})
        if isinstance(node, _PREDICATES):
            return frozenset({_BOOLEAN})
        if isinstance(node, exp.Div):
            both = self._union(node.this, node.expression)
            return both if _FLOAT in both or _DECIMAL in both else both | {_FLOAT}
        if isinstance(node, exp.IntDiv):
            return frozenset({_INTEGER})
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.Neg, exp.BitwiseAnd, exp.BitwiseOr,
                             exp.BitwiseXor, exp.BitwiseNot, exp.DPipe)):
            return self._union(*node.iter_expressions())
        if isinstance(node, exp.Case):
            branches = [i.args.get("true") for i in node.args.get("ifs") or []] + [node.args.get("default")]
            return self._union(*branches)
        if isinstance(node, exp.If):
            return self._union(node.args.get("true"), node.args.get("false"))
        if isinstance(node, exp.Subquery):
            return self._first_column(node.this)
        if isinstance(node, exp.Window):
            return self.kinds(node.this)
        if isinstance(node, exp.Bracket):
            return _strip(self.kinds(node.this)) | {_NULL}
        if isinstance(node, exp.Dot):
            return _strip(self.kinds(node.this))
        if _is_function(node):
            return self._result(node)
        return frozenset({_UNKNOWN})

    def _union(self, *nodes: exp.Expression | None) -> Kinds:
        out: set[str] = set()
        for node in nodes:
            if node is not None:
                out |= self.kinds(node)
        return frozenset(out - {_NULL} or {_NULL})

    def _result(self, node: exp.Expression) -> Kinds:
        spec = self._spec(node)
        if spec is None:
            return frozenset({_UNKNOWN})
        if spec.rule == "castfn":
            return frozenset(spec.result)
        values = _values(node)
        out: set[str] = set()
        for token in spec.result:
            if token == "same":
                out |= self._union(*values)
            elif token == "first":
                out |= self.kinds(values[0]) if values else {_UNKNOWN}
            elif token == "second":
                out |= self.kinds(values[1]) if len(values) > 1 else {_UNKNOWN}
            elif token == "elem":
                out |= _strip(self.kinds(values[0])) if values else {_UNKNOWN}
            elif token == "body":
                out |= self._union(*[lam.this for lam in node.find_all(exp.Lambda)])
            elif token == "rounded":
                first = self.kinds(values[0]) if values else frozenset({_UNKNOWN})
                out |= (first - {_FLOAT}) | {_INTEGER} if _FLOAT in first and len(values) == 1 else first
            elif token == "quotient":
                both = self._union(*values)
                out |= both if _FLOAT in both or _DECIMAL in both else both | {_FLOAT}
            else:
                out.add(token)
        return frozenset(out)

    def _column(self, column: exp.Column) -> Kinds:
        name = column.name.lower()
        if not column.table:
            lam = _lambda_parameter(column)
            return self._parameter(lam, name) if lam is not None else frozenset({_UNKNOWN})
        scope = self.scope_of.get(id(column))
        source = scope.sources.get(column.table) if scope is not None else None
        if isinstance(source, exp.Table):
            return self.columns.get(name, frozenset({_UNKNOWN}))
        if isinstance(source, Scope):
            return self._output(source.expression, name)
        return frozenset({_UNKNOWN})

    def _parameter(self, lam: exp.Lambda, name: str) -> Kinds:
        """A lambda parameter: the elements of the function's first argument (the accumulator
        of aggregate/reduce: its initial value; a second parameter may also be an index)."""
        function = lam.parent
        values = _values(function) if _is_function(function) else []
        position = [str(p.name).lower() for p in lam.expressions].index(name)
        elements = _strip(self.kinds(values[0])) if values else frozenset({_UNKNOWN})
        if isinstance(function, exp.Reduce):
            return self.kinds(values[1]) if position == 0 and len(values) > 1 else elements
        if position == 0:
            return elements
        others = [_strip(self.kinds(v)) for v in values[1:] if not isinstance(v, exp.Lambda)]
        return frozenset(elements.union(*others) | {_INTEGER})

    def _output(self, query: exp.Expression, name: str) -> Kinds:
        """The kinds of the column ``name`` of a CTE, subquery, VALUES or LATERAL VIEW."""
        if isinstance(query, exp.Subquery):
            return self._output(query.this, name)
        if isinstance(query, exp.Select):
            for projection in query.expressions:
                if isinstance(projection, exp.Aliases):
                    names = [str(a.name).lower() for a in projection.expressions]
                    if name in names:
                        return self._generated(projection.this, names.index(name))
                elif projection.alias_or_name.lower() == name:
                    return self.kinds(projection)
            return frozenset({_UNKNOWN})
        if isinstance(query, exp.SetOperation):
            left = _leftmost(query)
            names = [p.alias_or_name.lower() for p in left.expressions] if left is not None else []
            if name not in names:
                return frozenset({_UNKNOWN})
            return self._position(query, names.index(name))
        if isinstance(query, exp.Values):
            alias = query.args.get("alias")
            names = [str(c.name).lower() for c in alias.columns] if alias is not None else []
            if name not in names:
                return frozenset({_UNKNOWN})
            index = names.index(name)
            return self._union(*[row.expressions[index] if len(row.expressions) > index else None
                                 for row in query.expressions])
        if isinstance(query, exp.Lateral):
            alias = query.args.get("alias")
            names = [str(c.name).lower() for c in alias.columns] if alias is not None else []
            return self._generated(query.this, names.index(name)) if name in names else frozenset({_UNKNOWN})
        return frozenset({_UNKNOWN})

    def _generated(self, generator: exp.Expression, index: int) -> Kinds:
        """The kinds of the ``index``-th column a generator makes."""
        spec = self._spec(generator) if _is_function(generator) else None
        if spec is None or spec.rule != "generator":
            return frozenset({_UNKNOWN})
        values = _values(generator)
        elements = _strip(self.kinds(values[0])) if values else frozenset({_UNKNOWN})
        if spec.name.startswith("pos") and index == 0:
            return frozenset({_INTEGER})
        return elements

    def _position(self, query: exp.Expression, index: int) -> Kinds:
        return self._union(*self._branch_columns(query, index))

    def _branch_columns(self, query: exp.Expression, index: int) -> list[exp.Expression | None]:
        """The ``index``-th column of every SELECT a set operation combines."""
        if isinstance(query, exp.Subquery):
            return self._branch_columns(query.this, index)
        if isinstance(query, exp.SetOperation):
            return self._branch_columns(query.this, index) + self._branch_columns(query.expression, index)
        if isinstance(query, exp.Select):
            projections = query.expressions
            if any(isinstance(p, exp.Star) or (isinstance(p, exp.Column) and isinstance(p.this, exp.Star))
                   for p in projections) or index >= len(projections):
                return [_UNKNOWN_VALUE]
            return [projections[index]]
        return [_UNKNOWN_VALUE]

    def _first_column(self, query: exp.Expression) -> Kinds:
        return self._position(query, 0)

    # --- the visit -----------------------------------------------------------------------------

    def _spec(self, node: exp.Expression) -> _Spec | None:
        spec = _SPECS.get(_spark_name(node, self.text))
        return spec if spec is not None and type(node).__name__ in spec.classes else None

    def _visit(self, node: exp.Expression) -> None:
        kind = type(node).__name__
        where = self.start(node)
        if _implicit(node) or _in_unknown_clause(node):
            return  # a conversion sqlglot adds and does not print in Spark's; a clause refused already
        if isinstance(node, exp.Select):
            self._select(node, where)
        elif isinstance(node, exp.SetOperation):
            self._set_operation(node)
        elif isinstance(node, exp.Table):
            self._clauses(node, _TABLE_ARGS, "the table reference", where)
        elif isinstance(node, exp.Join):
            self._join(node, where)
        elif isinstance(node, exp.Lateral):
            self._lateral(node, where)
        elif isinstance(node, exp.Window):
            self._window(node, where)
        elif isinstance(node, exp.Group):
            self._group(node)
        elif isinstance(node, exp.Limit | exp.Offset):
            self._limit(node, where)
        elif isinstance(node, (exp.Cast, exp.TryCast)):
            self._cast(node, where)
        elif isinstance(node, (*_COMPARISONS, exp.Between)):
            self._coerce(f"{_operator(node)}", where, list(node.iter_expressions()))
        elif isinstance(node, exp.In):
            self._in(node, where)
        elif isinstance(node, _ARITHMETIC):
            self._arithmetic(node, where)
        elif isinstance(node, (exp.Like, exp.ILike, exp.DPipe, exp.BitwiseAnd, exp.BitwiseOr, exp.BitwiseXor,
                               exp.BitwiseNot)):
            self._pure(_operator(node), where, list(node.iter_expressions()))
        elif isinstance(node, (exp.Case, exp.If)):
            self._conditional(node, where)
        elif isinstance(node, exp.Values):
            self._values(node, where)
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            self._untrusted(f"{_spark_name(node.expression, self.text)}()", where,
                            "a function qualified by a schema or catalog is not a built-in the guard knows",
                            "use Spark's built-in functions, unqualified")
        elif isinstance(node, exp.Exists) and isinstance(node.this, (exp.Query, exp.Subquery)):
            return
        elif kind in _PLAIN_CLASSES:
            return
        elif _is_function(node):
            self._function(node, where)
        elif not any(not _known(a) for a in _ancestors(node)):  # inside an unknown construct: refused already
            self._untrusted(f"a {kind} construct", where,
                            f"the guard does not know the construct {kind} ({node.sql(dialect=_DIALECT)[:40]}), so "
                            "it cannot tell whether it gives the same rows on every run",
                            "write it with common SQL expressions")

    def _clauses(self, node: exp.Expression, known: frozenset[str], what: str, where: int | None) -> None:
        for key, value in node.args.items():
            if key not in known and value not in (None, False, [], ""):
                word = _CLAUSE_WORDS.get(key.rstrip("_"), key.rstrip("_").upper())
                first = value[0] if isinstance(value, list) and value else value
                inside = self.start(first) if isinstance(first, exp.Expression) else None
                place = self.locate.keyword_before(inside, word.replace(" ", r"\s+")) if inside is not None else where
                self._untrusted(word, place, f"the guard does not know the clause {word} of {what}",
                                "write the query with SELECT, FROM, JOIN, WHERE, GROUP BY, HAVING and ORDER BY; "
                                "the order of rows is not part of the result")

    def _select(self, node: exp.Select, where: int | None) -> None:
        self._clauses(node, _SELECT_ARGS, "a SELECT", where)
        distinct = node.args.get("distinct")
        if distinct is not None:
            first = self.inside(node.expressions[0]) if node.expressions else None
            place = self.locate.keyword_before(first, "DISTINCT") if first is not None else None
            if place is None and isinstance(from_ := _arg(node, "from"), exp.Expression):
                place = self.locate.last(self.inside(from_), r"\bDISTINCT\b")
            if distinct.args.get("on") is not None:
                self._untrusted("DISTINCT ON", place, "DISTINCT ON is not Spark SQL", "GROUP BY the key")
            else:
                self._collapsed("DISTINCT", [self.kinds(p) for p in node.expressions], place)

    def _set_operation(self, node: exp.SetOperation) -> None:
        word = {"Union": "UNION", "Intersect": "INTERSECT", "Except": "EXCEPT"}.get(type(node).__name__, "SET")
        word += "" if node.args.get("distinct") is not False else " ALL"
        self._clauses(node, _SET_ARGS, word, None)
        place = self.locate.last(self.start(node.expression), r"\b(?:UNION|INTERSECT|EXCEPT|MINUS)\b")
        left = _leftmost(node)
        width = len(left.expressions) if left is not None else 0
        for index in range(width):
            columns = self._branch_columns(node, index)
            self._coerce(word, place, columns)
            if word != "UNION ALL":
                self._collapsed(word, [self._union(*columns)], place)

    def _join(self, node: exp.Join, where: int | None) -> None:
        kind = str(node.args.get("kind") or "").upper()
        side = str(node.args.get("side") or "").upper()
        method = str(node.args.get("method") or "").upper()
        if kind not in _JOIN_KINDS or side not in ("", "LEFT", "RIGHT", "FULL") or method not in ("", "NATURAL"):
            words = " ".join(w for w in (method, side, kind) if w)
            self._untrusted(f"{words} JOIN", where, f"the guard does not know the join {words}",
                            "use INNER, LEFT, RIGHT, FULL, SEMI, ANTI or CROSS joins")
        self._clauses(node, _JOIN_ARGS, "a JOIN", where)

    def _lateral(self, node: exp.Lateral, where: int | None) -> None:
        spec = self._spec(node.this) if _is_function(node.this) else None
        if not node.args.get("view") or spec is None or spec.rule != "generator":
            self._untrusted("LATERAL", where, "the guard checks LATERAL VIEW with explode or posexplode only",
                            "use LATERAL VIEW explode(...) or a join")

    def _window(self, node: exp.Window, where: int | None) -> None:
        function = node.this
        while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls, exp.Filter)):
            function = function.this
        if not _is_function(function) or node.args.get("alias") is not None:
            self._untrusted("OVER", where, "a named window (OVER w) is not checked by the guard",
                            "write the window inline: OVER (PARTITION BY ... ORDER BY ...)")
            return
        spec = self._spec(function)
        name = _spark_name(function, self.text)
        if spec is None or spec.rule in ("rank", "order") or name in _WINDOW_ONLY:
            return  # judged as a function
        if spec.rule not in _AGGREGATE_RULES:
            self._untrusted(f"{name}()", where, f"{name}() is not a window function", "use an aggregate or rank()")
            return
        frame = node.args.get("spec")
        if isinstance(frame, exp.WindowSpec) and str(frame.args.get("kind") or "").upper() == "ROWS":
            whole = (str(frame.args.get("start")).upper() == "UNBOUNDED"
                     and str(frame.args.get("start_side")).upper() == "PRECEDING"
                     and str(frame.args.get("end")).upper() == "UNBOUNDED"
                     and str(frame.args.get("end_side")).upper() == "FOLLOWING")
            if not whole:
                self._add("order", f"{name}() OVER (ROWS ...)", where,
                          "a ROWS frame counts rows by position: rows that tie in the window's ORDER BY fall in or "
                          "out of the frame in the order they arrive in",
                          "use a RANGE frame (tied rows stay together), or the whole partition")

    def _group(self, node: exp.Group) -> None:
        select = node.parent
        projections = select.expressions if isinstance(select, exp.Select) else []
        keys: list[exp.Expression] = []
        for key in node.expressions:
            if isinstance(key, (exp.GroupingSets, exp.Rollup, exp.Cube)):
                for part in key.expressions:
                    keys += part.expressions if isinstance(part, exp.Tuple) else [part]
            else:
                keys.append(key)
        if node.args.get("all"):
            keys += [p for p in projections if not self._aggregates(p)]
        for key in keys:
            key = key.this if isinstance(key, exp.Paren) else key
            if isinstance(key, exp.Literal) and not key.is_string and key.name.isdigit():
                position = int(key.name)
                key = projections[position - 1] if 0 < position <= len(projections) else key
            kinds = self.kinds(key)
            if _inexact(kinds):
                label = key.alias_or_name if isinstance(key, (exp.Column, exp.Alias)) else "key"
                self._collapsed(f"GROUP BY {label}", [kinds], self.start(key))

    def _aggregates(self, projection: exp.Expression) -> bool:
        for node in projection.walk():
            if isinstance(node, exp.Subquery):
                continue
            if _is_function(node) and not node.find_ancestor(exp.Window, exp.Subquery):
                spec = self._spec(node)
                if isinstance(node, exp.AggFunc) or (spec is not None and spec.rule in _AGGREGATE_RULES):
                    return True
        return False

    def _limit(self, node: exp.Limit | exp.Offset, where: int | None) -> None:
        value = node.expression
        if isinstance(node, exp.Limit) and isinstance(value, exp.Var) and value.name.upper() == "ALL":
            return
        word = "LIMIT" if isinstance(node, exp.Limit) else "OFFSET"
        self._add("order", word, self.locate.keyword_before(self.start(value) if value else where, word),
                  f"which rows {word} keeps depends on the order rows arrive in (the guard does not prove an "
                  "ORDER BY total)", _ORDER_INSTEAD)

    def _collapsed(self, construct: str, kinds_list: list[Kinds], where: int | None) -> None:
        if not self.typed:
            return
        inexact = [k for k in kinds_list if _inexact(k)]
        if not inexact:
            return
        named = _named(frozenset().union(*inexact) & {_FLOAT, _UNKNOWN})
        self._add("equal-but-different", f"{construct} ({named})", where,
                  f"{construct} collapses rows whose values compare equal, but equal values of {named} can print "
                  "differently (-0.0 and 0.0, NaN): which one is kept depends on the order rows arrive in",
                  _EXACT_INSTEAD)

    # --- the time zone -----------------------------------------------------------------------------

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

    # --- functions -----------------------------------------------------------------------------

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
                self._untrusted(construct, where, f"{construct} takes a field and a value", f"{construct[:-1]}('year', d)")
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


def _known(node: exp.Expression) -> bool:
    return type(node).__name__ in _PLAIN_CLASSES or _is_function(node)


def _ancestors(node: exp.Expression) -> Iterator[exp.Expression]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def _in_unknown_clause(node: exp.Expression) -> bool:
    """Whether ``node`` is (in) a clause of a SELECT, set operation, table or join that the
    guard refuses as such (PIVOT, WINDOW, DISTRIBUTE BY ...)."""
    parent, key = node.parent, node.arg_key
    known = (_SELECT_ARGS if isinstance(parent, exp.Select) else _SET_ARGS if isinstance(parent, exp.SetOperation)
             else _TABLE_ARGS if isinstance(parent, exp.Table) else _JOIN_ARGS if isinstance(parent, exp.Join)
             else None)
    return known is not None and key not in known


def _is_function(node: exp.Expression) -> bool:
    return isinstance(node, exp.Func) or type(node).__name__ in _SPEC_CLASSES


def _implicit(node: exp.Expression) -> bool:
    """A node sqlglot's Spark parser adds around an argument (year(x) is Year(TsOrDsToDate(x)),
    date_format(x, f) is TimeToStr(TimeStrToTime(x), f)) and prints as the argument alone."""
    return (type(node).__name__ in ("TsOrDsToDate", "TimeStrToTime") and _own_start(node) is None
            and not node.args.get("safe") and not node.args.get("format"))


def _unwrapped(node: exp.Expression, outer: exp.Expression) -> exp.Expression:
    """The child of ``outer`` that holds ``node`` (through FILTER and parentheses)."""
    while node.parent is not outer and node.parent is not None:
        node = node.parent
    return node


def _leftmost(query: exp.Expression) -> exp.Select | None:
    while isinstance(query, (exp.SetOperation, exp.Subquery)):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _operator(node: exp.Expression) -> str:
    words = {"EQ": "=", "NEQ": "<>", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<=", "NullSafeEQ": "<=>",
             "NullSafeNEQ": "IS DISTINCT FROM", "Between": "BETWEEN", "Add": "+", "Sub": "-", "Mul": "*",
             "Div": "/", "IntDiv": "DIV", "Mod": "%", "Neg": "-", "Like": "LIKE", "ILike": "ILIKE", "DPipe": "||",
             "BitwiseAnd": "&", "BitwiseOr": "|", "BitwiseXor": "^", "BitwiseNot": "~"}
    return words.get(type(node).__name__, type(node).__name__)


def _values(node: exp.Expression) -> list[exp.Expression]:
    """The value arguments of a function: not its type, unit, ordering or lambda."""
    out: list[exp.Expression] = []
    for child in node.iter_expressions():
        if isinstance(child, exp.Distinct):
            out += child.expressions
        elif isinstance(child, exp.Order):
            if child.this is not None:
                out.append(child.this)
        elif not isinstance(child, (exp.DataType, exp.Var, exp.Identifier, exp.Lambda, exp.Ordered, exp.Star,
                                    exp.Where, exp.IntervalSpan, exp.JSONPath)):
            out.append(child)
    return out


def _literal_kind(node: exp.Literal) -> str:
    if node.is_string:
        return _STRING
    text = node.name
    if re.fullmatch(r"\d+", text):
        return _INTEGER
    return _FLOAT if "e" in text.lower() else _DECIMAL


def _type_kinds(data_type: exp.DataType | None) -> Kinds:
    """The kinds of a type and of every type inside it (array elements, map keys and values,
    struct fields)."""
    if data_type is None:
        return frozenset({_UNKNOWN})
    kinds = {_TYPE_KINDS.get(node.this.name, _UNKNOWN) for node in data_type.walk() if isinstance(node, exp.DataType)}
    return frozenset(kinds)


def _date_interval(interval: exp.Interval) -> bool:
    """Whether an interval literal has only whole days, weeks, months or years."""
    unit = interval.args.get("unit")
    units = [unit] if not isinstance(unit, exp.IntervalSpan) else [unit.this, unit.expression]
    return all(isinstance(u, exp.Var) and u.name.upper() in _DATE_UNITS for u in units)


# --- the re-printed statement ----------------------------------------------------------------


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
