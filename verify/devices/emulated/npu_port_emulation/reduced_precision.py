"""HF32 on the emulated NPU, TF32 on EMULATED CUDA: fp32 matmuls and convolutions with inputs rounded as those modes
round them (both keep a 10-bit mantissa).

With `torch.npu.matmul.allow_hf32` / `torch.npu.conv.allow_hf32` on, an Ascend NPU multiplies fp32 inputs with a
10-bit mantissa, as TF32 does on a GPU. On the cuda target the switches set the GPU's TF32 switches, the nearest
hardware equivalent. On the cpu target the float32 inputs and weights of torch.nn.functional's convolutions and
linear, and of torch's matmul functions, are rounded to nearest-even at 10 mantissa bits before the exact fp32 op:
the rounding error of the inputs, not the NPU's accumulation order, is what HF32 changes. The rounding is hidden from
verify's operator capture and passes gradients through unchanged (the backward's own products are not rounded).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

MANTISSA_BITS = 10
_DROPPED = 23 - MANTISSA_BITS  # of float32's 23 mantissa bits

CONV_FUNCTIONS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
MATMUL_FUNCTIONS = ("matmul", "mm", "bmm")


def hf32_rounded(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` (float32) rounded to nearest-even at HF32's mantissa width; NaN stays NaN."""
    bits = tensor.view(torch.int32)
    half_ulp = (1 << (_DROPPED - 1)) - 1 + ((bits >> _DROPPED) & 1)
    rounded = ((bits + half_ulp) & ~((1 << _DROPPED) - 1)).view(torch.float32)
    return torch.where(torch.isnan(tensor), tensor, rounded)


class _Hf32Round(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor) -> torch.Tensor:
        with _disable_current_modes(), torch.no_grad():  # verify records the matmul, not its input rounding
            return hf32_rounded(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _rounded(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float32:
        return _Hf32Round.apply(value)
    return value


def _rounding(original: Callable, enabled: Callable[[], bool]) -> Callable:
    """`original` with its two multiplicands (input and weight, or the two matrices) rounded while `enabled()`."""

    @functools.wraps(original)
    def hf32(*args: Any, **kwargs: Any) -> Any:
        if enabled() and len(args) >= 2:
            args = (_rounded(args[0]), _rounded(args[1]), *args[2:])
        return original(*args, **kwargs)

    return hf32


def install_hf32_rounding(matmul_enabled: Callable[[], bool], conv_enabled: Callable[[], bool]) -> None:
    """cpu target: route convolutions, linear and matmuls through the rounding when their switch is on (the NPU's
    allow_hf32, or for the CUDA stand-in torch.backends' allow_tf32, whose defaults match: matmul off, conv on)."""
    for name in CONV_FUNCTIONS:
        setattr(F, name, _rounding(getattr(F, name), conv_enabled))
    F.linear = _rounding(F.linear, matmul_enabled)
    for name in MATMUL_FUNCTIONS:
        setattr(torch, name, _rounding(getattr(torch, name), matmul_enabled))
        setattr(torch.Tensor, name, _rounding(getattr(torch.Tensor, name), matmul_enabled))
    torch.Tensor.__matmul__ = _rounding(torch.Tensor.__matmul__, matmul_enabled)


def set_cuda_tf32(kind: str, enabled: bool) -> None:
    """cuda target: the GPU's TF32 switch for `kind` ("matmul" or "conv")."""
    if kind == "matmul":
        torch.backends.cuda.matmul.allow_tf32 = enabled
    else:
        torch.backends.cudnn.allow_tf32 = enabled
