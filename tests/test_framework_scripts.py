"""Framework scripts (Hugging Face Trainer, accelerate, Lightning) through migrate: the port runs where the
framework needs more than the imports (Lightning: DEV021; accelerate on several processes: DEV022), no autocast or GradScaler is added to a framework's AMP,
and the checklist reads the framework's mixed precision and seeds, citing the lines it read them on."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from migrate.cli import app

LIGHTNING = """
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    L.seed_everything(0)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="16-mixed", max_steps=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
"""

# Lightning's CLI scripts: the Trainer's arguments, its precision among them, come from the command line or a config
LIGHTNING_CLI = """
import torch
import lightning as L
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.lr = lr
        self.layer = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(64, 8, generator=generator), torch.randint(0, 2, (64,), generator=generator))
        return DataLoader(data, batch_size=8)


def cli_main():
    LightningCLI(Classifier, seed_everything_default=0)


if __name__ == "__main__":
    cli_main()
"""

DEEPSPEED = """
import argparse
import deepspeed
import torch
import torch.nn as nn


def main():
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    model_engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                 config="ds_config.json")
    for step in range(20):
        x = torch.randn(8, 16).to(model_engine.device).half()
        loss = nn.functional.cross_entropy(model_engine(x), torch.randint(0, 4, (8,)).to(model_engine.device))
        model_engine.backward(loss)
        model_engine.step()


if __name__ == "__main__":
    main()
"""

HF_TRAINER = """
import torch
from transformers import HfArgumentParser, Trainer, TrainingArguments, set_seed


def main():
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    set_seed(args.seed)
    model = build_model().to("cuda")
    Trainer(model=model, args=args, train_dataset=load()).train()


if __name__ == "__main__":
    main()
"""

HF_TRAINER_BF16 = """
import torch
from transformers import Trainer, TrainingArguments

args = TrainingArguments(output_dir="out", bf16=True, no_cuda=False)
Trainer(model=build_model(), args=args, train_dataset=load()).train()
"""

ACCELERATE = """
import argparse
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])
    args = parser.parse_args()
    acc = Accelerator(mixed_precision=args.mixed_precision)
    set_seed(42)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = acc.prepare(model, optimizer, make_loader())
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    main()
"""

# accelerate/examples/nlp_example.py's shape: a shuffled DataLoader, whose RNG state accelerate broadcasts from rank 0
# when each epoch starts on several processes
ACCELERATE_SHUFFLED = """
import torch
from accelerate import Accelerator

accelerator = Accelerator()
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for inputs, targets in loader:
    optimizer.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(inputs), targets))
    optimizer.step()
"""


def _migrate(tmp_path: Path, name: str, source: str, *options: str) -> tuple[dict[str, dict], str, Path]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(source).lstrip())
    result = CliRunner().invoke(app, [str(script), "--quiet", *options])
    assert result.exit_code == 0, result.output
    items = json.loads((tmp_path / f"{name}_npu_report" / "checklist.json").read_text())
    port = tmp_path / f"{name}_npu.py"
    return {item["id"]: item for item in items}, port.read_text(), port


def _cited(evidence: list[str], port: Path) -> list[str]:
    """The port's lines that `port:LINE: ...` evidence cites."""
    lines = port.read_text().splitlines()
    return [lines[int(entry.split(":")[1]) - 1].strip() for entry in evidence if entry.startswith(f"{port}:")]


def test_a_lightning_port_passes_c2_and_c4_on_the_trainers_precision_and_c1_cites_seed_everything(tmp_path):
    items, text, port = _migrate(tmp_path, "lit", LIGHTNING)
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Passed"
        [evidence] = items[item]["evidence"]
        assert evidence.endswith(": fp16 mixed precision by the framework")
        assert _cited([evidence], port)[0].startswith('trainer = L.Trainer(accelerator="gpu"')
        assert "add no torch.autocast or GradScaler" in items[item]["action"]
    assert _cited(items["C1"]["evidence"], port) == ["L.seed_everything(0)"]
    assert "autocast" not in text and "GradScaler" not in text


