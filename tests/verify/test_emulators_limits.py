"""verify's limits are verify's (issue 43, item 5): the emulations answer the whole public API of the installed torch's
torch.cuda and of torch_npu.npu, markers (NVTX, mstx) as no-ops; a name of torch_npu.npu the emulated NPU does not
model is verify's error naming the emulation (exit 2), never the script's crash; a script whose path holds a byte that
is not UTF-8 is refused before it runs (it "crashed" at opt.step() on verify's UnicodeEncodeError, and its pair said
PASS).

No torch_npu wheel is at hand offline, so the NPU's list is torch.cuda's public API with CUDA read as NPU, less the
names /work/shared/design/rules-catalogue.md lists as absent from torch_npu.npu.__all__, plus its NPU-only names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from verify import devices
from verify.cli import app
from verify.record.store import read_manifest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ABSENT_ON_NPU = {  # rules-catalogue.md §1: torch.cuda names absent from torch_npu.npu.__all__
    "nvtx", "jiterator", "nccl", "profiler", "sparse", "tunable", "cudart", "list_gpu_processes", "memory_usage",
    "device_memory_used", "temperature", "power_draw", "clock_rate", "get_arch_list", "get_gencode_flags",
    "is_tf32_supported", "has_half", "has_magma", "current_solver_handle", "CUDAPluggableAllocator",
    "caching_allocator_enable", "caching_allocator_disabled", "check_error", "CudaError", "GreenContext",
    "get_stream_from_external", "ComplexFloatStorage", "ComplexDoubleStorage", "comm",
}
NPU_ONLY = {"mstx", "set_compile_mode", "is_jit_compile_false", "set_option", "config", "matmul", "conv",
            "get_amp_supported_dtype", "set_deterministic_level", "NPUPluggableAllocator", "utilization"}
NPU_API = sorted({name.replace("CUDA", "NPU").replace("cuda", "npu") for name in torch.cuda.__all__
                  if name not in ABSENT_ON_NPU} | NPU_ONLY)

WALK = """
import json, sys
import torch
from verify.devices.setup import prepare

prepare(sys.argv[1])
if sys.argv[1] == "emulated-cuda":
    module, names = torch.cuda, torch.cuda.__all__
    torch.cuda.nvtx.mark("m"); torch.cuda.nvtx.range_end(torch.cuda.nvtx.range_start("r"))
    with torch.cuda.nvtx.range("r"):
        markers = [torch.cuda.nvtx.range_push("p"), torch.cuda.nvtx.range_pop()]
else:
    import torch_npu
    module, names = torch_npu.npu, json.loads(sys.argv[2])
    mstx = torch_npu.npu.mstx
    mstx.mark("m"); mstx.range_end(mstx.range_start("r"))
    with mstx.annotate("a"):
        markers = [mstx.range_push("p"), mstx.range_pop()]
answers = {}
for name in names:
    try:
        getattr(module, name)
        answers[name] = "answers"
    except Exception as error:
        answers[name] = type(error).__name__ + (" (verify's limit)" if "not emulated by" in str(error) else "")
print(json.dumps({"markers": markers, "answers": answers}))
"""


def walk(device: str, names: list[str]) -> dict:
    env = {**os.environ, **devices.child_env(device, devices.EmulateOn.CPU.value)}
    child = subprocess.run([sys.executable, "-c", WALK, device, json.dumps(names)], env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.splitlines()[-1])


def test_emulated_cuda_answers_every_public_name_of_torch_cuda_and_nvtx_marks_nothing():
    """range_push on EMULATED CUDA raised the CPU build's 'NVTX functions not installed', the script's crash."""
    found = walk(devices.Device.EMULATED_CUDA.value, [])
    assert found["markers"] == [0, 0]
    assert {name: answer for name, answer in found["answers"].items() if answer != "answers"} == {}
    assert len(found["answers"]) == len(torch.cuda.__all__)


def test_the_emulated_npu_answers_every_public_name_of_torch_npu_npu_or_names_itself():
    found = walk(devices.Device.EMULATED_NPU.value, NPU_API)
    assert found["markers"] == [0, 0]
    unanswered = {name: answer for name, answer in found["answers"].items()
                  if answer not in ("answers", "NotEmulated (verify's limit)")}
    assert unanswered == {}


@pytest.mark.slow
def test_a_name_the_emulated_npu_does_not_model_is_verifys_error_naming_it_not_the_scripts_crash(tmp_path):
    script = tmp_path / "train_npu.py"
    script.write_text((SCRIPTS / "long_train.py").read_text().replace(
        "    time.sleep(0.2)\n", "    torch_npu.npu.mstx.mark('step')\n    torch_npu.npu.set_sync_debug_mode(0)\n")
        .replace("import torch\n", "import torch\nimport torch_npu\n", 1))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(script), "--device", "emulated-npu", "--steps", "2", "-q", "-o",
                                      str(out), "--", "3"])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()).startswith(f"error: {out}: torch_npu.npu.set_sync_debug_mode is not")
    assert "set_sync_debug_mode is not emulated by npu-port's emulated NPU" in read_manifest(out).verify_error


@pytest.mark.slow
def test_a_script_whose_path_is_not_utf8_is_refused_before_it_runs_naming_verify(tmp_path):
    script = os.path.join(os.fsencode(tmp_path), b"caf\xe9.py")
    shutil.copy(SCRIPTS / "long_train.py", script)
    for args in (["run", script, "-o", "run"], [script, script, "-o", "pair"]):
        verify = subprocess.run([sys.executable, "-m", "verify", *args, "--steps", "2", "-q", "--", "3"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert verify.returncode == 2, verify.stderr
        assert "verify records paths as UTF-8 text" in " ".join(verify.stderr.split())
        assert "PASS" not in verify.stderr + verify.stdout


def _run_on_the_emulated_npu(tmp_path: Path, lines: str) -> tuple[int, str, object]:
    """`verify run` of long_train.py with `lines` in its loop, on the emulated NPU."""
    script = tmp_path / "train_npu.py"
    script.write_text((SCRIPTS / "long_train.py").read_text().replace("    time.sleep(0.2)\n", lines)
                      .replace("import torch\n", "import torch\nimport torch_npu\n", 1))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(script), "--device", "emulated-npu", "--steps", "2", "-q", "-o",
                                      str(out), "--", "3"])
    return result.exit_code, result.output, read_manifest(out)


@pytest.mark.slow
def test_an_error_the_emulation_raises_in_its_own_code_is_verifys_naming_it(tmp_path):
    """torch_npu.optim.NpuFusedLamb has no torch counterpart: the emulated torch_npu raises NotImplementedError in
    its own code, verify's limit (exit 2 naming the emulation), never the script's crash."""
    code, output, manifest = _run_on_the_emulated_npu(tmp_path, "    torch_npu.optim.NpuFusedLamb(model.parameters())\n")
    assert code == 2, output
    assert manifest.verify_error.startswith("npu-port's emulated NPU (a test double, not an Ascend NPU) failed in its "
                                            "own code (torch_npu/optim/__init__.py:")
    assert "not in the script: NotImplementedError" in manifest.verify_error


@pytest.mark.slow
def test_an_error_the_emulation_raises_as_the_device_would_is_the_scripts_crash(tmp_path):
    """An index past the devices it presents: the real NPU refuses it too (target.as_the_device)."""
    code, output, manifest = _run_on_the_emulated_npu(tmp_path, "    torch.npu.set_device(5)\n")
    assert (code, manifest.status, manifest.verify_error) == (1, "crashed", ""), output
    assert "npu:5 does not exist" in manifest.message
