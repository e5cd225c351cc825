"""The approval gate's config as the approve link of a change preview fills it in."""

from __future__ import annotations

from typing import Any

PREVIEW_CHECK = "target_change_preview"


def previewed(result: Any) -> dict[str, str]:
    """The plan and review ids of the change preview a stages run (an ExecuteInProcessResult)
    showed: what its approve link carries."""
    shown = [e for e in result.get_asset_check_evaluations() if e.check_name == PREVIEW_CHECK and e.passed]
    assert shown, "the stages run made no change preview"
    ids = {(e.metadata["plan_id"].value, e.metadata["review_id"].value) for e in shown}
    assert len(ids) == 1, ids
    ((plan_id, review_id),) = ids
    return {"plan_id": plan_id, "review_id": review_id}


def approve_config(result: Any, approved_by: str = "alice", **extra: Any) -> dict[str, Any]:
    """The run config of approve_backfill approving the preview of ``result``."""
    config = {**previewed(result), "approved_by": approved_by}
    return {**extra, "ops": {"approve_plan_gate": {"config": config}}}
