"""How the emulated devices, and a CPU reference under an imposed autocast, compute ops on half-precision tensors: as
the devices do, in one table, HALF_PRECISION.

An NPU's cube unit and a GPU's tensor cores take float16/bfloat16 inputs and accumulate in float32; reductions and
norms accumulate in float32 too; element-wise ops compute in the half dtype. The CPU's own half kernels for the
products are both slower (a 1024x1024 fp16 matmul: 2 s against 12 ms in fp32) and unlike the devices. So each op of
the table that is `IN_FLOAT32` is computed from its half inputs in float32 and its outputs are rounded to the half
dtype (device_numerics.DeviceNumerics: with the face's modelled summation order where it models one); `CPU_KERNEL`
ops already do so in the CPU's kernel (opmath), and run as given; `WHOLE_IN_FLOAT32` ops have no CPU kernel in the
half dtype and are computed whole in float32 at autocast's dispatch key (autocast_policy.py). An op the table does
not name computes in the dtype it is given, as a device's element-wise ops do.

The run's manifest names the table (TABLE_NAME) and the ops a run computed by it (manifest.half_precision).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

TABLE_NAME = "npu_port_emulation/half_precision.py HALF_PRECISION"


class Computed(enum.Enum):
    IN_FLOAT32 = "its half inputs computed in float32, its outputs rounded to the half dtype"
    CPU_KERNEL = "the CPU's kernel accumulates its half inputs in float32 and rounds its outputs: run as given"
    WHOLE_IN_FLOAT32 = ("computed whole in float32 from inputs rounded to the device's dtype, its outputs rounded "
                        "(the CPU has no kernel for it in that dtype)")


class HalfCompute(NamedTuple):
    computed: Computed
    why: str
    rounded_outputs: tuple[int, ...] | None = None  # IN_FLOAT32: the outputs rounded to the half dtype (None: all)
    in_autocast_dtype: bool = False  # WHOLE_IN_FLOAT32: the device runs it in autocast's dtype, else in the one it gets


_PRODUCT = "matrix units (cube unit, tensor cores) multiply half inputs and accumulate in float32"
_MODELLED_PRODUCT = _PRODUCT + "; summed as the face's partial products (device_numerics)"
_REDUCTION = "a device's reductions accumulate in float32; summed as the face's partial sums (device_numerics)"
_ATTENTION = "flash attention multiplies half inputs and accumulates in float32; its logsumexp stays float32"
_NORM = "norms reduce in float32"
_RECURRENT = (
    "a GPU runs the whole recurrent layer as one kernel in the autocast dtype (CUDA autocast casts cuDNN's "
    "_cudnn_rnn), as torch_npu's own kernel does on the NPU; on the CPU a float16 LSTM has no oneDNN primitive, and a "
    "GRU under autocast computes partly in float32 and returns float32"
)

# By aten op name (every overload but out= variants and in-place ones).
HALF_PRECISION: dict[str, HalfCompute] = {
    **{name: HalfCompute(Computed.IN_FLOAT32, _MODELLED_PRODUCT) for name in ("mm", "bmm", "addmm", "baddbmm")},
    "convolution": HalfCompute(Computed.IN_FLOAT32, _MODELLED_PRODUCT + " over the input channels (groups=1)"),
    "convolution_backward": HalfCompute(Computed.IN_FLOAT32, _PRODUCT),
    **{name: HalfCompute(Computed.IN_FLOAT32, _PRODUCT) for name in ("mv", "addmv", "dot")},
    "_scaled_dot_product_flash_attention_for_cpu": HalfCompute(Computed.IN_FLOAT32, _ATTENTION, rounded_outputs=(0,)),
    "_scaled_dot_product_flash_attention_for_cpu_backward": HalfCompute(Computed.IN_FLOAT32, _ATTENTION),
    **{name: HalfCompute(Computed.IN_FLOAT32, _REDUCTION) for name in ("sum", "mean")},
    **{name: HalfCompute(Computed.CPU_KERNEL, _NORM) for name in (
        "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
        "native_batch_norm_backward", "native_layer_norm", "native_layer_norm_backward", "native_group_norm",
        "native_group_norm_backward")},
    **{name: HalfCompute(Computed.WHOLE_IN_FLOAT32, _RECURRENT, in_autocast_dtype=True)
       for name in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
    "rrelu": HalfCompute(Computed.WHOLE_IN_FLOAT32, "the CPU's rrelu_with_noise has no float16 kernel (RReLU in "
                                                    "training, after an autocast linear)"),
}


def computed_so(computed: Computed) -> dict[str, HalfCompute]:
    """The rows of the table computed as `computed` says."""
    return {name: row for name, row in HALF_PRECISION.items() if row.computed is computed}


_computed: set[str] = set()  # the ops of the table this process computed from half inputs


def computed(name: str) -> None:
    """Notes that this process computed aten `name`, an op of the table, from half inputs."""
    _computed.add(name)


def record() -> dict[str, Any]:
    """The manifest's half_precision: the table this process computes half precision by, and how it computed each
    op of it that it ran on half inputs."""
    return {"table": TABLE_NAME, "computed": {name: HALF_PRECISION[name].computed.value for name in sorted(_computed)}}
