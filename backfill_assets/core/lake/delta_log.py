"""Our commit read back from a Delta table's log (core.lake.delta): an overwrite by our plan
that touched only the partitions, or the windows, it replaced.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from backfill_assets.core.errors import VerificationError
from backfill_assets.core.lake.parts import Part, Span, part_label
from backfill_assets.core.lake.tables import META_PREFIX, WrittenFile
from backfill_assets.core.vocabulary import PartitionValue, partition_label


def check_files_commit(path: str, name: str, version: int, column: str, values: Sequence[PartitionValue],
                   files: Sequence[WrittenFile], metadata: Mapping[str, str]) -> None:
    """Read OUR commit from the log: an overwrite carrying our plan that added exactly our
    files and removed files of our partitions only.

    Raises:
        VerificationError: naming what the commit did instead.
    """
    info, actions = commit_of(path, version)
    ours = {partition_label(v) for v in values}
    added = sorted(urllib.parse.unquote(a["add"]["path"]) for a in actions if "add" in a)
    touched = {(a.get("add") or a.get("remove") or {}).get("partitionValues", {}).get(column)
               for a in actions if "add" in a or "remove" in a}
    if (info.get("operation") != "WRITE" or info.get("operationParameters", {}).get("mode") != "Overwrite"
            or info.get(META_PREFIX + "plan_id") != metadata.get(META_PREFIX + "plan_id")
            or added != sorted(f.logged for f in files) or not touched <= ours):
        raise VerificationError(
            ", ".join(sorted(ours)), f"the log of {name} at version {version}",
            f"an overwrite of partition(s) {', '.join(sorted(ours))} by plan "
            f"{metadata.get(META_PREFIX + 'plan_id', '')[:16]} adding {len(files)} file(s) of ours",
            f"{info.get('operation')} {info.get('operationParameters', {}).get('mode')} adding {len(added)} "
            f"file(s), touching {', '.join(sorted(str(t) for t in touched))}",
        )

def commit_of(path: str, version: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A version's commit info and actions, from its file in the log."""
    log = Path(path) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {}), actions

def check_commit(path: str, name: str, version: int, column: str, values: Sequence[Part], predicate: str,
             metadata: Mapping[str, str], kept: dict[str, int] | None = None, written: int = 0) -> None:
    """Read OUR commit from the table's log: an overwrite with a predicate, carrying our
    plan, whose every added and removed file lies in our partitions. (delta-rs records
    the predicate as it parsed it, ``order_date = '2024-01-01'::date``, so its text is not
    compared; the files it touched say exactly what it did.)

    Windows have no partition values in the log: every file removed must be one that could
    hold their rows (``kept``: those files, with their rows outside the windows), and the
    files added must hold our ``written`` rows plus exactly the rows outside the windows
    that the removed files held (delta-rs rewrites a file that held both), so that no row
    of another window was dropped or added.

    Raises:
        VerificationError: naming what the commit did instead.
    """
    info, actions = commit_of(path, version)
    params = info.get("operationParameters", {})
    ours = {part_label(v) for v in values}
    if kept is None:
        touched = {(a.get("add") or a.get("remove") or {}).get("partitionValues", {}).get(column)
                   for a in actions if "add" in a or "remove" in a}
        within, did = touched <= ours, f"touching {', '.join(sorted(str(t) for t in touched))}"
    else:
        removed = [urllib.parse.unquote(a["remove"]["path"]) for a in actions if "remove" in a]
        added = sum(json.loads(a["add"].get("stats") or "{}").get("numRecords", -1) for a in actions if "add" in a)
        outside = sum(kept.get(path, 0) for path in removed)
        strays = [path for path in removed if path not in kept]
        within = not strays and added == written + outside
        did = (f"removing {len(strays)} file(s) that could not hold them" if strays else
               f"adding {added} row(s) for our {written} and the {outside} of other windows it rewrote")
    if (info.get("operation") != "WRITE" or params.get("mode") != "Overwrite" or not params.get("predicate")
            or info.get(META_PREFIX + "plan_id") != metadata.get(META_PREFIX + "plan_id")
            or not within):
        raise VerificationError(
            ", ".join(sorted(ours)), f"the log of {name} at version {version}",
            f"an overwrite where {predicate} by plan {metadata.get(META_PREFIX + 'plan_id', '')[:16]}, "
            f"touching partition(s) {', '.join(sorted(ours))} only",
            f"{info.get('operation')} {params.get('mode')} where {params.get('predicate')} {did}",
        )


def windowed(values: Sequence[Part]) -> bool:
    """Whether the partitions asked for are time windows (ranges of the column)."""
    return any(isinstance(v, Span) for v in values)
