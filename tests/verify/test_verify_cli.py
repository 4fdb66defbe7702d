"""`verify run` through the CLI: exit codes, the summary, usage errors, the emulated NPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from verify.cli import app
from verify.record.store import read_manifest

SCRIPTS = Path(__file__).parent / "scripts"


def verify(*args: str):
    return CliRunner().invoke(app, list(args))


def test_help_documents_the_exit_codes():
    result = verify("run", "--help")
    assert result.exit_code == 0
    assert "Exit codes" in result.output and "2 usage" in result.output


def test_missing_script_is_a_usage_error(tmp_path):
    result = verify("run", str(tmp_path / "nope.py"), "-o", str(tmp_path / "run"))
    assert result.exit_code == 2 and "no such script" in result.output


def test_run_directory_in_the_way_is_a_usage_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("mine")
    result = verify("run", str(SCRIPTS / "no_steps.py"), "-o", str(tmp_path / "run"))
    assert result.exit_code == 2 and "not an empty folder" in result.output
    assert (tmp_path / "run" / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("command", [["run"], ["pair"], ["determinism"]])
@pytest.mark.parametrize("seed", ["-5", str(2**32)])
def test_a_seed_the_child_cannot_take_is_refused_before_anything_runs(tmp_path, command, seed):
    """Issue 36 item 5: Python refuses a PYTHONHASHSEED outside 0..2**32-1, which read as the script's crash."""
    result = verify(*command, str(SCRIPTS / "tiny_train.py"), "--seed", seed, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and "--seed" in result.output
    assert not (tmp_path / "out").exists()


TINY = str(SCRIPTS / "tiny_train.py")
OPTIONS_OUT_OF_RANGE = [
    (["run", TINY], "--steps", "0"), (["run", TINY], "--timeout", "-1"), (["run", TINY], "--timeout", "nan"),
    (["run", TINY], "--nproc-per-node", "0"), (["run", TINY], "--nproc-per-node", "100000"),
    (["run", TINY], "--tensor-cap-mb", "-1"), (["run", TINY], "--ops", "conv[("),
    (["pair", TINY, TINY], "--loss-rtol", "-1"), (["pair", TINY, TINY], "--loss-rtol", "nan"),
    (["pair", TINY, TINY], "--calibration-runs", "-1"), (["pair", TINY, TINY], "--calibration-runs", "9"),
    (["pair", TINY, TINY], "--nproc-per-node", "100000"), (["pair", TINY, TINY], "--steps", "0"),
    (["determinism", TINY], "--steps", "0"), (["determinism", TINY], "--timeout", "-5"),
    (["compare", "ref", "actual"], "--loss-rtol", "-0.1"), (["compare", "ref", "actual"], "--max-rows", "-1"),
]


@pytest.mark.parametrize(("command", "option", "value"), OPTIONS_OUT_OF_RANGE)
def test_an_option_out_of_its_range_is_refused_naming_it_before_anything_runs(tmp_path, command, option, value):
    """Issue 36 item 5: every option with a range is checked before a run starts or a folder is claimed: exit 2 naming
    the option, never the script's crash or a verdict (--nproc-per-node 100000 is past this machine's rank limit)."""
    result = verify(*command, option, value, "-o", str(tmp_path / "out"))
    assert result.exit_code == 2 and option in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_the_runner_refuses_a_seed_the_child_cannot_take(tmp_path):
    from verify.errors import VerifyError
    from verify.launch.runner import RunOptions, run_script
    with pytest.raises(VerifyError, match="--seed must be between 0 and 4294967295"):
        run_script(SCRIPTS / "tiny_train.py", [], RunOptions(seed=-5), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_script_options_without_double_dash_are_refused(tmp_path):
    result = verify("run", str(SCRIPTS / "tiny_train.py"), "--epochs", "2")
    assert result.exit_code == 2 and "No such option" in result.output


@pytest.mark.slow
def test_run_passes_script_arguments_and_prints_a_summary(tmp_path):
    result = verify("run", str(SCRIPTS / "tiny_train.py"), "--steps", "5", "--device", "cpu",
                    "-o", str(tmp_path / "run"), "--", "--epochs", "2")
    assert result.exit_code == 0, result.output
    assert "short" in result.output and "2 / 5" in result.output and "final loss" in result.output
    assert "step 2 loss" in result.output  # the script's own output is echoed
    assert read_manifest(tmp_path / "run").argv == ["--epochs", "2"]


@pytest.mark.slow
def test_failed_run_exits_1(tmp_path):
    result = verify("run", str(SCRIPTS / "no_steps.py"), "--device", "cpu", "-o", str(tmp_path / "run"))
    assert result.exit_code == 1 and "no-steps" in result.output


@pytest.mark.slow
def test_auto_device_emulates_the_npu_for_a_script_importing_torch_npu(tmp_path):
    result = verify("run", str(SCRIPTS / "npu_train.py"), "--steps", "2", "-o", str(tmp_path / "run"))
    assert result.exit_code == 0, result.output
    assert "EMULATED NPU" in result.output
    manifest = read_manifest(tmp_path / "run")
    assert (manifest.device, manifest.emulated, manifest.emulated_on) == ("emulated-npu", True, "cpu")
    assert manifest.torch_npu_version == "" and "emulated" in manifest.device_name.lower()
    assert manifest.title.endswith("EMULATED NPU (a test double on cpu)")


@pytest.mark.slow
def test_unusable_device_is_verify_error_not_a_script_failure(tmp_path):
    result = verify("run", str(SCRIPTS / "no_steps.py"), "--device", "cuda", "-o", str(tmp_path / "run"))
    assert result.exit_code == 2 and "cannot use device cuda" in result.output
    assert read_manifest(tmp_path / "run").verify_error


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")
def test_emulating_the_npu_on_cuda_without_a_gpu_is_verify_error(tmp_path):
    result = verify("run", str(SCRIPTS / "npu_train.py"), "--device", "emulated-npu", "--emulate-on", "cuda",
                    "-o", str(tmp_path / "run"))
    assert result.exit_code == 2 and "cannot use device" in result.output
    assert "--emulate-on cuda needs a CUDA GPU" in read_manifest(tmp_path / "run").verify_error


@pytest.mark.parametrize(
    "way_in",
    [
        "runpy.run_module('verify', run_name='__main__')",  # python -m verify
        "runpy.run_module('verify.cli', run_name='__main__')",  # python -m verify.cli
        "from verify.cli import main; main()",  # a `verify` script installed before verify/__main__.py was its entry
    ],
)
def test_without_its_dependencies_verify_says_so_on_one_line_with_exit_2(tmp_path, way_in):
    """Regression: run by an interpreter without npu-port's dependencies, `python -m verify compare` died on
    ModuleNotFoundError with a traceback and exit 1, the code for FAIL; `python -m verify.cli` still did."""
    hide_typer = f"import runpy, sys; sys.modules['typer'] = None; {way_in}"
    done = subprocess.run([sys.executable, "-c", hide_typer, "compare", "a", "b"], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("verify: error: typer is not installed for ")


@pytest.mark.parametrize("content", ["[]", "3", '"PASS"'])
def test_report_on_a_summary_that_is_not_an_object_is_one_line_exit_2(tmp_path, content):
    """Issue 36 item 7: `verify report` on a summary.json of `[]` raised AttributeError (a traceback file in /tmp)."""
    (tmp_path / "summary.json").write_text(content)
    result = verify("report", str(tmp_path))
    assert result.exit_code == 2
    assert result.output.replace("\n", "") == (
        f"error: {tmp_path / 'summary.json'} is not a comparison's summary: it holds a JSON "
        f"{type(eval(content)).__name__}, not the object `verify compare -o` writes")


def test_an_adaptation_report_asked_of_a_pair_that_proves_nothing_says_why_none_was_written(tmp_path):
    """Issue 36 item 7: --adaptation-report on a pair that errors wrote nothing and said nothing about it."""
    script = str(SCRIPTS / "needs_torchrun.py")  # stops before its first step without a launcher: nothing to compare
    result = verify("pair", script, script, "-n", "2", "-q", "--adaptation-report", "-o", str(tmp_path / "out"))
    assert result.exit_code == 2
    error = result.output.replace("\n", "")
    assert "error: both sides stopped before their first step" in error
    assert error.endswith("; no adaptation.md was written: it reports a comparison, and none could be made")
    assert not (tmp_path / "out" / "adaptation.md").exists()
