"""The functions of DuckDB the guard judges by name: those that read the clock or the session,
and the aggregates and window functions by what they do with the order rows arrive in."""

from __future__ import annotations

import re

_CLOCK_FUNCTIONS = frozenset({
    "now", "today", "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "get_current_time", "get_current_timestamp", "current_localtime", "current_localtimestamp",
    "transaction_timestamp", "statement_timestamp", "clock_timestamp",
})

_SESSION_FUNCTIONS = {
    "current_setting": "a setting of the session", "getvariable": "a variable of the session",
    "getenv": "the environment of the process", "current_user": "the user", "session_user": "the user",
    "user": "the user", "current_role": "the role", "current_schema": "the search path",
    "current_schemas": "the search path", "in_search_path": "the search path",
    "current_database": "the database attached", "current_catalog": "the database attached",
    "current_query": "the text of the running query", "current_query_id": "the running query",
    "current_connection_id": "the connection", "current_transaction_id": "the transaction",
    "txid_current": "the transaction", "version": "the DuckDB version", "platform": "the platform",
    "user_agent": "the client", "get_block_size": "the database file", "database_size": "the database file",
    "which_secret": "the secrets of the session", "stats": "the optimizer's statistics",
    "pg_postmaster_start_time": "the time the database started", "pg_conf_load_time": "the configuration",
    "pg_has_role": "the role", "pg_my_temp_schema": "the catalog", "pg_is_other_temp_schema": "the catalog",
    "obj_description": "the catalog", "col_description": "the catalog", "shobj_description": "the catalog",
    "pg_get_viewdef": "the catalog", "pg_get_constraintdef": "the catalog", "pg_get_expr": "the catalog",
    "inet_client_addr": "the client's address", "inet_client_port": "the client's port",
    "inet_server_addr": "the server's address", "inet_server_port": "the server's port",
}
_SESSION_PATTERN = re.compile(r"(duckdb_|pragma_).*|has_.*_privilege|pg_.*_is_visible")

# Keywords DuckDB binds as functions when no column of that name is in scope.
_VALUE_FUNCTIONS = frozenset({
    "current_date", "current_time", "current_timestamp", "localtime", "localtimestamp",
    "current_user", "current_role", "session_user", "user", "current_schema", "current_catalog",
})

# Functions the parser produces that DuckDB's catalog does not list as scalar or aggregate.
_NOT_IN_CATALOG = frozenset({"unnest"})

_PICK_AGGREGATES = frozenset({
    "first", "last", "any_value", "arbitrary", "arg_min", "arg_max", "argmin", "argmax", "arg_min_null",
    "arg_max_null", "arg_min_nulls_last", "arg_max_nulls_last", "min_by", "max_by", "mode",
})
_SKETCH_AGGREGATES = frozenset({"approx_quantile", "reservoir_quantile", "approx_top_k", "lttb"})
_UNORDERED_COLLECTORS = frozenset({
    "json_group_array", "json_group_object", "json_group_structure", "variant_group_array", "variant_group_object",
})
_LIST_AGGREGATES = frozenset({"list", "array_agg", "string_agg", "group_concat", "listagg"})
_SUM_AGGREGATES = frozenset({
    "sum", "sum_no_overflow", "avg", "mean", "favg", "fsum", "sumkahan", "kahan_sum", "product",
    "weighted_avg", "wavg",
})
_REGRESSIONS = frozenset({
    "regr_avgx", "regr_avgy", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy", "regr_syy",
})
_STATISTIC_AGGREGATES = frozenset({
    "stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "sem", "corr", "covar_pop",
    "covar_samp", "kurtosis", "kurtosis_pop", "skewness", *_REGRESSIONS,
})
_FLOAT_ONLY_AGGREGATES = frozenset({"entropy", "geomean", "geometric_mean"})
_VALUE_AGGREGATES = frozenset({
    "min", "max", "histogram", "histogram_exact", "median", "quantile", "quantile_cont", "quantile_disc", "mad",
})
_SAFE_AGGREGATES = frozenset({
    "count", "count_star", "count_if", "countif", "bool_and", "bool_or", "bit_and", "bit_or", "bit_xor",
    "bitstring_agg", "approx_count_distinct", "regr_count",
})
_TWO_VALUE_AGGREGATES = frozenset({"corr", "covar_pop", "covar_samp", "weighted_avg", "wavg", *_REGRESSIONS})
# Macros of DuckDB's catalog that aggregate.
_AGGREGATE_MACROS = frozenset({"weighted_avg", "wavg", "geomean", "geometric_mean", *_UNORDERED_COLLECTORS})
_TYPED = _SUM_AGGREGATES | _STATISTIC_AGGREGATES | _VALUE_AGGREGATES | _LIST_AGGREGATES

_ORDER_WINDOWS = frozenset({"row_number", "first_value", "last_value", "nth_value", "lag", "lead", "ntile", "fill"})
_RANK_WINDOWS = frozenset({"rank", "dense_rank", "rank_dense", "percent_rank", "cume_dist"})


def _session_use(name: str) -> str | None:
    """What a function of the session reads (None: it is not one)."""
    if name in _SESSION_FUNCTIONS:
        return _SESSION_FUNCTIONS[name]
    return "the catalog or the session" if _SESSION_PATTERN.fullmatch(name) else None
