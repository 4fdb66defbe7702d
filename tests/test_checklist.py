"""The checklist report on whole scripts: each item's status, and evidence that points at the right lines."""

import ast
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from migrate.checklist import Status, build
from migrate.cli import app
from migrate.facts import file_facts
from migrate.hyperparams import SourceText, extract
from migrate.types import FileResult, FileStatus
from rules import all_rules
from rules import Settings

SAMPLES = Path(__file__).resolve().parent.parent / "samples"


def _migrate(tmp_path: Path, sample: str, *options: str) -> tuple[dict[str, dict], Path]:
    script = tmp_path / "train.py"
    shutil.copy(SAMPLES / sample / "train_gpu.py", script)
    result = CliRunner().invoke(app, [str(script), "--quiet", *options])
    assert result.exit_code == 0, result.output
    items = json.loads((tmp_path / "train_npu_report" / "checklist.json").read_text())
    return {item["id"]: item for item in items}, tmp_path / "train_npu.py"


def _cited_lines(evidence: str, path: Path) -> list[str]:
    """The source lines an evidence entry `path:line...` cites."""
    match = re.match(rf"{re.escape(str(path.name))}:(\d+)", Path(evidence).name if "/" in evidence else evidence)
    assert match, f"evidence without {path.name}:line: {evidence}"
    return [path.read_text().splitlines()[int(match.group(1)) - 1]]


@pytest.fixture(scope="module")
def fp32_trainer(tmp_path_factory):
    return _migrate(tmp_path_factory.mktemp("fp32"), "fp32_trainer")


def test_every_item_is_reported_with_a_status(fp32_trainer):
    items, _ = fp32_trainer
    assert list(items) == [f"C{i}" for i in range(1, 10)]
    assert {item["status"] for item in items.values()} <= {"Passed", "Failed", "Not checked"}
    assert items["C1"]["status"] == items["C5"]["status"] == "Not checked"
    assert "verify determinism" in items["C1"]["action"] and "verify " in items["C5"]["action"]


def test_mixed_precision_and_loss_scaling_pass_with_evidence_in_the_port(fp32_trainer):
    items, port = fp32_trainer
    assert items["C2"]["status"] == items["C3"]["status"] == items["C4"]["status"] == "Passed"
    assert all("autocast" in line for e in items["C2"]["evidence"] for line in _cited_lines(e, port))
    assert any("GradScaler" in line for e in items["C4"]["evidence"] for line in _cited_lines(e, port))
    assert all("torch_npu" in line for e in items["C3"]["evidence"] for line in _cited_lines(e, port))


def test_machine_dependent_workers_and_validation_faults_fail(fp32_trainer):
    items, _ = fp32_trainer
    assert items["C6"]["status"] == "Failed" and any("DATA003" in e for e in items["C6"]["evidence"])
    c8 = " ".join(items["C8"]["evidence"])
    assert items["C8"]["status"] == "Failed" and "TRN003" in c8 and "TRN002" in c8


def test_run_time_commands_name_a_script_whose_path_has_a_space(tmp_path):
    """The commands get the scripts' paths, not words split from another command: a space stays in the path."""
    folder = tmp_path / "my runs"
    folder.mkdir()
    items, port = _migrate(folder, "fp32_trainer")
    original = shlex.quote(str(folder / "train.py"))
    assert items["C1"]["action"].startswith(f"Run `verify determinism {original}`: it runs the original twice")
    assert f"`verify {original} {shlex.quote(str(port))} -- ARGS`" in items["C5"]["action"]


def test_hyperparameters_are_identical_after_a_port(fp32_trainer):
    items, _ = fp32_trainer
    assert items["C9"]["status"] == "Passed"


def test_amp_off_fails_mixed_precision_and_loss_scaling(tmp_path):
    items, _ = _migrate(tmp_path, "fp32_trainer", "--amp", "off")
    assert items["C2"]["status"] == "Failed" and "--amp off" in items["C2"]["action"]
    assert items["C4"]["status"] == "Failed"


def test_a_hyperparameter_that_differs_in_the_port_fails_c9():
    """A port whose learning rate drifted (say, edited by hand) is named with both values and the port's line."""
    original = (SAMPLES / "fp32_trainer" / "train_gpu.py").read_text()
    drifted = original.replace("default=1e-3", "default=1e-2")
    result = FileResult("train.py", "train_npu.py", FileStatus.CHANGED, facts=file_facts(original, drifted))
    command = "verify train.py train_npu.py -- ARGS"
    items = {item.id: item for item in build([result], Settings(), all_rules(), command, "train.py")}
    assert items["C9"].status is Status.FAILED
    line = next(n for n, text in enumerate(drifted.splitlines(), 1) if "default=1e-2" in text)
    assert items["C9"].evidence == (f"train_npu.py:{line}: lr = 1e-2 in the port, 1e-3 in the original",)


def test_hyperparameters_are_read_from_argparse_optimizers_schedulers_and_constants():
    source = (
        "import argparse, torch\n"
        "learning_rate = 6e-4\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('--lr', '--learning-rate', default=0.1, type=float)\n"
        "p.add_argument('--dist-url', default='env://')\n"
        "opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)\n"
        "sched = torch.optim.lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)\n"
        "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n"
    )
    found = {(h.source, h.name): (h.value, h.line) for h in extract(ast.parse(source), SourceText(source))}
    assert found[("constant", "learning_rate")] == ("6e-4", 2)
    assert found[("argparse", "learning_rate")] == ("0.1", 4)
    assert ("argparse", "dist_url") not in found  # not a hyperparameter
    assert found[("optimizer", "SGD.lr")] == ("0.1", 6) and found[("optimizer", "SGD.momentum")] == ("0.9", 6)
    assert found[("scheduler", "StepLR.step_size")] == ("30", 7)
    assert found[("clip", "clip_grad_norm_.max_norm")] == ("1.0", 8)


