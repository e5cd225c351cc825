"""The stage checks on their own: both stages of some partitions read as they are now,
building nothing, and compared with each other, with their latest builds and with the plans
(for re-running the stage checks alone, as the Dagster layer does)."""

from __future__ import annotations

from dataclasses import dataclass

from backfill_assets.core.build import open_build_engine
from backfill_assets.core.fingerprint.rows import Fingerprint
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.spec import Spec
from backfill_assets.core.store import control as store


@dataclass(frozen=True)
class StageState:
    """Both stages of one partition as they are now, compared with each other, with what their
    latest builds recorded, and with the plans (see :func:`read_stages`)."""

    partition: str
    a: Fingerprint
    b: Fingerprint
    plan_id: str | None  # the newest plan that recorded exactly these two stages
    problems: tuple[str, ...]

    @property
    def match(self) -> bool:
        return not self.problems


def read_stages(spec: Spec, labels: list[str], factory: ConnectionFactory) -> list[StageState]:
    """Read both stages' partitions ``labels`` as they are now, without building anything, and
    compare them: with each other, with their latest builds, and with the newest plan that
    recorded them (for re-running the stage checks alone).

    Two stages that agree are not enough: a refused plan deletes the partitions whose stages
    differ, which leaves both empty and equal. The builds' records tell that apart, and the
    plans say whether anyone planned these exact stages.

    Raises:
        StageError: the stages of this spec have never been built.
        SpecError: the spec no longer matches the catalog, or a label is malformed.
    """
    with factory() as conn, factory.control(conn) as control, \
            open_build_engine(conn, factory, spec, control) as engine:
        found = engine.stages_now(labels)
        # The plans are the control store's (read after the stages: a plan made meanwhile
        # names stages it recorded, which the comparison below then tells apart).
        plans = (store.plans_with(control, spec.control_schema, spec.name, found.ctx.labels)
                 if store.control_ready(control, spec.control_schema) else {})
    return [_state(label, found.now["a"][label], found.now["b"][label],
                   {v: found.built[v].get(label) for v in ("a", "b")}, plans.get(label, []))
            for label in found.ctx.labels]


def _state(label: str, a: Fingerprint, b: Fingerprint, records: dict[str, tuple | None],
           plans: list[tuple]) -> StageState:
    """One partition's :class:`StageState`: its stages against their builds, each other and
    the plans that recorded them."""
    problems = []
    for v, fp in (("a", a), ("b", b)):
        record = records[v]
        if record is None:
            problems.append(f"stage {v.upper()} has no recorded build of this partition")
        elif fp.as_dict() != record[0]:
            problems.append(
                f"stage {v.upper()} changed since its latest build ({record[0]['row_count']} rows, hash "
                f"{record[0]['content_hash'][:16]}; now {fp.row_count} rows, hash {fp.content_hash[:16]}); "
                "a refused plan removes the partitions whose stages differ"
            )
    diffs = a.differences(b)
    if diffs:
        problems.append(f"stages A and B differ on {', '.join(diffs)}")
    plan_id = next((pid for pid, pa, pb in plans if pa == a.as_dict() and pb == b.as_dict()), None)
    if plan_id is None and not problems:
        problems.append("no plan recorded these stages; plan again")
    return StageState(label, a, b, plan_id, tuple(problems))
