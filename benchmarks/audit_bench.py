"""The audit of a backfilled target, timed: by its metadata signal, in full, and against one
fingerprint pass over the same partitions.

For ``benchmarks/bench.py`` (figure 15, after figure 9 on the 365-partition shape it just
backfilled): :func:`audit_figures` times ``core.audit.audit_spec`` over a spec's verified,
unchanged partitions by the signal (PostgreSQL's write counters: no row read), with
``full=True`` (every partition fingerprinted, compared and recorded), and one fingerprint pass
over the same partitions (``core.planning.target_readings``, the readings apply verifies with),
each the median of a few runs, each opening its connections as the command does.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from backfill_assets.core.audit import FINGERPRINT, audit_spec
from backfill_assets.core.build import open_build_engine
from backfill_assets.core.pg.db import ConnectionFactory
from backfill_assets.core.planning import target_readings
from backfill_assets.core.spec import Spec

SETTLE_S = 60.0


@dataclass(frozen=True)
class AuditFigures:
    partitions: int
    signal: str
    cheap: float  # seconds of an audit that held every partition by its signal
    full: float  # seconds of an audit with full=True
    one_pass: float  # seconds of one fingerprint pass over the same partitions


def _timed_audit(factory: ConnectionFactory, spec: Spec, full: bool = False) -> tuple[float, object]:
    start = time.perf_counter()
    result = audit_spec(spec, factory, full=full)
    return time.perf_counter() - start, result


def settle(factory: ConnectionFactory, spec: Spec, deadline_s: float = SETTLE_S) -> None:
    """Audit until one holds every partition by its signal: the first reads every partition
    (no baseline yet), and PostgreSQL publishes the counters of apply's writes within seconds.

    Raises:
        RuntimeError: a partition drifted, or the target kept moving for ``deadline_s``.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        _, result = _timed_audit(factory, spec)
        if result.drifted:
            raise RuntimeError(f"{len(result.drifted)} partition(s) of {spec.target_name} drifted")
        if all(p.signal != FINGERPRINT for p in result.partitions):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the target of {spec.name} did not stop moving")
        time.sleep(0.5)


def one_pass_seconds(factory: ConnectionFactory, spec: Spec, labels: list[str]) -> float:
    """One fingerprint pass over ``labels`` of the target, as apply reads it back."""
    start = time.perf_counter()
    with factory() as conn, open_build_engine(conn, factory, spec) as engine:
        target_readings(conn, engine.resolve(labels), labels)
    return time.perf_counter() - start


def audit_figures(factory: ConnectionFactory, spec: Spec, *, repeat: int = 3) -> AuditFigures:
    """Figure 15 on a spec whose target apply verified and nobody changed since."""
    settle(factory, spec)
    cheap, signal, labels = [], "", []
    for _ in range(repeat):
        seconds, result = _timed_audit(factory, spec)
        if any(p.signal == FINGERPRINT or p.result != "holds" for p in result.partitions):
            raise RuntimeError(f"the target of {spec.name} moved during the measurement")
        cheap.append(seconds)
        signal, labels = result.partitions[0].signal, [p.partition for p in result.partitions]
    full, passes = [], []
    for _ in range(repeat):  # alternated, so that both see the same cache
        seconds, result = _timed_audit(factory, spec, full=True)
        if result.drifted:
            raise RuntimeError(f"{len(result.drifted)} partition(s) of {spec.target_name} drifted")
        full.append(seconds)
        passes.append(one_pass_seconds(factory, spec, labels))
    return AuditFigures(len(labels), signal, statistics.median(cheap), statistics.median(full),
                        statistics.median(passes))