_QUANTIZED_BEHIND_AN_OPTION = """import argparse
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

parser = argparse.ArgumentParser()
parser.add_argument("--quantize", action="store_true")
args = parser.parse_args()
quantization = None
if args.quantize:
    quantization = BitsAndBytesConfig(load_in_4bit=True)
model = AutoModelForCausalLM.from_pretrained("model", quantization_config=quantization).to("cuda")
"""


_QUANTIZED_BEHIND_A_PARAMETER = """import argparse
import torch
from transformers import AutoModelForCausalLM, BitsAndBytesConfig


def train(base_model: str, quantize: bool = False):
    model_kwargs = {}
    if quantize:
        model_kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True)
    model = AutoModelForCausalLM.from_pretrained(base_model, **model_kwargs).to("cuda")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--quantize", action="store_true")
    args = parser.parse_args()
    train(base_model="model", quantize=args.quantize)
"""


@pytest.mark.parametrize(("source", "guard"), [
    (_QUANTIZED_BEHIND_AN_OPTION, "`if args.quantize:`"),
    (_QUANTIZED_BEHIND_A_PARAMETER, "`if quantize:` in train()"),
], ids=["if-option", "if-parameter-given-the-option"])
def test_a_finding_on_a_path_behind_an_option_warns_naming_it_and_fails_nothing(tmp_path, source, guard):
    """Regression (issue 54): PEFT's olora_finetuning.py builds a BitsAndBytesConfig only under `--quantize`, off by
    default (its train() tests `if quantize:`, which its __main__ calls with quantize=args.quantize); UNS006 was an
    ERROR that turned C3 to Failed. A path an option takes warns, naming the option."""
    script = tmp_path / "train.py"
    script.write_text(source)
    result = CliRunner().invoke(app, [str(script), "--quiet"])
    assert result.exit_code == 0, result.output
    items = {item["id"]: item for item in json.loads((tmp_path / "train_npu_report" / "checklist.json").read_text())}
    assert items["C3"]["status"] == "Passed", items["C3"]
    [finding] = [f for f in json.loads((tmp_path / "train_npu_report" / "findings.json").read_text())
                 if f["code"] == "UNS006"]
    assert finding["severity"] == "warning" and finding["message"].endswith(
        f"(it runs only behind the option args.quantize: {guard})")


def _checklist_of(script: Path) -> dict[str, dict]:
    """migrate `script` (beside it: its port and report folder): the checklist items by id."""
    result = CliRunner().invoke(app, [str(script), "--quiet"])
    assert result.exit_code == 0, result.output
    report = script.with_name(f"{script.stem}_npu_report")
    return {item["id"]: item for item in json.loads((report / "checklist.json").read_text())}


def test_fsdp2s_mixed_precision_policy_is_the_scripts_bf16_with_no_loss_scaling_needed(tmp_path):
    """pytorch/examples' FSDP2 example trains in bfloat16 through a MixedPrecisionPolicy: it was read as float16
    (`bfloat16` holds `float16`), AMP105 said so at line 1, and C2 and C4 failed (issue 55)."""
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard\n\n"
        "model = torch.nn.Linear(8, 8)\n"
        "policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"
        "fully_shard(model, mp_policy=policy)\n"
        "optimizer = torch.optim.Adam(model.parameters())\n"
        "for batch in loader:\n"
        "    model(batch).sum().backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()\n")
    items = _checklist_of(script)
    assert items["C2"]["status"] == items["C4"]["status"] == "Passed", items
    assert items["C2"]["evidence"][0].endswith("train_npu.py:7: bf16 mixed precision by the framework")
    findings = (tmp_path / "train_npu_report" / "findings.csv").read_text()
    assert "AMP105" not in findings and "autocast" not in (tmp_path / "train_npu.py").read_text()


@pytest.mark.parametrize(("precision", "status", "evidence"), [
    ({"fp16": {"enabled": True}}, "Passed", "fp16 mixed precision by the framework"),
    ({"bf16": {"enabled": True}}, "Passed", "bf16 mixed precision by the framework"),
    ({"fp16": {"enabled": False}}, "Failed", "mixed precision by the framework, turned off by its config file"),
    ({"fp16": {"enabled": "auto"}}, "Not checked", "mixed precision by the framework, chosen at run time"),
], ids=["fp16", "bf16", "off", "auto"])
def test_a_deepspeed_scripts_precision_is_read_from_the_config_file_it_names(tmp_path, precision, status, evidence):
    """deepspeed.initialize(config="ds_config.json"): the JSON beside the script says whether fp16 or bf16 is on."""
    (tmp_path / "ds_config.json").write_text(json.dumps({"train_batch_size": 8, **precision}))
    script = tmp_path / "train.py"
    script.write_text(
        "import deepspeed\nimport torch\n\n"
        "model = torch.nn.Linear(8, 8)\n"
        "engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),\n"
        "                                      config=\"ds_config.json\")\n"
        "for batch in loader:\n"
        "    engine.backward(engine(batch).sum())\n"
        "    engine.step()\n")
    items = _checklist_of(script)
    assert items["C2"]["status"] == status, items["C2"]
    assert f"train_npu.py:7: {evidence}" in items["C2"]["evidence"][0], items["C2"]
