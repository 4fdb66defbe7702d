"""The sample GPU training scripts: migrate ports each one to its golden output, and each one trains on the CPU.

Golden files (samples/<name>/expected_<mode>.py) change whenever a rule does. To regenerate them all from the
current rules, then review the diff by hand before committing:

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_samples.py -k golden
"""

import difflib
import py_compile
import shutil

import pytest
from typer.testing import CliRunner

from migrate import Mode
from migrate.cli import app
from samples_support import SCRIPT, all_samples, assert_matches_golden, port, run_on_cpu

SAMPLES = [pytest.param(sample, id=sample.name) for sample in all_samples()]
MODES = [pytest.param(mode, id=mode.value) for mode in Mode]
# A sample's CPU run is a smoke test that verify repeats twice per comparison: it must stay cheap.
CPU_BUDGET_S = 30
# Wall-clock limit, for hangs only: on a shared machine the wall time of a 10 s run can pass a minute.
HANG_GUARD_S = 300


def test_the_samples_are_there():
    names = {sample.name for sample in all_samples()}
    assert {
        "imagenet_classifier",
        "mnist_cnn",
        "gpt_lm",
        "dcgan",
        "cuda_extension_model",
        "fp32_trainer",
        "grad_accum_clip",
        "ddp_file_shards",
    } <= names


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sample", SAMPLES)
def test_port_matches_golden(sample, mode):
    assert_matches_golden(port(sample.script.read_text(encoding="utf-8"), mode), sample.golden(mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sample", SAMPLES)
def test_port_compiles_and_a_second_port_changes_nothing(sample, mode, tmp_path):
    ported = port(sample.script.read_text(encoding="utf-8"), mode)
    target = tmp_path / "train_npu.py"
    target.write_text(ported, encoding="utf-8")
    py_compile.compile(str(target), cfile=str(tmp_path / "train_npu.pyc"), doraise=True)
    again = port(ported, mode)
    assert again == ported, "not idempotent:\n" + "".join(
        difflib.unified_diff(ported.splitlines(True), again.splitlines(True), "first port", "second port")
    )


@pytest.mark.parametrize("sample", SAMPLES)
def test_cli_writes_the_port_beside_and_leaves_the_original_alone(sample, tmp_path):
    folder = tmp_path / sample.name
    shutil.copytree(sample.folder, folder)
    original = (folder / SCRIPT).read_bytes()

    result = CliRunner().invoke(app, [str(folder / SCRIPT), "--quiet"])

    assert result.exit_code == 0, result.output
    assert (folder / SCRIPT).read_bytes() == original
    written = (folder / SCRIPT).with_name("train_gpu_npu.py").read_bytes().decode("utf-8")
    assert written == port(original.decode("utf-8"), Mode.TRANSFER)


@pytest.mark.parametrize("sample", SAMPLES)
def test_verify_config_describes_a_short_cpu_run(sample):
    config = sample.verify_config()
    assert isinstance(config["steps"], int) and config["steps"] > 0
    assert isinstance(config["seed"], int)
    assert isinstance(config["args"], list) and all(isinstance(arg, str) for arg in config["args"])
    assert 0 < config["tolerances"]["loss_rtol"] < 1
    # The same args must run the original on a GPU and the port on an NPU: they may not pin the device.
    assert not {"--no-cuda", "--cpu", "--device", "device=cpu"} & set(config["args"])


@pytest.mark.slow
@pytest.mark.parametrize("sample", SAMPLES)
def test_trains_on_cpu_with_its_verify_args(sample, tmp_path):
    config = sample.verify_config()

    run = run_on_cpu(sample.script, config["args"], tmp_path, hang_guard_s=HANG_GUARD_S)

    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stdout}\n{run.stderr}"
    assert "loss" in run.stdout.lower(), "the script should log its training loss"
    assert run.cpu_s < CPU_BUDGET_S, f"took {run.cpu_s:.1f}s of CPU (wall {run.wall_s:.1f}s)"
