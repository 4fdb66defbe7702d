"""NPU autocast numerics on the CPU.

CPU autocast runs convolutions and matrix products in the low-precision dtype, as the NPU does, but leaves most
other ops in whatever dtype arrives: a softmax, layer_norm or sum after an fp16 linear stays fp16 on the CPU, while
CUDA autocast (whose op lists the NPU's follow) computes them in float32. This module registers, for the CPU autocast
dispatch key, the float32 and low-precision casts of the CUDA op lists (torch 2.13, aten/src/ATen/autocast_mode.h)
on the ops that CPU autocast does not already handle. The CUDA target needs none of this: it has CUDA autocast.

CUDA autocast also bans ops outright: binary_cross_entropy raises "unsafe to autocast" whatever its input dtypes
(torch_npu's autocast registers the same refusal), where CPU autocast would run it in float32. The emulated NPU
raises as they do, so that a port computing BCELoss under autocast fails here as it would on the NPU.

Where the CPU has no kernel for an op in the dtype the device runs it in, or its kernel computes something else, the
op is computed in float32 from inputs rounded to the device's dtype, and its outputs are rounded to that dtype
(COMPUTED_IN_FLOAT32: the rows of half_precision.HALF_PRECISION computed whole in float32): the device's values up to
accumulation order, with autograd recording the casts and the float32 op, so that backward runs through it.
`computed_in_float32()` names the ops a process computed so (the run's manifest lists them). The ops were found by tests/verify/probe_cpu_kernels.py, over torch's OpInfo database and the
recurrent modules, forward and backward, in float16 and bfloat16.

Differences that remain: CUDA's "promote" list (addcmul, index_put, ...) is left to CPU autocast's own handling, and
so are the ops that only CPU autocast computes in float32 (avg_pool3d, the fft_* ops, reflection and replication
padding, ...), which a device under autocast runs in the dtype they receive.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten, tree_map

from . import half_precision
from .half_precision import Computed, HalfCompute, computed_so
from .device_errors import as_the_device

# CUDA autocast's float32 list: (op, overloads); no overloads means every overload that is not an out= variant.
FLOAT32_OPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (name, ())
    for name in (
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
        "sinh", "tan", "softplus", "layer_norm", "native_layer_norm", "group_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
        "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
        "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
        "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
        "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
        "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum",
    )
) + (
    ("pow", ("Tensor_Scalar", "Tensor_Tensor", "Scalar")),
    ("frobenius_norm", ("dim",)),
    ("norm", ("Scalar", "ScalarOpt_dim", "names_ScalarOpt_dim")),
)

# CUDA autocast's low-precision list.
LOW_PRECISION_OPS: tuple[tuple[str, tuple[str, ...]], ...] = tuple(
    (name, ())
    for name in (
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d", "conv_transpose2d",
        "conv_transpose3d", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv",
        "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
        "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
        "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    )
)

# CUDA autocast's banned ops (the NPU's too), with the advice their refusal gives.
BANNED_OPS: dict[str, str] = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer. In this case, combine the two "
        "layers using torch.nn.functional.binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss, which are "
        "safe to autocast. (Raised by npu-port's emulated NPU, as CUDA and NPU autocast raise it.)"
    ),
}


# The ops computed whole in float32 and rounded (see the module docstring): the rows of the one table of how half
# precision is computed that are computed so.
COMPUTED_IN_FLOAT32: dict[str, HalfCompute] = computed_so(Computed.WHOLE_IN_FLOAT32)

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
_REDUCED = (torch.float16, torch.bfloat16)


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in _REDUCED:
        return value.float()
    return value


def _to_low_precision(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in (torch.float32, *_REDUCED):
        return value.to(torch.get_autocast_dtype("cpu"))
    return value


def _casting_kernel(op: torch._ops.OpOverload, cast: Callable[[Any], Any]) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = tree_map(cast, (args, kwargs))
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            return op(*args, **kwargs)

    return kernel


_computed_in_float32: set[str] = set()  # what this process computed so, for computed_in_float32()


def _rounded_to(dtype: torch.dtype) -> Callable[[Any], Any]:
    def round_value(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in (torch.float32, *_REDUCED):
            return value.to(dtype)
        return value

    return round_value


def _device_dtype(how: HalfCompute, args: Any, kwargs: Any) -> torch.dtype | None:
    """The dtype the device computes the op in: autocast's, or the one its floating inputs promote to (None: none)."""
    if how.in_autocast_dtype:
        return torch.get_autocast_dtype("cpu")
    dtypes = [value.dtype for value in tree_flatten((args, kwargs))[0]
              if isinstance(value, torch.Tensor) and value.is_floating_point()]
    return functools.reduce(torch.promote_types, dtypes) if dtypes else None


