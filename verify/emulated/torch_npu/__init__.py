"""npu-port's EMULATED torch_npu: a test double, not an Ascend NPU.

`verify` puts this package on the PYTHONPATH of the child process that runs a ported script when the real torch_npu
cannot run. Importing it maps the "npu" device and the torch.npu API onto the CPU (or a CUDA GPU), with the NPU's
mixed-precision numerics (float16 autocast with CUDA's op lists), and says so on stderr. It refuses to load anywhere
else: outside a process started with verify.emulate.emulation_env(), or under any name but `torch_npu`.

What a script sees differently from a real NPU is listed in the docstrings of _patches (devices), npu (device API),
_autocast_policy (numerics), contrib.transfer_to_npu, optim and _fused_ops.
"""

import sys

if __name__ != "torch_npu":
    raise ImportError("npu-port's emulated torch_npu is loaded only as `torch_npu` in a process started by `verify`")

from . import _target  # first: it refuses to load outside `verify` before torch is imported
from ._target import EMULATION

import torch  # noqa: E402

torch.utils.rename_privateuse1_backend("npu")

from . import npu, optim  # noqa: E402,F401  (npu needs the "npu" device type to exist)
from ._fused_ops import SUPPORTED, unsupported  # noqa: E402
from ._patches import install_amp_patches, install_device_patches, install_distributed_patches  # noqa: E402

EMULATED = True
EMULATED_ON = _target.TARGET
__version__ = f"{torch.__version__.split('+')[0]}+emulated"

torch._register_device_module("npu", npu)
install_device_patches()
install_amp_patches()
install_distributed_patches()
if EMULATED_ON == "cpu":
    from ._autocast_policy import install_npu_autocast_policy

    _autocast_policy_library = install_npu_autocast_policy()
    # torch.accelerator asks the PrivateUse1 backend's C++ hooks, which this Python stand-in has none of; on the cpu
    # target the npu is the only accelerator torch sees (a DataLoader's pin-memory thread asks for its index).
    torch.accelerator.current_device_index = npu.current_device
    torch.accelerator.set_device_index = npu.set_device
globals().update(SUPPORTED)


def __getattr__(name: str) -> object:
    if name.startswith("npu_"):
        return unsupported(name)
    raise AttributeError(f"module 'torch_npu' has no attribute {name!r} ({EMULATION})")


print(f"npu-port: EMULATED NPU on {EMULATED_ON} - a test double, not an Ascend NPU", file=sys.stderr)
