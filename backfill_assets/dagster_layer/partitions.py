"""The one partitions definition a spec's snapshot, stages and target share."""

from __future__ import annotations

import dagster as dg

from backfill_assets.core.errors import SpecError
from backfill_assets.core.spec import Spec


def partitions_def(spec: Spec) -> dg.PartitionsDefinition:
    """Daily or monthly time windows (keys are ISO dates), or a static list, from the spec.

    Raises:
        SpecError: the spec has no ``partitions`` section, or declares time windows (not yet
            served here).
    """
    if spec.partition_window is not None:
        raise SpecError(
            f"spec {spec.name} declares partition_window: time windows are planned and applied through the "
            "command line, not yet in the Dagster code location; keep the spec out of its folder for now"
        )
    p = spec.partitions
    if p is None:
        raise SpecError(
            f"spec {spec.name} has no `partitions` section; the Dagster code location needs one, "
            "for example `partitions: {type: daily, start: 2024-01-01}`"
        )
    if p.type == "static":
        return dg.StaticPartitionsDefinition(list(p.values or []))
    assert p.start is not None
    end = p.end.isoformat() if p.end else None
    if p.type == "daily":
        return dg.DailyPartitionsDefinition(start_date=p.start.isoformat(), end_date=end)
    return dg.MonthlyPartitionsDefinition(start_date=p.start.isoformat(), end_date=end)


def contiguous_segments(parts: dg.PartitionsDefinition, labels: list[str]) -> list[list[str]]:
    """Split partition keys into runs of neighbours in the definition's order.

    Raises:
        SpecError: a key is not a partition of the definition.
    """
    keys = parts.get_partition_keys()
    index = {k: i for i, k in enumerate(keys)}
    unknown = [label for label in labels if label not in index]
    if unknown:
        raise SpecError(
            f"partition(s) {', '.join(unknown)} are outside the Dagster partitions of this spec; "
            "widen its `partitions` section"
        )
    segments: list[list[str]] = []
    for label in sorted(set(labels), key=index.__getitem__):
        if segments and index[label] == index[segments[-1][-1]] + 1:
            segments[-1].append(label)
        else:
            segments.append([label])
    return segments


def run_segments(spec: Spec, segments: list[list[str]]) -> list[list[str]]:
    """The runs a sensor requests for contiguous ``segments``: one per segment, or with the
    spec's ``parallel``, runs of at most ``max_partitions_per_run`` partitions, as a multi-run
    backfill splits them."""
    if spec.parallel is None:
        return segments
    most = spec.parallel.max_partitions_per_run
    return [segment[i:i + most] for segment in segments for i in range(0, len(segment), most)]
