"""HF32 on the emulated NPU, TF32 on EMULATED CUDA: fp32 matmuls and convolutions with inputs rounded as those modes
round them (both keep a 10-bit mantissa).

With `torch.npu.matmul.allow_hf32` / `torch.npu.conv.allow_hf32` on, an Ascend NPU multiplies fp32 inputs with a
10-bit mantissa, as TF32 does on a GPU. On the cuda target the switches set the GPU's TF32 switches, the nearest
hardware equivalent. On the cpu target the face's dispatch mode (device_numerics.DeviceNumerics, below verify's op
capture) rounds the float32 multiplicands of the matrix products and convolutions in ROUNDED, forward and backward,
to nearest-even at 10 mantissa bits before the exact fp32 op: the rounding error of the inputs, not the NPU's
accumulation order, is what HF32 changes. Below the capture, the rounding is not recorded and the capture's data flow
runs from the op's real inputs; under autocast the products receive half-precision inputs, which it leaves alone, as
the devices' casts do.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

MANTISSA_BITS = 10
_DROPPED = 23 - MANTISSA_BITS  # of float32's 23 mantissa bits

_aten = torch.ops.aten
# The ops whose float32 multiplicands a switch rounds: (switch, the multiplicands' argument positions).
ROUNDED = {
    _aten.mm.default: ("matmul", (0, 1)), _aten.bmm.default: ("matmul", (0, 1)),
    _aten.addmm.default: ("matmul", (1, 2)), _aten.baddbmm.default: ("matmul", (1, 2)),
    _aten.convolution.default: ("conv", (0, 1)),
    _aten.convolution_backward.default: ("conv", (0, 1, 2)),  # grad_output, input, weight
}
_switches: dict[str, Callable[[], bool]] = {}  # the face's switches, by kind (none on a real device)


def hf32_rounded(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (float32) rounded to nearest-even at HF32's mantissa width; NaN stays NaN."""
    bits = tensor.view(torch.int32)
    half_ulp = (1 << (_DROPPED - 1)) - 1 + ((bits >> _DROPPED) & 1)
    rounded = ((bits + half_ulp) & ~((1 << _DROPPED) - 1)).view(torch.float32)
    return torch.where(torch.isnan(tensor), tensor, rounded)


def as_multiplied(func: Any, args: tuple) -> tuple:
    """`args` of a call of `func` as the device multiplies them: the float32 multiplicands of an op in ROUNDED
    rounded while its switch is on; the same tuple otherwise. Called inside a dispatch mode, which runs the rounding's
    own ops below every mode."""
    kind, positions = ROUNDED[func]
    switch = _switches.get(kind)
    if switch is None or not switch():
        return args
    return tuple(hf32_rounded(arg) if index in positions and isinstance(arg, torch.Tensor)
                 and arg.dtype == torch.float32 else arg for index, arg in enumerate(args))


def install_hf32_rounding(matmul_enabled: Callable[[], bool], conv_enabled: Callable[[], bool]) -> None:
    """cpu target: round the multiplicands of matmuls and of convolutions while their switch is on (the NPU's
    allow_hf32, or for the CUDA stand-in torch.backends' allow_tf32, whose defaults match: matmul off, conv on)."""
    _switches.update(matmul=matmul_enabled, conv=conv_enabled)


def set_cuda_tf32(kind: str, enabled: bool) -> None:
    """cuda target: the GPU's TF32 switch for `kind` ("matmul" or "conv")."""
    if kind == "matmul":
        torch.backends.cuda.matmul.allow_tf32 = enabled
    else:
        torch.backends.cudnn.allow_tf32 = enabled
