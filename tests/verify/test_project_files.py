"""A project of several files, ported by name and verified (issue 35 item 3): each side's manifest lists the project
files it imported, with their sha256, and the pair names a side that ran an original module where its port is."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from migrate.cli import app as migrate_app
from verify.cli import app
from verify.cli.pair import route

pytestmark = pytest.mark.slow

MAIN = """import torch
import torch.nn.functional as F
from model import Net

torch.manual_seed(0)
model = Net().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(3):
    x, y = torch.randn(8, 4).cuda(), torch.randn(8, 2).cuda()
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
"""
MODEL = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.layer(x)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "main.py").write_text(MAIN)
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def port(*args: str) -> None:
    result = CliRunner().invoke(migrate_app, ["-q", "--amp", "off", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output


def pair(folder: Path) -> tuple[dict, dict, dict]:
    """`verify main.py main_npu.py`: its summary and each side's manifest."""
    argv = ["main.py", "main_npu.py", "-q", "--calibration-runs", "0", "-o", str(folder / "out")]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code in (0, 1), result.output
    out = folder / "out"
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    return read(out / "summary.json"), read(out / "ref" / "manifest.json"), read(out / "actual" / "manifest.json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_port_runs_the_ported_modules_and_each_side_lists_them(project: Path):
    port("--mode", "explicit", "main.py", "model.py")
    summary, ref, actual = pair(project)
    assert ref["project_files"] == {"model.py": sha256(project / "model.py")}
    assert actual["project_files"] == {"model_npu.py": sha256(project / "model_npu.py")}
    assert "original_module" not in [finding["code"] for finding in summary["findings"]]


def test_a_port_that_runs_an_original_module_is_named(project: Path):
    port("main.py")  # alone: main_npu.py imports model.py ...
    port("model.py")  # ... though model_npu.py is beside it
    summary, _, actual = pair(project)
    assert list(actual["project_files"]) == ["model.py"]
    found = [finding for finding in summary["findings"] if finding["code"] == "original_module"]
    assert [finding["message"] for finding in found] == [
        "the port ran model.py, the original module, not its port model_npu.py: its imports name the original"]
