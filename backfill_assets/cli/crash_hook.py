"""Test support only: the pause hook the crash tests use to kill ``apply`` at a chosen step.

``BACKFILL_ASSETS_TEST_PAUSE_AT=<step>:<partition>`` (steps: ``core.apply.STEPS``) makes
apply write its pid to the file named by ``BACKFILL_ASSETS_TEST_PAUSE_FILE`` when it reaches
that step in that partition, and wait there until it is killed. The command line imports this
module only when the first variable is set (see ``cli.cmd_apply``), so production runs never
reach it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

PAUSE_ENV = "BACKFILL_ASSETS_TEST_PAUSE_AT"
PAUSE_FILE_ENV = "BACKFILL_ASSETS_TEST_PAUSE_FILE"


def pause_checkpoint() -> Callable[[str, list[str]], None] | None:
    """The checkpoint for ``apply_plan`` that pauses where ``PAUSE_ENV`` says, or None when
    the variable is unset or empty."""
    where = os.environ.get(PAUSE_ENV)
    if not where:
        return None
    step, _, label = where.partition(":")
    marker = Path(os.environ[PAUSE_FILE_ENV])

    def pause(at: str, labels: list[str]) -> None:
        if at == step and label in labels:
            marker.write_text(str(os.getpid()))
            while True:
                signal.pause()

    return pause
