"""The verdicts with the reference on a real CUDA GPU (its GPU code path and kernels) against the port on the emulated
NPU: a faithful AMP port passes; a changed learning rate, a swapped activation and a removed zero_grad() fail with
that cause on the first line. The CPU suite (tests/verify/test_verdicts.py) holds the same verdicts on EMULATED CUDA.
"""

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from migrate import Settings, migrate_source
from verify.cli import app
from verify.cli.pair import route

SCRIPTS = Path(__file__).resolve().parents[1] / "verify" / "scripts"
STEPS = 6


def verify(*args: object) -> tuple[int, dict]:
    argv = [str(arg) for arg in args]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    assert result.exit_code in (0, 1), result.output
    out = Path(argv[argv.index("-o") + 1])
    return result.exit_code, json.loads((out / "summary.json").read_text())


@pytest.fixture
def ported(tmp_path: Path) -> Path:
    """verdict_mlp.py and its transfer-mode port (fp16 autocast, GradScaler), as a user gets them from `migrate`."""
    code = (SCRIPTS / "verdict_mlp.py").read_text()
    (tmp_path / "train.py").write_text(code)
    (tmp_path / "train_npu.py").write_text(migrate_source(code, "train.py", Settings(is_entry=True)).code)
    return tmp_path / "train.py"


def broken(original: Path, old: str, new: str) -> None:
    port = original.with_name("train_npu.py")
    code = port.read_text()
    assert code.count(old) == 1, old
    port.write_text(code.replace(old, new))


def _line_of(script: Path, text: str) -> int:
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def pair(original: Path, out: str) -> tuple[int, dict]:
    return verify(original, "-n", STEPS, "--device-ref", "cuda", "-q", "-o", original.parent / out)


def test_a_faithful_amp_port_passes_against_a_gpu_reference(ported):
    exit_code, summary = pair(ported, "out")
    assert (exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    assert summary["ref"]["title"].endswith(" on cuda") and summary["pair"]["mode"] == "same-amp-imposed"
    manifests = [json.loads((ported.parent / "out" / side / "manifest.json").read_text()) for side in ("ref", "actual")]
    assert manifests[0]["status"] == "ok"  # no NaN of verify's making: the twin skipped what overflowed
    assert manifests[0]["skipped_steps"] == manifests[1]["skipped_steps"]
    calibration = json.loads((ported.parent / "out" / "calibration" / "manifest.json").read_text())
    assert calibration["device"] == "emulated-cuda"  # where the port computes: devices.reference_on_the_ports_hardware


def test_a_changed_learning_rate_is_named_first(ported):
    broken(ported, "default=1e-4", "default=2e-4")
    exit_code, summary = pair(ported, "lr")
    assert exit_code == 1 and summary["reason"].startswith("FAIL: hyperparameter differs: lr")


def test_a_swapped_activation_is_the_first_divergent_operator(ported):
    broken(ported, "nn.ReLU()", "nn.GELU()")
    exit_code, summary = pair(ported, "act")
    forward = "return self.out(self.act(self.hidden(x)))"
    lines = [f"{name}:{_line_of(ported.with_name(name), forward)}" for name in ("train_npu.py", "train.py")]
    assert exit_code == 1 and summary["reason"].startswith(
        f"FAIL: the port computes aten.gelu where the original computes aten.relu at {lines[0]} (original "
        f"{lines[1]}), in Net.act forward, step 0"), summary["reason"]


def test_a_removed_zero_grad_is_named_first(ported):
    broken(ported, "        optimizer.zero_grad()\n", "")
    exit_code, summary = pair(ported, "zero_grad")
    assert exit_code == 1 and summary["reason"].startswith("FAIL: the actual side does not reset gradients")
