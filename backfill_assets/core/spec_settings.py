"""The parts of a spec beside its source and target: the engine that reads the source and
runs the builds, the newest-wins ordering, the Dagster partitions and parallel runs, the
functions a transform may trust, and how long an approval lasts.

Which settings each engine takes is its own class, in its folder (core.supports names them).
"""

from __future__ import annotations

import datetime as dt
import functools
import operator
import re
from typing import Annotated, Literal

import pydantic
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec_formats import Strict
from backfill_assets.core.supports import DEFAULT_ENGINE, SUPPORTS, setting_problems
from backfill_assets.core.vocabulary import Identifier, check_identifier
from backfill_assets.core.windows import Grain, Offset, cron_schedule, zone


def _known_engine(value: str) -> str:
    if value not in SUPPORTS:
        names = [f"{e} (the default)" if e == DEFAULT_ENGINE else e for e in SUPPORTS]
        raise ValueError(f"must be {', '.join(names[:-1])} or {names[-1]}")
    return value


# The tag of an ``engine`` mapping whose type no engine declares.
_UNKNOWN = "?"


class _UnknownEngine(BaseModel):
    """An ``engine`` whose type no engine declares: refused, naming the engines."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Annotated[str, AfterValidator(_known_engine)]


def _engine_type(given: object) -> str | None:
    """The tag of an ``engine`` mapping: its ``type`` (the default engine's when left out);
    None for what is not a mapping."""
    if isinstance(given, dict):
        kind = given.get("type", DEFAULT_ENGINE)
    elif isinstance(given, BaseModel):
        kind = getattr(given, "type", None)
    else:
        return None
    return kind if isinstance(kind, str) and kind in SUPPORTS else _UNKNOWN


def _own_settings(given: object) -> object:
    """Refuse, naming each and the engine it belongs to, the settings of another engine; one
    of another engine's left at its default (None, no ``conf``) is as if left out."""
    kind = _engine_type(given)
    if kind in (None, _UNKNOWN) or not isinstance(given, dict):
        return given
    supports = SUPPORTS[kind]
    others = {name for e in SUPPORTS.values() for name in e.settings} - set(supports.settings)
    problems = setting_problems(supports, [k for k in given if k in others and given[k] not in (None, {})], SUPPORTS)
    if problems:
        raise ValueError("; ".join(problems))
    return {k: v for k, v in given.items() if k not in others}


# Where the source is read and both builds run, told apart by ``type``: each engine's settings
# are its own class, in its folder (``core/engines/<type>/settings.py``, named by its
# supports.toml), the default engine's (core.supports.DEFAULT_ENGINE) when ``engine`` is left
# out. Plans, approvals, the ledger and the locks stay in the control store whichever it is.
EngineSpec = Annotated[
    Annotated[
        functools.reduce(operator.or_, [Annotated[s.settings_spec, pydantic.Tag(e)] for e, s in SUPPORTS.items()]
                         + [Annotated[_UnknownEngine, pydantic.Tag(_UNKNOWN)]]),
        pydantic.Discriminator(_engine_type, custom_error_type="engine_type",
                               custom_error_message="Input should be a valid dictionary or instance of EngineSpec"),
    ],
    pydantic.BeforeValidator(_own_settings),
]
ENGINE_TAGS = (*SUPPORTS, _UNKNOWN)  # EngineSpec's tags
DEFAULT_ENGINE_SPEC = SUPPORTS[DEFAULT_ENGINE].settings_spec()


class OrderingColumn(Strict):
    """One newest-wins ordering column. ``nulls`` must be declared if the column has NULLs."""

    column: Identifier
    direction: Literal["asc", "desc"]
    nulls: Literal["first", "last"] | None = None


class PartitionsSpec(Strict):
    """How the Dagster code location partitions the assets of a spec.

    ``daily`` and ``monthly`` are time windows from ``start`` to ``end`` (exclusive, default
    open); their keys are ISO dates (a month is keyed by its first day), so the partition key
    column must be a date. ``static`` lists the partition values. ``window``: the spec's own
    ``partition_window`` windows, from the first one at or after the zone's midnight of
    ``start`` to ``end`` (exclusive, default open), keyed by their labels (core.windows).
    """

    type: Literal["daily", "monthly", "static", "window"]
    start: dt.date | None = None
    end: dt.date | None = None
    values: list[str] | None = None

    @pydantic.model_validator(mode="after")
    def _shape(self) -> PartitionsSpec:
        if self.type == "static":
            if not self.values or self.start or self.end:
                raise ValueError("static partitions take a non-empty `values` list and no start/end")
            if len(set(self.values)) != len(self.values):
                raise ValueError("static partition values must be distinct")
        else:
            if self.start is None or self.values is not None:
                raise ValueError(f"{self.type} partitions take a `start` date (and an optional `end`), not values")
            if self.end is not None and self.end <= self.start:
                raise ValueError("partitions.end must come after partitions.start")
            if self.type == "monthly" and (self.start.day != 1 or (self.end and self.end.day != 1)):
                raise ValueError("monthly partitions start and end on the first day of a month")
        return self


class PartitionWindowSpec(Strict):
    """Partitions that are time windows of ``partition_key`` (core.windows): every hour, day,
    week, month or year of the zone ``time_zone``, or the windows between the ticks of a cron
    schedule there (``cron``: hours from a minute, days from a time, weeks from a day and time,
    months from a day and time). A ``timestamp without time zone`` column says which zone its
    clock reads in (``column_time_zone``): nothing is guessed."""

    every: Grain | None = None
    time_zone: str
    column_time_zone: str | None = None
    cron: str | None = None

    @pydantic.model_validator(mode="before")
    @classmethod
    def _schedule(cls, data: object) -> object:
        """``every`` from the cron's schedule, which must be one this tool reads."""
        if not isinstance(data, dict):
            return data
        if data.get("cron") is None:
            if data.get("every") is None:
                raise ValueError("partition_window needs `every` (hour, day, week, month or year) or `cron` "
                                 "(a schedule such as `30 6 * * *`)")
            return data
        try:
            grain, _ = cron_schedule(str(data["cron"]))
        except SpecError as err:
            raise ValueError(str(err)) from None
        if data.get("every") not in (None, grain):
            raise ValueError(f"partition_window.cron {data['cron']!r} makes {grain} windows, not {data['every']}: "
                             "leave `every` out")
        return {**data, "every": grain}

    @property
    def offset(self) -> Offset | None:
        """Where each window starts within its unit (the cron's; None: the unit's start)."""
        return None if self.cron is None else cron_schedule(self.cron)[1]

    def declared(self) -> dict[str, str | None]:
        """What a plan records of it: without ``cron`` where none is given (a plan of ``every``
        keeps its id)."""
        return self.model_dump(exclude=set() if self.cron is not None else {"cron"})

    @pydantic.field_validator("time_zone", "column_time_zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                zone(value)
            except SpecError as err:
                raise ValueError(str(err)) from None
        return value


# A parallel build holds one advisory lock per partition it builds (PostgreSQL's shared lock
# table holds max_locks_per_transaction * max_connections, 6,400 by default): these bounds keep
# every build at once within 3,200.
MAX_PARTITIONS_PER_RUN = 200
MAX_CONCURRENT_BUILDS = 16


class ParallelSpec(Strict):
    """Multi-run backfills in the Dagster code location (see docs/dagster.md, "Running backfills in
    parallel"): a backfill becomes runs of at most ``max_partitions_per_run`` partitions, and at
    most ``max_concurrent_builds`` of the runs building the snapshot and stages go at once (the
    limit of the spec's build pool). The target's runs go one at a time."""

    max_partitions_per_run: Annotated[int, Field(strict=True, ge=1, le=MAX_PARTITIONS_PER_RUN)]
    max_concurrent_builds: Annotated[int, Field(strict=True, ge=1, le=MAX_CONCURRENT_BUILDS)]


def _check_function_name(value: str) -> str:
    parts = value.split(".")
    if len(parts) != 2:
        raise ValueError("a trusted function is written as schema.function (one dot), without arguments")
    for part in parts:
        check_identifier(part)
    if parts[0] == "pg_catalog":
        raise ValueError("functions in pg_catalog are judged by the guard itself; list only your own")
    return value


class TrustedFunction(Strict):
    """A function outside ``pg_catalog`` that ``transform_sql`` may call although the guard
    cannot see into it (see docs/reliability.md, "Functions the guard cannot see into"): ``name`` as ``schema.function``, and
    why its result depends on its arguments alone."""

    name: Annotated[str, AfterValidator(_check_function_name)]
    reason: Annotated[str, Field(min_length=1, max_length=500)]


_DURATION = re.compile(r"^\s*(\d+)\s*(d|day|days|h|hour|hours|m|min|minute|minutes)\s*$")
_DURATION_UNITS = {"d": "days", "h": "hours", "m": "minutes", "min": "minutes"}


def _parse_duration(value: object) -> object:
    """``7d``, ``36 hours``, ``90m`` as a timedelta (anything else is left to pydantic's
    own timedelta parsing: ISO 8601 such as ``P7D``, or seconds)."""
    if isinstance(value, str) and (m := _DURATION.match(value)):
        unit = m.group(2)
        unit = _DURATION_UNITS.get(unit, unit if unit.endswith("s") else unit + "s")
        return dt.timedelta(**{unit: int(m.group(1))})
    return value


Duration = Annotated[dt.timedelta, pydantic.BeforeValidator(_parse_duration)]
DEFAULT_APPROVAL_EXPIRY = dt.timedelta(days=7)
