"""migrate never calls a script ported, or a checklist item passed, when it is not (issue 13); and its terminal
output fits a pipe. Each case on a real file through the command line."""

from pathlib import Path

from typer.testing import CliRunner

from migrate.cli import app

runner = CliRunner()

# A script that already knows the NPU exists (a branch, a backend table, a --device-modules option) but has not been
# ported: without `import torch_npu` nothing registers the npu device, and its default device is "cuda".
MULTI_DEVICE = '''"""Fit a line on the accelerator given by --device."""
import argparse
import importlib

import torch

BACKENDS = {"cuda": "nccl", "npu": "hccl"}


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "npu":
        torch.npu.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", help="cuda, npu or cpu")
    parser.add_argument("--device-modules", nargs="*", default=[], help="modules that register a device")
    args = parser.parse_args()
    for name in args.device_modules:
        importlib.import_module(name)
    device = torch.device(args.device)
    weight = torch.zeros(1, device=device, requires_grad=True)
    loss = (weight - 1).pow(2).sum()
    loss.backward()
    synchronize(device)


if __name__ == "__main__":
    main()
'''


def migrate(*args: object):
    return runner.invoke(app, [str(arg) for arg in args])


def test_a_script_that_only_names_the_npu_is_ported_and_runs_there_by_default(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE)
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert "1 ported" in result.stderr
    ported = (tmp_path / "fit_npu.py").read_text()
    assert "import torch\nimport torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n" in ported
    assert 'parser.add_argument("--device", default="npu", help="cuda, npu or cpu")' in ported
    report = (tmp_path / "fit_npu_report" / "report.md").read_text()
    assert 'DEV020: --device default -> "npu"' in report
    assert migrate(tmp_path / "fit_npu.py", "--check").exit_code == 0, "the port is taken as ported"


def test_a_device_option_the_script_cannot_take_npu_for_is_kept_and_named(tmp_path: Path):
    script = tmp_path / "fit.py"
    script.write_text(MULTI_DEVICE.replace('help="cuda, npu or cpu"', 'choices=["cuda", "cpu"]'))
    result = migrate(script)
    assert result.exit_code == 0, result.stderr
    assert 'default="cuda", choices=["cuda", "cpu"]' in (tmp_path / "fit_npu.py").read_text()
    report = (tmp_path / "fit_npu_report" / "report.md").read_text()
    assert 'DEV020: --device picks the device; its default "cuda" runs on the NPU through transfer_to_npu' in report
    assert 'its choices lack "npu"' in report
