"""npu-port's EMULATED torch_npu: a test double, not an Ascend NPU.

`verify` puts this package on the PYTHONPATH of the child process that runs a ported script when the real torch_npu
cannot run. Importing it maps the "npu" device and the torch.npu API onto the CPU (or a CUDA GPU), with the NPU's
mixed-precision numerics (float16 autocast with CUDA's op lists), and says so on stderr. Where the CPU has no kernel
that runs an op as the NPU does in float16/bfloat16 (nn.LSTM, GRU and RNN, which torch_npu runs as its own kernel;
a training RReLU), the op is computed in float32 from inputs rounded to that dtype and its outputs rounded to it
(autocast_policy.COMPUTED_IN_FLOAT32); the run's manifest names each op so computed. The package refuses to load
anywhere else: outside a process started with verify.devices.emulation_env(), or under any name but `torch_npu`.

What a script sees differently from a real NPU is listed in the docstrings of npu_port_emulation.patches (devices),
npu_port_emulation.device_api and npu (device API), npu_port_emulation.autocast_policy (numerics),
contrib.transfer_to_npu, optim and _fused_ops. npu_port_emulation, beside this package, is shared with the CUDA
stand-in.
"""

import sys

if __name__ != "torch_npu":
    raise ImportError("npu-port's emulated torch_npu is loaded only as `torch_npu` in a process started by `verify`")

from npu_port_emulation import target  # first: it refuses to load outside `verify` before torch is imported
from npu_port_emulation.target import EMULATION

import torch  # noqa: E402

torch.utils.rename_privateuse1_backend("npu")

from . import npu, optim  # noqa: E402,F401  (npu needs the "npu" device type to exist)
from ._fused_ops import SUPPORTED, unsupported  # noqa: E402
from npu_port_emulation.patches import (  # noqa: E402
    install_accelerator,
    install_amp_patches,
    install_device_index,
    install_device_patches,
    install_distributed_patches,
    install_privateuse1_hooks,
)

EMULATED = True
EMULATED_ON = target.TARGET
__version__ = f"{torch.__version__.split('+')[0]}+emulated"

torch._register_device_module("npu", npu)
install_privateuse1_hooks("npu")
install_device_index("npu")  # a torch without the hooks' binding: torch.device(0) is still npu:0
target.redirected_types.add("npu")
install_device_patches("npu")
install_amp_patches()
install_distributed_patches("npu")
# torch.accelerator asks the PrivateUse1 backend's C++ device guard too, which this Python stand-in has none of (a
# DataLoader's pin-memory thread asks for the device index; the hooks above only say the device is there).
install_accelerator("npu", npu)
if EMULATED_ON == "cpu":
    from npu_port_emulation.autocast_policy import install_npu_autocast_policy

    _autocast_policy_library = install_npu_autocast_policy()
from npu_port_emulation import device_api, device_errors, device_numerics  # noqa: E402

device_numerics.install("NPU", device_api.GENERATOR)  # its own summation order and generator
globals().update(SUPPORTED)


def __getattr__(name: str) -> object:
    if name.startswith("npu_"):
        return unsupported(name)
    raise device_errors.as_the_device(AttributeError(f"module 'torch_npu' has no attribute {name!r} ({EMULATION})"))


print(f"npu-port: EMULATED NPU on {EMULATED_ON} - a test double, not an Ascend NPU", file=sys.stderr)
