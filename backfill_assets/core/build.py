"""The build engine: where a spec's source is read and its two builds run, chosen once by
``engine.type``.

Every step is written once (core.plan, core.stages, core.approve, core.apply, the sensors);
where it needs the source, the snapshot or the stages, it asks the :class:`BuildEngine` that
:func:`open_build_engine` opens for it. The target is the other half of a spec's engine, the
:class:`~backfill_assets.core.context.TargetEngine` a resolved context holds.

An engine is a class its allow-list names by import path (``Supports.builds``, read by
core.supports), imported only when a spec names the engine: a PostgreSQL spec never
loads DuckDB or pyspark. A new build engine is one folder under core/engines/ and one line in
core.supports.ENGINE_TYPES (docs/engines.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from backfill_assets.core.catalog import Inspection
from backfill_assets.core.context import Checkpoint, Clock, Context, Target, no_checkpoint
from backfill_assets.core.differences import Against, Change, PartitionDiff
from backfill_assets.core.errors import SpecError, VerificationError
from backfill_assets.core.fingerprint.rows import Fingerprint, Reading
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.profiling import SourceProfiler
from backfill_assets.core.progress import Progress
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store
from backfill_assets.core.store.plan_document import Plan
from backfill_assets.core.supports import SUPPORTS, imported
from backfill_assets.core.vocabulary import PartitionRequest


@dataclass(frozen=True)
class StagesNow:
    """Both stages of some partitions as they are now, and what their latest builds recorded
    (label -> (readings, ...) per variant ``a`` and ``b``): what core.stages.read_stages compares."""

    ctx: Context
    now: dict[str, dict[str, Fingerprint]]
    built: dict[str, dict[str, tuple]]


def unwritten_b(conn: psycopg.Connection, spec: Spec, rows_now: dict[str, int]) -> dict[str, Reading]:
    """Of stage B's partitions ``rows_now`` (label -> the rows the stage holds now), those
    hashed as they were built and not written (they equalled stage A) that the stage still
    holds no row of: label -> the readings their build recorded, which is what they are."""
    unkept = store.unkept_builds(conn, spec.control_schema, spec.name, "b", list(rows_now))
    return {label: readings for label, readings in unkept.items() if rows_now[label] == 0}


def stage_b_as_built(conn: psycopg.Connection, spec: Spec, now_b: dict[str, Fingerprint]) -> None:
    """Stage B's partitions as they are now (``now_b``, changed in place), an unwritten one
    (:func:`unwritten_b`) as its build recorded it."""
    for label, readings in unwritten_b(conn, spec, {label: fp.row_count for label, fp in now_b.items()}).items():
        now_b[label] = Fingerprint(**readings)


@dataclass(frozen=True)
class SourceMoves:
    """One sensor tick's answer for one spec: the snapshotted partitions whose source moved on
    (label -> the source's digest now, which names the change), the state to keep for the next
    tick (None: the engine keeps none), a line for the log and any warnings."""

    changed: dict[str, str]
    state: Any = None
    summary: str = ""
    notes: list[str] = field(default_factory=list)


class BuildEngine(Protocol):
    """What a step may ask of a spec's build engine, opened for that step on the data's
    connection and the control store's (see :func:`open_build_engine`)."""

    spec: Spec
    # What this engine cannot do, by command ("diff", "profile"): the reason, for the refusal.
    REFUSES: dict[str, str]

    @staticmethod
    def snapshot_with_builds(spec: Spec) -> bool:
        """Whether the spec's snapshot lives only as long as the step that takes it (a
        PostgreSQL snapshot exported by the plan's transaction), so that an orchestrator must
        build the stages in that same step (core.plan.plan_step)."""
        ...

    @staticmethod
    def reads_without_postgres(spec: Spec) -> bool:
        """Whether ``inspect`` and ``profile`` read the spec's source and target without a
        PostgreSQL connection (:func:`open_reading_engine` then opens none)."""
        ...

    # -- the plan side ----------------------------------------------------------------------
    def inspect(self) -> Inspection:
        """Source and target, read-only, with every problem found (core.resolve.inspect)."""
        ...

    def resolve(self, request: PartitionRequest | list[str]) -> Context:
        """Inspect read-only and validate everything about the spec before any write."""
        ...

    def take_snapshot(self, ctx: Context, clock: Clock, progress: Progress) -> tuple[Any, Context]:
        """Fix the source of the context's partitions, check its data and record the snapshot;
        returns it and the context, widened by the partitions moved records add."""
        ...

    def load_snapshot(self, snapshot_id: str) -> tuple[Any, Context]:
        """A recorded snapshot, still readable exactly, and the context it was taken in."""
        ...

    def build_both(self, ctx: Context, snapshot: Any, clock: Clock,
                   progress: Progress) -> tuple[Any, dict[str, Fingerprint], dict[str, Fingerprint]]:
        """Build stages A and B from the snapshot, fingerprint and record both. Returns the
        snapshot (one that the builds' own reading identifies, as PostgreSQL's exported
        snapshot, comes back identified) and the readings of A and B."""
        ...

    def finish_plan(self, ctx: Context, snapshot: Any, a: dict[str, Fingerprint], b: dict[str, Fingerprint],
                    clock: Clock, progress: Progress) -> Plan:
        """Compare the builds and store the plan; a refused plan's differing stage partitions
        are removed so that nothing can apply them."""
        ...

    def stages_now(self, labels: list[str]) -> StagesNow:
        """Both stages' partitions as they are now, building nothing (StageError: never built)."""
        ...

    def source_moves(self, state: Any, budget_s: float | None) -> SourceMoves:
        """The source sensor's question: which snapshotted partitions moved on since
        (``state``: what the previous tick kept, None at first)."""
        ...

    def profiler(self) -> SourceProfiler:
        """The spec's source as ``profile`` reads it (core.profiling), read-only; an
        engine that cannot says so in ``REFUSES``."""
        ...

    def diff(self, ctx: Context, stored: Plan, labels: list[str], against: Against, limit: int) -> list[PartitionDiff]:
        """Stage A's partitions ``labels`` of a plan against the target or stage B, key by key
        (core.diff); an engine that cannot says so in ``REFUSES``."""
        ...

    # -- approval and apply ---------------------------------------------------------------
    def unchanged_spec(self, stored: Plan) -> Context:
        """The context resolved now, refusing a refused plan or one whose spec-derived fields
        changed (ApprovalError)."""
        ...

    def unchanged_data(self, ctx: Context, stored: Plan, partitions: list[str] | None = None) -> dict[str, Reading]:
        """Refuse a plan whose snapshot or stage A changed; return the target's readings of
        ``partitions`` (default: the plan's), read with those checks."""
        ...

    def changes(self, ctx: Context, stored: Plan, first: int = 0) -> dict[str, Change]:
        """Per partition, the keys replacing the target adds, removes, changes and keeps; with
        ``first``, also (``"first"``) up to that many differing keys, each with its kind and
        the columns that differ (no values)."""
        ...

    def recheck_stage(self, ctx: Context, stored: Plan, labels: list[str]) -> None:
        """Under apply's write, before the replace: stage A (and a pinned source) still carry
        what was approved (VerificationError)."""
        ...

    def open_target(self, conn: psycopg.Connection, control: psycopg.Connection, factory: ConnectionFactory | None,
                    ctx: Context, checkpoint: Checkpoint = no_checkpoint) -> Target:
        """The target apply writes through, with stage A's rows as the approved ones."""
        ...

    def explain(self, ctx: Context, err: VerificationError, version: str | None) -> VerificationError:
        """The failure, naming the first keys where the committed partition differs."""
        ...


def build_engine_class(spec: Spec) -> Any:
    """The class of the spec's build engine (imported now: only the named engine is loaded)."""
    return imported(SUPPORTS[spec.engine.type].builds)


def snapshot_with_builds(spec: Spec) -> bool:
    """Whether the spec's snapshot and builds must run in one step (BuildEngine.snapshot_with_builds)."""
    return bool(build_engine_class(spec).snapshot_with_builds(spec))


def refuse_unless_supported(spec: Spec, command: str) -> None:
    """Refuse a command the spec's build engine cannot run (SpecError naming why)."""
    reason = build_engine_class(spec).REFUSES.get(command)
    if reason is not None:
        raise SpecError(reason)


@contextlib.contextmanager
def open_build_engine(conn: psycopg.Connection, factory: ConnectionFactory, spec: Spec,
                      control: psycopg.Connection | None = None) -> Iterator[BuildEngine]:
    """The spec's build engine, open for the block (``conn``: the spec's database; ``control``:
    the caller's connection to the control store). What the engine needs beyond ``conn`` (the
    control store's connection when the caller has none, a DuckDB file, a Spark session) is
    opened when first asked for and closed with the block, so a step that never needs it never
    opens it."""
    with contextlib.ExitStack() as stack:
        lazy = stack.enter_context(contextlib.ExitStack())  # closed after the engine
        given = control

        def control_store() -> psycopg.Connection:
            nonlocal given
            if given is None:
                given = lazy.enter_context(factory.control(conn))
            return given

        yield stack.enter_context(build_engine_class(spec).opened(conn, control_store, factory, spec))


@contextlib.contextmanager
def open_reading_engine(factory: ConnectionFactory, spec: Spec, *, control_is_data: bool = False) -> Iterator[BuildEngine]:
    """The spec's build engine, open for a read-only look at its source and target (``inspect``,
    ``profile``). On an engine that reads them without PostgreSQL (``reads_without_postgres``)
    no connection is opened and no variable read: the engine is handed none for the data nor
    the control store (the lake readers take None where a catalog in the database is not
    named). Otherwise a connection to the spec's database, which is the control store's too
    with ``control_is_data``."""
    engine_class = build_engine_class(spec)
    if engine_class.reads_without_postgres(spec):
        with engine_class.opened(None, lambda: None, factory, spec) as engine:
            yield engine
        return
    with factory() as conn, open_build_engine(conn, factory, spec, control=conn if control_is_data else None) as engine:
        yield engine
