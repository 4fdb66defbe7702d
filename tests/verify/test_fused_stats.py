"""The statistics of large floating tensors on CUDA in one fused pass (verify/capture/triton_stats.py, taken by
tensor_stats.FusedReduction), checked on the CPU: Triton's interpreter runs the same kernels on CPU tensors. It is
chosen by TRITON_INTERPRET=1 before triton is imported, so each check runs in a child process, which sends CPU
tensors through the device path (StatBatch(device_path_on_cpu=True)) as a GPU's tensors go. The tensors are those
of tests/gpu/test_capture_gpu.py::test_device_statistics_equal_the_host_statistics, with more large ones holding
NaN and inf; the kernels on a real GPU are checked there.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verify.capture.tensor_stats import FusedReduction, StatBatch, reductions, summarize

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed here (a CPU build of torch brings "
                                                           "none): the fused kernels cannot run")
# torch's float32 norm on the CPU is off by 1e-5 of itself for 2**20 normal values (the host path's, in float64, and
# the kernels' are not): where torch's reductions are checked against the host path
TORCH_ON_THE_CPU = 1e-4


def floating_tensors() -> list[torch.Tensor]:
    """Sizes off the kernel's block, NaN and inf, views that are not contiguous, float16 and bfloat16."""
    torch.manual_seed(0)
    nonfinite = torch.randn(100_003)
    nonfinite[::1000], nonfinite[7::999], nonfinite[9::997] = float("nan"), float("inf"), -float("inf")
    return [
        torch.randn(1000) * 3 + 1,
        torch.randn(300, 70).t(),  # a transpose: reduced where it lies
        torch.randn(300, 70)[:, :33],  # a slice: copied first
        torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0] * 7),
        torch.randn(5000, dtype=torch.float16),
        torch.randn(5000, dtype=torch.bfloat16),
        torch.randn(1 << 20),
        torch.tensor([float("inf"), 1.0, -3.0]).repeat(40_000),
        nonfinite,
        torch.full((70_001,), float("nan")),
        (torch.randn(70_000) * 30_000).half(),  # overflows to inf in float16
        torch.randn((1 << 17) + 5, dtype=torch.bfloat16),
        torch.randn(8, 16, 30, 30).to(memory_format=torch.channels_last),
    ]


