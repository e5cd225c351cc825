"""The command line run in process, and spec files for it."""

from __future__ import annotations

from pathlib import Path

import yaml

from backfill_assets.cli.commands import main
from backfill_assets_tests.support.specs import DEMO_SPEC


def write_spec(tmp_path: Path, **changes: object) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**DEMO_SPEC, **changes}), encoding="utf-8")
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
