"""The spec's other inputs (``inputs``): tables a transform reads beside the partitioned source,
each by a name that ``transform_sql`` reads as it reads ``source``. An input is read whole (a
dimension) or, with its own ``partition_key``, for the same partitions as the source (another
fact), widened by ``before`` and ``after`` where its rows can lie outside the partition's own
window. Every input is pinned with the source (docs/spec.md, "Several inputs").
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import pydantic

from backfill_assets.core.spec_formats import NamesTable, Strict
from backfill_assets.core.spec_settings import Duration
from backfill_assets.core.vocabulary import Identifier, TableName

# The name the transform reads the partitioned source by (core.pg.sqlbuild.SOURCE_CTE).
SOURCE_NAME = "source"


class InputSpec(NamesTable, Strict):
    """A PostgreSQL table in the spec's database, read in the source's snapshot."""

    format: Literal["postgres"] = "postgres"
    table: TableName
    # Read for the source's partitions through this column (a time window applies to it too);
    # without it the input is read whole.
    partition_key: Identifier | None = None
    # How long before a partition's start and after its end the input's rows can lie (time
    # windows only): clicks up to a day after their page view are `after: 1d`.
    before: Duration | None = None
    after: Duration | None = None

    @pydantic.model_validator(mode="after")
    def _offsets(self) -> InputSpec:
        if (self.before is not None or self.after is not None) and self.partition_key is None:
            raise ValueError("before and after widen the partitions an input is read for; they need the input's "
                             "partition_key (an input without one is read whole)")
        for name in ("before", "after"):
            value = getattr(self, name)
            if value is not None and not dt.timedelta(0) <= value <= dt.timedelta(days=366):
                raise ValueError(f"{name} must be between 0 and 366 days (for example 1d or 6h)")
        return self


def input_problems(inputs: dict[str, InputSpec], transform_sql: str | None, source_table: str | None) -> list[str]:
    """What the spec's inputs say wrongly of themselves and the rest of the spec."""
    problems = []
    if not inputs:
        return problems
    if SOURCE_NAME in inputs:
        problems.append(f"inputs: {SOURCE_NAME!r} is the partitioned source's name; give the input another")
    if transform_sql is None:
        problems.append(f"inputs {', '.join(sorted(inputs))} are read by transform_sql, by their names; write one "
                        "that joins them with 'source', or remove inputs")
    tables = [i.display_name for i in inputs.values()]
    twice = sorted({t for t in tables if tables.count(t) > 1 or t == source_table})
    if twice:
        problems.append(f"inputs read {', '.join(twice)} more than once (the source is 'source'); read each table "
                        "by one name")
    return problems
