"""Pair folders recorded on other machines (tests/verify/fixtures, shared/fixtures), judged again on a copy: the
fixtures stay as they were recorded (shared/'s are read-only), and `verify compare -o` writes its reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from verify.cli import app


def copied(fixtures: Path, pair: str, tmp_path: Path) -> Path:
    """A writable copy of the pair folder `fixtures/pair`, in tmp_path."""
    folder = Path(shutil.copytree(fixtures / pair, tmp_path / pair))
    for path in (folder, *folder.rglob("*")):
        path.chmod(path.stat().st_mode | 0o200)
    return folder


def compared(fixtures: Path, pair: str, tmp_path: Path) -> tuple[int, dict]:
    """`verify compare` of a copy's ref/ and actual/ into tmp_path/out: its exit code (a verdict) and summary.json."""
    folder = copied(fixtures, pair, tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["compare", str(folder / "ref"), str(folder / "actual"), "-o", str(out)])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads((out / "summary.json").read_text())