@pytest.mark.parametrize(("name", "source", "call"), [
    ("lit", LIGHTNING.replace('precision="16-mixed", ', ""), 'trainer = L.Trainer(accelerator="gpu"'),
    ("lit32", LIGHTNING.replace('precision="16-mixed"', 'precision="32-true"'),
     'trainer = L.Trainer(accelerator="gpu"'),
    ("hf", HF_TRAINER_BF16.replace("bf16=True, ", ""), 'args = TrainingArguments(output_dir="out"'),
], ids=["lightning", "lightning-32-true", "trainer"])
def test_a_framework_left_in_fp32_fails_c2_and_c4_with_its_own_switch_not_torch_autocast(tmp_path, name, source, call):
    """Regression: a Lightning Trainer given no precision was told to run migrate with --amp fp16 or to add
    torch.autocast, which a framework's training loop neither takes nor wants: it is told its framework's switch.
    So is one given precision="32-true" (it read "no autocast in the port", naming no line)."""
    items, text, port = _migrate(tmp_path, name, source)
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Failed"
        [evidence] = items[item]["evidence"]
        assert evidence.endswith(": mixed precision by the framework, not switched on: it trains in fp32"), evidence
        assert _cited([evidence], port)[0].startswith(call)
        action = items[item]["action"]
        assert action.startswith("Switch the framework's mixed precision on (") and "--amp" not in action, action
        assert ('precision="16-mixed"' if name.startswith("lit") else "bf16") in action, action
    assert "autocast" not in text and "GradScaler" not in text


@pytest.mark.parametrize("mode", ["transfer", "explicit"])
def test_a_lightning_port_sets_the_device_capability_and_runs_lightnings_cuda_accelerator_through_transfer(
    tmp_path, mode
):
    _, text, _ = _migrate(tmp_path, "lit", LIGHTNING, "--mode", mode)
    assert 'os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")' in text
    assert text.index("TORCH_NPU_DEVICE_CAPABILITY") < text.index("trainer = L.Trainer(")  # before it sets up
    assert "from torch_npu.contrib import transfer_to_npu" in text  # explicit mode too: no NPU accelerator
    findings = json.loads((tmp_path / "lit_npu_report" / "findings.json").read_text())
    dev021 = [f for f in findings if f["code"] == "DEV021"]
    assert len(dev021) == 1 and dev021[0]["severity"] == ("warning" if mode == "explicit" else "info")


def test_a_trainer_whose_precision_comes_from_the_command_line_is_not_checked_and_cites_the_parser(tmp_path):
    items, text, port = _migrate(tmp_path, "hf", HF_TRAINER)
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Not checked"
        [evidence] = items[item]["evidence"]
        assert evidence.endswith(": mixed precision by the framework, chosen at run time: --fp16 or --bf16 of "
                                 "TrainingArguments")
        assert _cited([evidence], port) == ["(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()"]
        # what to pass where it runs, this framework's alone (issue 54)
        assert items[item]["action"].startswith("Chosen at run time: turn the framework's mixed precision on where "
                                                "you run it (--fp16 or --bf16 of TrainingArguments).")
        assert "add no torch.autocast" in items[item]["action"] and "accelerate" not in items[item]["action"]
    assert _cited(items["C1"]["evidence"], port) == ["set_seed(args.seed)"]
    assert "autocast" not in text and "GradScaler" not in text


def test_a_lightning_cli_port_sets_the_capability_and_its_checklist_says_what_to_pass(tmp_path):
    """Regression (issue 54): a LightningCLI's accelerator comes from the command line (`--trainer.accelerator gpu`),
    a config file or "auto"; its port got no TORCH_NPU_DEVICE_CAPABILITY and crashed in Lightning's CUDA accelerator,
    and C2/C4 did not say how its precision is chosen."""
    items, text, port = _migrate(tmp_path, "cli", LIGHTNING_CLI)
    assert text.index('os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")') < text.index("LightningCLI(")
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Not checked"
        assert _cited(items[item]["evidence"], port) == ["LightningCLI(Classifier, seed_everything_default=0)"]
        assert "--trainer.precision 16-mixed" in items[item]["action"]
    findings = json.loads((tmp_path / "cli_npu_report" / "findings.json").read_text())
    assert [f["code"] for f in findings if f["code"] == "DEV021"] == ["DEV021"]


