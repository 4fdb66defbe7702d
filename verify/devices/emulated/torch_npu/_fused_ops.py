"""torch_npu.npu_* fused operators on the emulated NPU: a few, as plain torch math from the documented formulas.

Each computes in float32 and returns the input's dtype, so it matches the real kernel's math, not its rounding.
Any other npu_* name exists (so `hasattr` answers as on the NPU) but raises NotImplementedError when called.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from npu_port_emulation.target import EMULATION


def npu_format_cast(tensor: torch.Tensor, acl_format: int) -> torch.Tensor:
    """A storage-layout change on the NPU with no effect on values: the tensor itself."""
    return tensor


def npu_silu(tensor: torch.Tensor) -> torch.Tensor:
    return F.silu(tensor.float()).to(tensor.dtype)


def npu_swiglu(tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """swish(a) * b, with a and b the two halves of `tensor` along `dim`."""
    a, b = tensor.float().chunk(2, dim=dim)
    return (F.silu(a) * b).to(tensor.dtype)


def npu_rms_norm(tensor: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): RMS normalisation over gamma's trailing dimensions, and its reciprocal root mean square."""
    dims = tuple(range(-gamma.dim(), 0))
    x = tensor.float()
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return (x * rstd * gamma.float()).to(tensor.dtype), rstd


def npu_rotary_mul(
    tensor: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
    rotary_mode: str = "half",
    rotate: torch.Tensor | None = None,
) -> torch.Tensor:
    """r1 * x + r2 * rotated(x): rotated by the `rotate` matrix if given, else by half or interleaved pairs."""
    x = tensor.float()
    if rotate is not None:
        rotated = x @ rotate.float()
    elif rotary_mode == "half":
        first, second = x.chunk(2, dim=-1)
        rotated = torch.cat((-second, first), dim=-1)
    elif rotary_mode == "interleave":
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    else:
        raise ValueError(f"rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return (r1.float() * x + r2.float() * rotated).to(tensor.dtype)


SUPPORTED = {op.__name__: op for op in (npu_format_cast, npu_silu, npu_swiglu, npu_rms_norm, npu_rotary_mul)}


def unsupported(name: str) -> Callable:
    def not_emulated(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"torch_npu.{name} is not available on {EMULATION}; the emulation supports {', '.join(sorted(SUPPORTED))}"
        )

    not_emulated.__name__ = name
    return not_emulated
