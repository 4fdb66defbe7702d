"""verify/frameworks: one module a framework, every one in the registry, and the answers migrate, the rules and
verify read of them (tests/test_framework_scripts.py runs the frameworks' scripts through migrate and verify)."""

from __future__ import annotations

import ast
import pkgutil

import pytest

from migrate.facts import framework_precision, source_facts
from migrate.hyperparams import SourceText
from verify import frameworks
from verify.capture.environment_record import recorded_variables


def test_every_public_module_of_the_package_is_a_framework_of_the_registry():
    modules = [module.name for module in pkgutil.iter_modules(frameworks.__path__) if not module.name.startswith("_")]
    assert [getattr(frameworks, name).FRAMEWORK for name in modules] == list(frameworks.FRAMEWORKS)
    assert {framework.name for framework in frameworks.FRAMEWORKS} == {
        "Transformers", "accelerate", "Lightning", "torch.compile", "DeepSpeed", "FSDP2"}


@pytest.mark.parametrize(("code", "sign"), [
    ("accelerator = Accelerator()\n", "Accelerator("),
    ("acc.prepare(model)\naccelerator.backward(loss)\n", "accelerator.backward"),
    ("fabric = L.Fabric(precision='bf16-mixed')\n", "Fabric("),
    ("self.manual_backward(loss)\n", "self.manual_backward"),
    ("import deepspeed\n", "deepspeed"),
    ("class Trainer:\n    def train(self):\n        loss.backward()\n", None),  # a script's own Trainer
    ("with torch.autocast('cuda'):\n    loss = model(x)\n", None),  # torch's own: the AMP rules' marker, no framework
])
def test_own_amp_names_the_sign_that_a_framework_runs_backward_with_its_own_mixed_precision(code, sign):
    assert frameworks.own_amp(code) == sign


def _call_facts(code: str) -> list[str]:
    call = ast.parse(code).body[0].value
    return framework_precision(call, ast.unparse(call.func).rsplit(".", 1)[-1], SourceText(code))


@pytest.mark.parametrize(("code", "facts"), [
    ("Seq2SeqTrainingArguments(output_dir='o', fp16=True)", ["framework_amp"]),
    ("L.Trainer(precision='bf16-mixed')", ["framework_amp", "framework_bf16"]),
    ("L.Trainer(precision='16-true')", []),  # half weights, no autocast
    ("L.Trainer(max_steps=2)", ["framework_fp32"]),  # a Trainer's default precision is fp32
    ("Trainer(max_steps=2)", []),  # the script's own Trainer class, or Hugging Face's: no switch read
    ("TrainingArguments(output_dir='o')", ["framework_fp32"]),
    ("Accelerator(mixed_precision=args.precision)", ["framework_amp_option"]),
    ("Accelerator()", ["framework_amp_option"]),  # accelerate launch --mixed_precision chooses
    ("Fabric(devices=2)", ["framework_amp_option"]),  # fabric run --precision chooses
    ("LightningCLI(Model, Data)", ["framework_amp_option"]),  # --trainer.precision, or a config file
    ("HfArgumentParser(TrainingArguments)", ["framework_amp_option"]),
    ("HfArgumentParser(ModelArguments)", []),
    ("parser.add_argument('--precision', default='32')", ["framework_amp_option"]),
])
def test_a_calls_framework_precision_facts(code, facts):
    assert _call_facts(code) == facts


def test_the_checklist_facts_read_the_frameworks_seeding_helpers():
    assert source_facts("import lightning as L\nL.seed_everything(0)\nset_seed(1)\n").seeds == (2, 3)


def test_a_run_records_the_variables_with_which_a_launcher_chooses_the_precision():
    environ = {"ACCELERATE_MIXED_PRECISION": "fp16", "LT_PRECISION": "bf16-mixed", "ACCELERATE_LOG_LEVEL": "info"}
    assert recorded_variables(environ) == {"ACCELERATE_MIXED_PRECISION": "fp16", "LT_PRECISION": "bf16-mixed"}