def _in_child(code: str, hide_triton: bool = False) -> tuple[dict, str]:
    """(the JSON `code` prints, its stderr), run with Triton's interpreter and `floating_tensors` importable."""
    prelude = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
    if hide_triton:
        prelude += "sys.modules['triton'] = None  # `import triton` raises ImportError, as where it is missing\n"
    environment = {**os.environ, "TRITON_INTERPRET": "1",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


_DEVICE_PATH = """
import json, torch
from test_fused_stats import floating_tensors
from verify.capture.tensor_stats import StatBatch, summarize
{before}
batch = StatBatch(device_path_on_cpu=True)
pending = [summarize(tensor, batch) for tensor in floating_tensors()]
fetched = batch.ship().read()
print(json.dumps({{"stats": [stats.resolve(fetched) for stats in pending], "note": batch.device_stats.fused.note}}))
"""


def _host_statistics() -> list[dict]:
    batch = StatBatch()
    pending = [summarize(tensor, batch) for tensor in floating_tensors()]
    fetched = batch.fetch()
    return [stats.resolve(fetched) for stats in pending]


def _same_statistics(got: dict, expected: dict, tensor: torch.Tensor, tolerance: float = 1e-5) -> None:
    """min, max, the counts, and sums that are not finite exactly; finite sums within float32 summation order."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if name.endswith("_count") or name in ("min", "max") or not math.isfinite(value):
            assert got[name] == value or math.isnan(got[name]) and math.isnan(value), (name, tensor.shape)
        else:  # the error of a sum grows with the magnitudes summed, not with the sum
            scale = _magnitude(tensor) / tensor.numel() if name == "mean" else value
            assert got[name] == pytest.approx(value, rel=tolerance, abs=tolerance * scale), (name, tensor.shape)


def _magnitude(tensor: torch.Tensor) -> float:
    """The sum of the finite elements' magnitudes."""
    return tensor.double().abs().nan_to_num(posinf=0).sum().item()


@needs_triton
def test_the_fused_kernels_give_torchs_reductions_and_counts():
    """The row of each tensor against `reductions()` and torch's NaN and inf counts: the same NaN-ness, min, max
    and counts exactly, sum and norm within float32 summation order; and the same bits when run again."""
    result, _ = _in_child("""
import json, torch
from test_fused_stats import floating_tensors
from verify.capture.tensor_stats import FusedReduction
fused = FusedReduction()
rows = [fused.row(tensor).tolist() for tensor in floating_tensors()]
bits = [fused.row(floating_tensors()[8]).view(torch.int64).tolist() for _ in range(2)]
print(json.dumps({"rows": rows, "bits": bits, "note": fused.note}))
""")
    assert result["note"].endswith(f"one fused pass, Triton kernels (triton {_triton_version()})")
    assert result["bits"][0] == result["bits"][1]
    for tensor, row in zip(floating_tensors(), result["rows"], strict=True):
        expected = [value.item() for value in reductions(tensor, None)]
        expected += [tensor.isnan().sum().item(), tensor.isinf().sum().item()]
        assert [math.isnan(value) for value in row] == [math.isnan(value) for value in expected], tensor.shape
        assert row[:2] + row[4:] == pytest.approx(expected[:2] + expected[4:], nan_ok=True, rel=0, abs=0)
        # torch's own float32 sum and norm on the CPU are off by up to 1e-5 of the magnitudes (norm of 2**20 normal
        # values); the kernels' are within 1e-6 of the exact ones, computed in float64
        exact = [tensor.double().sum().item(), torch.linalg.vector_norm(tensor.double()).item()]
        for got, torchs, exactly in zip(row[2:4], expected[2:4], exact):
            assert got == pytest.approx(torchs, rel=1e-4, abs=1e-4 * _magnitude(tensor), nan_ok=True), tensor.shape
            assert got == pytest.approx(exactly, rel=1e-6, abs=1e-6 * _magnitude(tensor), nan_ok=True), tensor.shape


def _triton_version() -> str:
    import triton

    return triton.__version__


@needs_triton
def test_the_device_path_takes_large_floating_tensors_through_the_fused_kernels():
    """summarize() on the device path: the large floating tensors through the kernels, the small ones batched as
    before; the statistics those of the host path, and the manifest's note names the fused pass."""
    result, stderr = _in_child(_DEVICE_PATH.format(before=""))
    assert "fused pass" in result["note"] and "npu-port:" not in stderr  # no fallback line (a venv may be named so)
    for tensor, got, expected in zip(floating_tensors(), result["stats"], _host_statistics(), strict=True):
        _same_statistics(got, expected, tensor)


@needs_triton
def test_a_kernel_that_fails_to_compile_sends_the_rest_of_the_run_to_torchs_reductions():
    """A block size Triton refuses (tl.arange wants a power of two) stands for any failure to compile or launch:
    the statistics are still taken, by torch, said once on stderr and in the note, and not tried again."""
    result, stderr = _in_child(_DEVICE_PATH.format(before="from verify.capture import triton_stats\n"
                                                          "triton_stats.BLOCK = 1000"))
    assert "torch's reductions, from the first tensor whose Triton kernel failed on" in result["note"]
    assert stderr.count("npu-port:") == 1
    for tensor, got, expected in zip(floating_tensors(), result["stats"], _host_statistics(), strict=True):
        _same_statistics(got, expected, tensor, TORCH_ON_THE_CPU)


def test_without_triton_the_device_path_uses_torchs_reductions_and_says_so_once():
    result, stderr = _in_child(_DEVICE_PATH.format(before=""), hide_triton=True)
    assert "torch's reductions, as triton does not import (ModuleNotFoundError" in result["note"]
    assert stderr.count("npu-port:") == 1
    for tensor, got, expected in zip(floating_tensors(), result["stats"], _host_statistics(), strict=True):
        _same_statistics(got, expected, tensor, TORCH_ON_THE_CPU)


def test_the_fused_reduction_leaves_other_tensors_to_torch():
    """float64, integers and CPU tensors (outside Triton's interpreter) are not offered to Triton: no note."""
    fused = FusedReduction()
    for tensor in (torch.randn(100_000, dtype=torch.float64), torch.arange(100_000), torch.randn(100_000)):
        assert fused.row(tensor) is None
    assert fused.note is None
