"""A port whose device kernel of one op computes off by a factor, the graph, names and settings unchanged (issue 45):
the script registers its own CPU implementation of the op (torch.library), where the emulated NPU computes. The
capture records the op as it dispatched (aten.relu), and the kernel's own ops run below it, unrecorded."""

import re

# Per op, its kernel computed by other ops (the op's own would call the override again), times {factor}.
KERNELS = {
    "relu": "lambda x: _kernels.clamp_min(x, 0) * {factor}",
    "relu_": "lambda x: x.clamp_min_(0).mul_({factor})",
    "gelu": "lambda x, approximate='none': x * 0.5 * (1 + _kernels.erf(x * 0.5 ** 0.5)) * {factor}",
    "tanh": "lambda x: (2 * _kernels.sigmoid(2 * x) - 1) * {factor}",
    "sigmoid": "lambda x: _kernels.reciprocal(1 + _kernels.exp(-x)) * {factor}",
    "silu": "lambda x: x * _kernels.sigmoid(x) * {factor}",
}
# The factor from the kernel's call number `from_call` on (the calls before compute exactly): a kernel off only in
# later steps, where a chaotic reference differs from itself far more than the kernel's error.
FROM_CALL = ("_kernels_calls = [0]\n"
             "def _kernels_factor():\n"
             "    _kernels_calls[0] += 1\n"
             "    return {factor} if _kernels_calls[0] > {from_call} else 1.0")


def kernel_off(code: str, op: str, factor: float, from_call: int = 0) -> str:
    """`code` with the CPU kernel of `op` (and of its in-place form, where KERNELS has one) computing `factor` times
    its result from its call `from_call` on, registered after the script's imports."""
    ops = [name for name in (op, f"{op}_") if name in KERNELS]
    scaled = "_kernels_factor()" if from_call else factor
    override = ["import torch as _kernels", '_kernels_off = _kernels.library.Library("aten", "IMPL")',
                *([FROM_CALL.format(factor=factor, from_call=from_call)] if from_call else []),
                *(f'_kernels_off.impl("{name}", {KERNELS[name].format(factor=scaled)}, "CPU")' for name in ops)]
    lines = code.splitlines(keepends=True)
    last_import = max(number for number, line in enumerate(lines) if re.match(r"(import|from) \w", line))
    return "".join(lines[:last_import + 1]) + "\n".join(override) + "\n" + "".join(lines[last_import + 1:])
