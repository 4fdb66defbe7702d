"""`verify report` re-judges every pair folder recorded with a real H200 (fixtures/gpu-runs-h200, its README: the
reference and its calibration on the GPU, the port on the emulated NPU) to its right verdict, on the CPU. The folders
are the only evidence of how the comparison judges another device's kernels (TF32, cuDNN attention, its own sums):
a change that flips one is a regression no CPU pair shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fixture_pairs import copied
from verify.cli import app

GPU_RUNS = Path(__file__).resolve().parent / "fixtures" / "gpu-runs-h200"

# A row of the README's table: | `folder` | scripts | **VERDICT** | `how the reason begins` |
_ROW = re.compile(r"^\| `(?P<folder>[^`]+)` \|.*\| \*\*(?P<verdict>PASS|FAIL)\*\* \| `(?P<reason>[^`]+)` \|$")


def right_verdicts() -> list[tuple[str, str, str]]:
    """(folder, verdict, how its reason begins) for each folder, as the README gives them."""
    rows = [match.groups() for line in (GPU_RUNS / "README.md").read_text().splitlines() if (match := _ROW.match(line))]
    assert sorted(folder for folder, _, _ in rows) == sorted(path.name for path in GPU_RUNS.iterdir() if path.is_dir())
    return rows


@pytest.mark.parametrize(("folder", "verdict", "reason"), right_verdicts())
def test_report_judges_each_h200_pair_again_to_its_right_verdict(tmp_path, folder, verdict, reason):
    pair = copied(GPU_RUNS, folder, tmp_path)
    result = CliRunner().invoke(app, ["report", str(pair)])
    assert result.exit_code == {"PASS": 0, "FAIL": 1}[verdict], result.output
    verdict_line = next(line for line in result.stdout.splitlines() if line.startswith(("PASS: ", "FAIL: ")))
    assert verdict_line.startswith(reason), verdict_line
    assert "judged from runs read in" not in result.stdout  # its own runs, beside its summary