def _float32_kernel(op: torch._ops.OpOverload, how: HalfCompute) -> Callable:
    """`op` as the device computes it in a reduced dtype, but in float32 from the rounded inputs, rounded back."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = _device_dtype(how, args, kwargs)
        reduced = dtype in _REDUCED
        if reduced:
            args, kwargs = tree_map(lambda value: _to_float32(_rounded_to(dtype)(value)), (args, kwargs))
            _computed_in_float32.add(op.name())
            half_precision.computed(op._overloadpacket.__name__)
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            outputs = op(*args, **kwargs)
        return tree_map(_rounded_to(dtype), outputs) if reduced else outputs

    return kernel


def computed_in_float32() -> list[str]:
    """The aten ops (with their overload) this process computed in float32 and rounded, by COMPUTED_IN_FLOAT32."""
    return sorted(_computed_in_float32)


def _dispatched_overloads(name: str, chosen: tuple[str, ...], dispatched: set[str]) -> list[torch._ops.OpOverload]:
    """The overloads of aten `name` (those `chosen`, or all but out= variants) that the dispatcher runs: this
    leaves out TorchScript-only overloads (acos.int) and ops this torch does not have."""
    packet = getattr(torch.ops.aten, name, None)
    names = chosen or [overload for overload in getattr(packet, "overloads", list)() if "out" not in overload]
    qualified = {overload: f"aten::{name}" + ("" if overload == "default" else f".{overload}") for overload in names}
    return [getattr(packet, overload) for overload, op_name in qualified.items() if op_name in dispatched]


def _register(library: torch.library.Library, ops: tuple, cast: Callable[[Any], Any]) -> None:
    dispatched = set(torch._C._dispatch_get_all_op_names())
    for name, chosen in ops:
        for op in _dispatched_overloads(name, chosen, dispatched):
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "AutocastCPU"):  # else CPU has a policy
                library.impl(op, _casting_kernel(op, cast), "AutocastCPU")


def _register_over_cpu_policy(library: torch.library.Library, ops: dict[str, Any],
                              kernel_for: Callable[[torch._ops.OpOverload, Any], Callable]) -> None:
    """Registers `kernel_for(op, ops[name])` for every overload of each op, in place of CPU autocast's own policy
    where it has one."""
    dispatched = set(torch._C._dispatch_get_all_op_names())
    for name, how in ops.items():
        for op in _dispatched_overloads(name, (), dispatched):
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore", UserWarning)
                library.impl(op, kernel_for(op, how), "AutocastCPU")


def _refusing_kernel(op: torch._ops.OpOverload, message: str) -> Callable:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise as_the_device(RuntimeError(message))

    return kernel


def install_npu_autocast_policy() -> torch.library.Library:
    """Registers the casts, the bans and the float32 computations; the returned library must stay alive for them
    to stay registered."""
    library = torch.library.Library("aten", "IMPL")
    _register(library, FLOAT32_OPS, _to_float32)
    _register(library, LOW_PRECISION_OPS, _to_low_precision)
    _register_over_cpu_policy(library, BANNED_OPS, _refusing_kernel)
    _register_over_cpu_policy(library, COMPUTED_IN_FLOAT32, _float32_kernel)
    return library
