"""migrate reads an inference script as one (issue 24 part 3): no training-only findings, no seeds for generators the
script never uses, and a report that says how the script was read. On the classifier inference script verify's own
tests pair with its port, through the command line."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.cli import app
from migrate.engine import migrate_source
from rules import Settings

runner = CliRunner()
CLASSIFIER = Path(__file__).parent / "verify" / "scripts" / "classify_inference.py"
TRAINER = Path(__file__).parents[1] / "samples" / "mnist_cnn" / "train_gpu.py"


def _port(script: Path, tmp_path: Path, *options: str) -> Path:
    """Port a copy of `script` in tmp_path; returns its report folder."""
    copy = tmp_path / script.name
    shutil.copy(script, copy)
    result = runner.invoke(app, [str(copy), *options])
    assert result.exit_code == 0, result.output
    return tmp_path / f"{script.stem}_npu_report"


@pytest.mark.parametrize("options", [(), ("--seed", "0")], ids=["plain", "seed"])
def test_the_classifier_inference_script_gets_no_training_finding_and_no_random_seed(tmp_path, options):
    report = _port(CLASSIFIER, tmp_path, *options)
    codes = {row["code"] for row in json.loads((report / "findings.json").read_text())}
    assert "TRN003" not in codes
    port = (tmp_path / "classify_inference_npu.py").read_text()
    assert "import random" not in port and "random.seed" not in port
    assert "torch.manual_seed(0)" in port  # the script's own seed stays, and torch_npu is still imported
    assert "import torch_npu" in port


def test_the_report_says_the_script_was_read_as_an_inference_script(tmp_path):
    report = _port(CLASSIFIER, tmp_path)
    markdown = (report / "report.md").read_text()
    assert "## Inference scripts" in markdown
    assert "`" + str(tmp_path / "classify_inference.py") + "`: read as an inference script" in markdown
    items = {item["id"]: item for item in json.loads((report / "checklist.json").read_text())}
    # No loss to scale and no training step to autocast: not a failure of the port.
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Not checked"
        assert any("read as an inference script" in line for line in items[item]["evidence"])


def test_a_training_script_is_not_read_as_one(tmp_path):
    report = _port(TRAINER, tmp_path, "--seed", "0")
    assert "inference" not in (report / "report.md").read_text()
    assert "random.seed(" in (tmp_path / "train_gpu_npu.py").read_text()


TRAINING_FORMS = {
    "backward": "loss = model(x).sum()\nloss.backward()\n",
    "accelerate": "accelerator.backward(loss)\n",
    "autograd": "torch.autograd.backward([loss])\n",
    "optimizer step": "optimizer.step()\n",
    "scaler step": "scaler.step(opt)\n",
    "lightning": "trainer.fit(model, loader)\n",
    "hugging face": "trainer.train()\n",
}


@pytest.mark.parametrize("body", TRAINING_FORMS.values(), ids=TRAINING_FORMS.keys())
def test_any_form_of_training_makes_a_training_script(body):
    assert not migrate_source("import torch\n" + body, "train.py", Settings()).inference


@pytest.mark.parametrize(
    "body",
    ["model.eval()\nmodel.train()\nprint(model(x))\n", "scheduler.step()\n", "env.step(action)\n"],
    ids=["train mode", "scheduler", "environment"],
)
def test_what_only_looks_like_training_does_not(body):
    assert migrate_source("import torch\n" + body, "infer.py", Settings()).inference


def test_a_project_module_is_never_read_as_an_inference_script():
    """Its training loop may be in another file of the project."""
    source = "import torch\n\ndef validate(model):\n    model.eval()\n"
    result = migrate_source(source, "evaluation.py", Settings(is_entry=False))
    assert not result.inference
    assert [finding.code for finding in result.findings] == ["TRN003"]