@pytest.mark.slow
def test_a_lightning_cli_port_passes_with_the_accelerator_and_precision_on_its_command_line(tmp_path):
    pytest.importorskip("jsonargparse")
    _migrate(tmp_path, "cli", LIGHTNING_CLI)
    done = subprocess.run(
        [sys.executable, "-m", "verify", "cli.py", "cli_npu.py", "--steps", "2", "-q", "-o", "out", "--", "fit",
         "--trainer.accelerator", "gpu", "--trainer.precision", "16-mixed", "--trainer.max_steps", "4",
         "--trainer.logger", "false", "--trainer.enable_checkpointing", "false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_deepspeed_script_gets_hccl_and_its_config_precision_and_engine_step_are_read(tmp_path):
    """Regression (issue 55): migrate left `init_distributed(dist_backend="nccl")`; TRN001 said the loop never clears
    gradients, which the engine's step() does; AMP105 flagged the inputs' `.half()`, and C2/C4 Failed, where
    DeepSpeed's config does the fp16 and its loss scaling."""
    items, text, port = _migrate(tmp_path, "ds", DEEPSPEED)
    assert 'deepspeed.init_distributed(dist_backend="hccl")' in text and "zero_grad" not in text
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Not checked"
        assert '"fp16": {"enabled": true} (or "bf16") in its DeepSpeed config' in items[item]["action"]
    assert items["C8"]["status"] == "Passed", items["C8"]
    findings = json.loads((tmp_path / "ds_npu_report" / "findings.json").read_text())
    assert not {"AMP105", "TRN001"} & {finding["code"] for finding in findings}


def test_bf16_training_arguments_pass_c2_and_c4_without_a_scaler(tmp_path):
    items, _, port = _migrate(tmp_path, "hf", HF_TRAINER_BF16)
    assert items["C2"]["status"] == items["C4"]["status"] == "Passed"
    [evidence] = items["C4"]["evidence"]
    assert evidence.endswith(": bf16 mixed precision by the framework")
    assert _cited([evidence], port) == ['args = TrainingArguments(output_dir="out", bf16=True, no_cuda=False)']


def test_an_explicit_trainer_port_names_the_npu_in_device_map_and_to_and_keeps_the_frameworks_own_switches(tmp_path):
    source = HF_TRAINER_BF16.replace("build_model()", 'AutoModel.from_pretrained("m", device_map="cuda").to("cuda")')
    _, text, _ = _migrate(tmp_path, "hf", source, "--mode", "explicit")
    assert 'AutoModel.from_pretrained("m", device_map="npu").to("npu")' in text
    assert "no_cuda=False" in text and "transfer_to_npu" not in text  # the Trainer finds the NPU itself


def test_an_accelerate_loop_gets_no_second_amp_and_its_mixed_precision_option_is_cited(tmp_path):
    items, text, port = _migrate(tmp_path, "acc", ACCELERATE)
    assert "autocast" not in text and "GradScaler" not in text and "acc.backward(loss)" in text
    assert items["C2"]["status"] == items["C4"]["status"] == "Not checked"
    assert _cited(items["C2"]["evidence"], port) == [
        'parser.add_argument("--mixed_precision", default="no", choices=["no", "fp16", "bf16"])',
        "acc = Accelerator(mixed_precision=args.mixed_precision)",
    ]
    assert _cited(items["C1"]["evidence"], port) == ["set_seed(42)"]
    assert not [e for e in items["C2"]["evidence"] + items["C4"]["evidence"] if "AMP10" in e]


def test_an_accelerator_built_without_its_switch_leaves_the_precision_to_the_launcher(tmp_path):
    """The AMP rules add no autocast to an accelerate loop, and the checklist does not fail it for want of one: one
    answer (verify/frameworks) to whether accelerate does the mixed precision."""
    items, text, port = _migrate(tmp_path, "acc", ACCELERATE_SHUFFLED, "--amp", "fp16")
    assert "autocast" not in text and "GradScaler" not in text
    for item in ("C2", "C4"):
        assert items[item]["status"] == "Not checked"
        assert _cited(items[item]["evidence"], port) == ["accelerator = Accelerator()"]
        assert "--mixed_precision fp16" in items[item]["action"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["transfer", "explicit"])
def test_the_lightning_port_trains_two_steps_on_the_emulated_npu(tmp_path, mode):
    pytest.importorskip("lightning")
    _, _, port = _migrate(tmp_path, "lit", LIGHTNING, "--mode", mode)
    done = subprocess.run(
        [sys.executable, "-m", "verify", "run", str(port), "--device", "emulated-npu", "--steps", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ran the 2 requested steps" in done.stdout + done.stderr


@pytest.mark.slow
def test_lightnings_step_inside_optimizer_step_is_recorded_and_a_port_that_changes_it_fails_naming_the_op(tmp_path):
    """Regression: Lightning runs training_step and backward inside optimizer.step(closure), which the capture paused
    as the optimizer's own work. Only the updates were recorded, and a port computing its logits * 1.005 PASSed (its
    loss off by 0.5%, within 1%; gradient clipping left its updates alike). The closure's ops are the step's own."""
    pytest.importorskip("lightning")
    source = LIGHTNING.replace('precision="16-mixed", ', "")
    source = source.replace("max_steps=2", "max_steps=5, gradient_clip_val=0.25")
    _, _, port = _migrate(tmp_path, "lit", source)
    broken = tmp_path / "lit_broken.py"
    broken.write_text(port.read_text().replace("self.layer(x), y)", "self.layer(x) * 1.005, y)"))
    verdicts = {}
    for name in (port.name, broken.name):
        done = subprocess.run(
            [sys.executable, "-m", "verify", "lit.py", name, "--steps", "3", "-q", "-o", f"out-{name}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
        )
        verdicts[name] = done.returncode, json.loads((tmp_path / f"out-{name}" / "summary.json").read_text())
    code, summary = verdicts[port.name]
    assert code == 0 and summary["reason"].startswith("PASS"), summary["reason"]
    phases = set(pd.read_csv(tmp_path / f"out-{port.name}" / "ops.csv")["phase"])
    assert {"forward", "backward", "optimizer"} <= phases, phases
    code, summary = verdicts[broken.name]
    assert code == 1 and "the port computes aten.mul" in summary["reason"] and "lit_broken.py:" in summary["reason"], (
        summary["reason"])


@pytest.mark.slow
def test_a_lightning_16_mixed_pair_compares_updates_once_both_scalers_settle(tmp_path):
    """Regression (issue 52): both sides' own loss scalers (Lightning's 16-mixed GradScaler) skipped every update of
    a short run, and a PASS was printed on no compared update. The pair goes on while the scales settle."""
    pytest.importorskip("lightning")
    loss = "torch.nn.functional.cross_entropy(self.layer(x), y)"
    source = LIGHTNING.replace(loss, f"{loss} * 1000").replace("max_steps=2", "max_steps=40")
    _, _, port = _migrate(tmp_path, "lit", source)
    done = subprocess.run(
        [sys.executable, "-m", "verify", "lit.py", port.name, "--steps", "3", "-q", "-o", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    skipped = summary["overflow"]["actual_scale"]["skipped"]
    assert skipped and skipped == summary["overflow"]["ref_scale"]["skipped"]
    assert summary["reason"].startswith(f"PASS: loss within 1.00% at all {3 + len(skipped)} steps")
    assert any(note.startswith(f"ran {len(skipped)} more step(s) while the loss scale settled") and
               note.endswith(f"{len(skipped)} update(s) skipped, 3 applied") for note in summary["notes"])


@pytest.mark.slow
def test_an_accelerate_port_broadcasts_on_two_emulated_npus(tmp_path):
    """torch 2.12+ broadcast() asks get_device_capability() of a tensor that transfer_to_npu calls cuda; torch_npu
    answers None unless TORCH_NPU_DEVICE_CAPABILITY is set: accelerate/examples/nlp_example.py's port crashed at its
    first epoch on 2 ranks ("'NoneType' object is not subscriptable", in accelerate's synchronize_rng_state)."""
    pytest.importorskip("accelerate")
    _, text, port = _migrate(tmp_path, "acc", ACCELERATE_SHUFFLED)
    assert text.index('os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")') < text.index("= Accelerator()")
    done = subprocess.run(
        [sys.executable, "-m", "verify", "run", str(port), "--nproc-per-node", "2", "--steps", "2", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
