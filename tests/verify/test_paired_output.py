"""What the pair shows on the terminal of real runs (child processes, CPU, the emulated devices): its scripts' output
only where asked (-v), the last lines of a side that did not end well (the default), nothing of them with -q; and a
script that compiles with torch.compile said to have run eagerly (verify/capture/compile_calls.py)."""

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from verify.cli import app
from verify.cli.pair import route
from verify.record.store import read_run

pytestmark = pytest.mark.slow

# A model compiled whole and a loss compiled as a decorator's target; `{device}` is "cuda" or "npu".
COMPILED = '''\
import torch
{imports}from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to("{device}")
compiled = torch.compile(model)


@torch.compile(dynamic=False)
def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8, device="{device}"), torch.randn(32, 1, device="{device}")
for step in range(10):
    optimizer.zero_grad()
    loss = mse(compiled(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {{step}} loss {{loss.item():.4f}}")
{crash}'''
EAGER_NOTE = ("both scripts compile with torch.compile (Sequential, mse): verify ran it eagerly, op by op, so that each "
              "op is recorded")


def scripts(folder: Path, crash: str = "") -> tuple[Path, Path]:
    original, port = folder / "train.py", folder / "train_npu.py"
    original.write_text(COMPILED.format(imports="", device="cuda", crash=""))
    port.write_text(COMPILED.format(imports="import torch_npu\n", device="npu", crash=crash))
    return original, port


def pair(original: Path, port: Path, out: Path, *options: str) -> tuple[int, str]:
    argv = [str(original), str(port), "-n", "2", "--calibration-runs", "0", "-o", str(out), *options]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    return result.exit_code, " ".join(result.output.split())


def test_a_compiled_model_is_said_to_have_run_eagerly_and_a_passing_pair_shows_no_script_output(tmp_path):
    code, output = pair(*scripts(tmp_path), tmp_path / "out")
    assert code == 0 and "PASS" in output, output
    assert f"note: {EAGER_NOTE}" in output
    assert "compiled kernels (inductor's fusions) are not what was compared" in output
    assert "step 0 loss" not in output and "UserWarning" not in output  # in each run's output.log only
    assert "step 0 loss" in (tmp_path / "out" / "actual" / "output.log").read_text()
    assert any(note.startswith(EAGER_NOTE) for note in json.loads((tmp_path / "out" / "summary.json").read_text())["notes"])
    for side in ("ref", "actual"):  # dynamo compiled no graph under the capture: the model ran op by op
        assert read_run(tmp_path / "out" / side).manifest.extra["torch_compile"] == {
            "calls": 2, "targets": ["Sequential", "mse"], "graphs": 0}


@pytest.fixture(scope="module")
def crashing(tmp_path_factory) -> tuple[Path, Path]:
    """A port that raises after its first step."""
    return scripts(tmp_path_factory.mktemp("crashing"), crash=(
        '    if step == 0:\n        print("=" * 40 + "\\n|  ~~//~~  |\\n" + "-" * 40)  # a framework\'s logo\n'
        '        raise RuntimeError("port broke")\n'))


def test_a_crashing_side_shows_its_last_lines_and_traceback_and_nothing_of_the_side_that_ran_well(crashing, tmp_path):
    code, output = pair(*crashing, tmp_path / "out")
    assert code == 1 and "FAIL: actual run crashed: RuntimeError: port broke" in output, output
    assert re.search(rf"\[actual\] crashed: the last \d+ lines that say something of "
                     rf"{re.escape(str(tmp_path))}/out/actual/output.log:", output)
    assert "[actual] step 0 loss" in output and 'raise RuntimeError("port broke")' in output
    assert "=====" not in output and "~~//~~" not in output  # regression (issue 54): a logo is no last line
    assert "[ref]" not in output


def test_verbose_echoes_every_runs_output_and_quiet_shows_none_of_it(crashing, tmp_path):
    code, output = pair(*crashing, tmp_path / "verbose", "-v")
    assert code == 1 and "[ref] step 0 loss" in output and "[actual] step 0 loss" in output, output
    assert "lines of" not in output  # every line was shown as it came
    code, output = pair(*crashing, tmp_path / "quiet", "-q")
    assert code == 1 and "FAIL: actual run crashed" in output, output
    assert "[actual]" not in output and "Traceback" not in output
