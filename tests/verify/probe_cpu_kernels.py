"""Which ops the CPU cannot run in float16 or bfloat16 where a GPU can: the probe behind the emulations'
COMPUTED_IN_FLOAT32 list (verify/devices/emulated/npu_port_emulation/autocast_policy.py).

    PYTHONPATH=. python tests/verify/probe_cpu_kernels.py      # needs `pip install expecttest` (torch's OpInfos)

Every op of torch's OpInfo database that CUDA runs in the dtype (which covers CUDA's and the CPU's autocast lists),
and every recurrent module, forward and backward, three ways: called with inputs in the reduced dtype (a `.half()`
model, or an op that receives an autocast op's output), under CPU autocast, and under CPU autocast with the
emulations' policy installed. Prints one line per failure; a run of torch 2.13 found, with the policy, only ops a
CPU can never run (jiterator, CUDA's flash and efficient attention) and the ban on binary_cross_entropy.
"""

from __future__ import annotations

import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_flatten

from test_device_kernels import RECURRENT_MODULES
from verify.devices import setup as device_setup

DTYPES = (torch.float16, torch.bfloat16)


def _outcome(run) -> str:
    """'' if `run()` (forward, then backward) passes, else where and why it failed."""
    try:
        outputs = [value for value in tree_flatten(run())[0]
                   if isinstance(value, torch.Tensor) and value.is_floating_point() and value.requires_grad]
    except Exception as error:  # noqa: BLE001 (a probe: every failure is the finding)
        return f"forward: {type(error).__name__}: {str(error).strip().splitlines()[0][:140]}"
    try:
        if outputs:
            sum(output.float().sum() for output in outputs).backward()
    except Exception as error:  # noqa: BLE001
        return f"backward: {type(error).__name__}: {str(error).strip().splitlines()[0][:140]}"
    return ""


def _opinfo_call(op, dtype: torch.dtype, way: str):
    input_dtype = dtype if way == "reduced inputs" else torch.float32
    grad = op.supports_autograd and dtype in op.supported_backward_dtypes("cuda")
    sample = next(iter(op.sample_inputs("cpu", input_dtype, requires_grad=grad)), None)
    if sample is None:
        return None

    def call():
        with torch.autocast("cpu", dtype=dtype, enabled=way != "reduced inputs"):
            return op(sample.input, *sample.args, **sample.kwargs)

    return call


def _module_call(make, name: str, dtype: torch.dtype, way: str):
    module = make()
    inputs = torch.randn(2, 5, 3) if "Cell" not in name else torch.randn(2, 3)
    if way == "reduced inputs":
        module, inputs = module.to(dtype), inputs.to(dtype)

    def call():
        with torch.autocast("cpu", dtype=dtype, enabled=way != "reduced inputs"):
            return module(inputs)

    return call


def probe(way: str) -> None:
    for dtype in DTYPES:
        calls = {f"{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}": _opinfo_call(op, dtype, way)
                 for op in op_db if dtype in op.supported_dtypes("cuda")}
        calls.update({f"nn.{name}": _module_call(make, name, dtype, way) for name, make in RECURRENT_MODULES.items()})
        for name, call in calls.items():
            if call is not None and (failure := _outcome(call)):
                print(f"{way:24} {str(dtype):16} {name:40} {failure}")


def main() -> None:
    warnings.simplefilter("ignore")
    probe("reduced inputs")
    probe("cpu autocast")
    library = device_setup.install_autocast_casts_on_cpu()
    probe("cpu autocast + policy")
    del library


if __name__ == "__main__":
    main()
