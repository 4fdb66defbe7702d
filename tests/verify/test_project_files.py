"""A project of several files, ported by name and verified (issue 35 item 3): each side's manifest lists the project
files it imported, with their sha256, and the pair names a side that ran an original module where its port is."""

from __future__ import annotations

import hashlib
import json
import os
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


@pytest.fixture
def trees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project whose script imports its package from the project's root (minGPT's projects/chargpt/chargpt.py and
    mingpt/), ported as one tree (`migrate proj` writes proj_npu/), run from the script's folder with PYTHONPATH
    naming the original's root, as its README says to run it."""
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "app").mkdir()
    (tmp_path / "proj" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "proj" / "pkg" / "model.py").write_text(MODEL)
    (tmp_path / "proj" / "app" / "main.py").write_text(MAIN.replace("from model import", "from pkg.model import"))
    monkeypatch.chdir(tmp_path)
    port("proj")
    monkeypatch.chdir(tmp_path / "proj" / "app")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "proj"),
                                                                    os.environ.get("PYTHONPATH", "")])))
    return tmp_path


def tree_pair(folder: Path, out: str = "out") -> tuple[dict, dict, dict]:
    argv = ["main.py", str(folder / "proj_npu" / "app" / "main.py"), "-q", "--calibration-runs", "0",
            "-o", str(folder / out)]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code in (0, 1), result.output
    read = lambda path: json.loads(path.read_text())  # noqa: E731
    return (read(folder / out / "summary.json"), read(folder / out / "ref" / "manifest.json"),
            read(folder / out / "actual" / "manifest.json"))


def test_a_port_in_a_tree_of_its_own_imports_its_own_trees_modules_on_the_originals_pythonpath(trees: Path):
    summary, ref, actual = tree_pair(trees)
    assert (ref["project_root"], actual["project_root"]) == (str(trees), str(trees))
    assert list(ref["project_files"]) == ["proj/pkg/__init__.py", "proj/pkg/model.py"]
    assert list(actual["project_files"]) == ["proj_npu/pkg/__init__.py", "proj_npu/pkg/model.py"]
    assert summary["verdict"] == "PASS" and not [f for f in summary["findings"] if f["code"] == "original_module"]
    assert any(note.startswith(f"the port ran with PYTHONPATH={trees / 'proj_npu'}") for note in summary["notes"])


def test_a_bug_in_the_ports_tree_is_named_at_its_file_and_a_module_of_the_originals_tree_is_named(trees: Path):
    for tree, factor in (("proj", "1.0"), ("proj_npu", "2.0")):  # the same op, another constant in the port's tree
        (trees / tree / "pkg" / "model.py").write_text(MODEL.replace("return self.layer(x)",
                                                                     f"return self.layer(x).mul({factor})"))
    summary, _, _ = tree_pair(trees)
    assert summary["verdict"] == "FAIL" and "aten.mul (Net forward, step 0, out0) at proj_npu/pkg/model.py:10 " \
        "(original proj/pkg/model.py:10)" in summary["reason"], summary["reason"]
    main = trees / "proj_npu" / "app" / "main.py"
    main.write_text(f"import sys\nsys.path.insert(0, {str(trees / 'proj')!r})\n" + main.read_text())
    summary, _, actual = tree_pair(trees, "reaching")
    assert list(actual["project_files"]) == ["proj/pkg/__init__.py", "proj/pkg/model.py"]
    found = [finding["message"] for finding in summary["findings"] if finding["code"] == "original_module"]
    assert ("the port ran proj/pkg/model.py, the original module, not its port proj_npu/pkg/model.py: it found it "
            "first on its search path (PYTHONPATH, an installed package)") in found
