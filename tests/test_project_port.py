"""Files of one project named together are ported as one project (issue 35): the ports import each other's ports,
a file left out is named, and the checklist reads what the entry points run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app

MAIN = """import torch
import model as m
import trainer
from data import loader


def main():
    trainer.train(m.Net(), loader())


if __name__ == "__main__":
    main()
"""
MODEL = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2).cuda()

    def forward(self, x):
        return self.layer(x)
"""
TRAINER = """import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
"""
DATA = """import torch


def loader():
    return [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(3)]
"""
# Named in the call, imported by no entry point: what it holds is never run.
UNUSED = """import torch


def evaluate(model, x):
    with torch.autocast("cuda"):
        return model(x.cuda())
"""
PACKAGE = {
    "run.py": "import torch\nfrom pkg.model import Net\nimport pkg.layers\n\nif __name__ == '__main__':\n"
              "    net = pkg.layers.Block(Net())\n",
    "pkg/__init__.py": "",
    "pkg/model.py": "import torch\nfrom .layers import Block\nfrom . import utils\n\n"
                    "class Net(torch.nn.Module):\n    pass\n",
    "pkg/layers.py": "import torch\n\nclass Block(torch.nn.Module):\n    pass\n",
    "pkg/utils.py": "import torch\n\ndevice = torch.device('cuda')\n",
}


def migrate(folder: Path, *args: str):
    result = CliRunner().invoke(app, [*args], catch_exceptions=False, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, text in {"main.py": MAIN, "model.py": MODEL, "trainer.py": TRAINER, "data.py": DATA,
                       "unused.py": UNUSED}.items():
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def checklist(folder: Path, report: str = "main_npu_report") -> dict[str, dict]:
    return {item["id"]: item for item in json.loads((folder / report / "checklist.json").read_text())}


@pytest.mark.parametrize("mode", ["transfer", "explicit"])
def test_the_ports_import_each_others_ports(project: Path, mode: str):
    migrate(project, "--mode", mode, "main.py", "model.py", "trainer.py", "data.py")
    main = (project / "main_npu.py").read_text()
    assert "import model_npu as m\n" in main
    assert "import trainer_npu as trainer\n" in main
    assert "from data_npu import loader\n" in main
    findings = (project / "main_npu_report" / "findings.csv").read_text()
    assert findings.count(",IMP003,") == 3
    report = (project / "main_npu_report" / "report.md").read_text()
    assert "Inference scripts" not in report  # model.py and data.py are modules of a training project
    before = {path.name: path.read_bytes() for path in project.glob("*_npu.py")}
    migrate(project, "--mode", mode, "main.py", "model.py", "trainer.py", "data.py")
    assert {path.name: path.read_bytes() for path in project.glob("*_npu.py")} == before  # idempotent


def test_a_file_left_out_is_named_and_fails_c3_in_explicit_mode(project: Path):
    result = migrate(project, "--mode", "explicit", "main.py", "trainer.py", "data.py")
    assert "WARNING IMP004: imports model.py, a file of this project that this call did not port" in result.output
    assert "`migrate ./`" in result.output
    assert "import model as m\n" in (project / "main_npu.py").read_text()
    c3 = checklist(project)["C3"]
    assert c3["status"] == "Failed"
    assert c3["evidence"] == ["main.py:2: imports model.py, which this call did not port: its cuda calls stay"]
    assert "migrate ./" in c3["action"]


def test_a_file_left_out_in_transfer_mode_is_a_warning_only(project: Path):
    result = migrate(project, "main.py", "trainer.py", "data.py")
    assert "WARNING IMP004" in result.output
    assert checklist(project)["C3"]["status"] == "Passed"  # transfer_to_npu patches model.py's cuda calls


def test_evidence_in_a_file_no_entry_point_reaches_does_not_count(project: Path):
    migrate(project, "--mode", "explicit", "main.py", "model.py", "trainer.py", "data.py", "unused.py")
    items = checklist(project)
    assert (project / "unused_npu.py").is_file()  # ported all the same
    assert all("unused" not in text for item in items.values() for text in item["evidence"])
    # unused.py's autocast is not evidence: main.py never runs it; the one migrate added to trainer.py is
    assert [text.split(":")[0] for text in items["C2"]["evidence"]] == ["trainer_npu.py"]


def test_a_package_imported_absolutely_and_relatively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name, text in PACKAGE.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    result = migrate(tmp_path, "--mode", "explicit", "run.py", "pkg/model.py", "pkg/layers.py")
    run = (tmp_path / "run_npu.py").read_text()
    assert "from pkg.model_npu import Net\nimport pkg.layers_npu\n" in run
    assert "net = pkg.layers_npu.Block(Net())" in run
    model = (tmp_path / "pkg" / "model_npu.py").read_text()
    assert "from .layers_npu import Block\nfrom . import utils\n" in model
    assert "IMP004: imports pkg/utils.py" in result.output
    assert "`migrate pkg/`" in result.output


def test_the_checklist_names_the_entry_point_whatever_the_order(project: Path):
    migrate(project, "model.py", "trainer.py", "data.py", "main.py")
    items = checklist(project, "model_npu_report")  # the report folder is the first file's, as for any call
    assert "`verify main.py main_npu.py -- ARGS`" in items["C5"]["action"]


def test_an_entry_point_whose_training_is_in_an_imported_module_is_a_training_script(tmp_path: Path,
                                                                                      monkeypatch: pytest.MonkeyPatch):
    """pytorch/examples' mnist_hogwild shape: main.py only calls `train(...)` imported from train.py, which trains;
    main.py was read as an inference script (no backward() of its own), and its training-only rules were skipped."""
    (tmp_path / "main.py").write_text("import torch\nfrom train import train\n\nif __name__ == '__main__':\n"
                                      "    train(torch.nn.Linear(4, 2).cuda())\n")
    (tmp_path / "train.py").write_text(TRAINER.replace("def train(model, batches):", "def train(model, batches=()):"))
    monkeypatch.chdir(tmp_path)
    result = migrate(tmp_path, "main.py", "train.py")
    assert "inference" not in result.output.lower()
    assert "Inference scripts" not in (tmp_path / "main_npu_report" / "report.md").read_text()
    assert "from train_npu import train\n" in (tmp_path / "main_npu.py").read_text()
