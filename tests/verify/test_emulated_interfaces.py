"""The emulations' stand-ins pass the checks torch itself makes of a device, on whichever torch is installed (CI runs
this file on the lowest and the newest torch pyproject.toml allows): torch._dynamo's DeviceInterface takes their Event
and Stream (torch 2.4 asserts they subclass torch._streambase's bases), and an optimizer's graph-capture health check
asks them, never the real CUDA runtime (torch 2.9 called it, "CUDA driver version is insufficient", on a CUDA build of
torch without a GPU). Each face runs in a child process, as under `verify`; the NPU's with transfer_to_npu, so that
torch.cuda answers as the NPU."""

import json
import os
import subprocess
import sys

import pytest

from verify import devices

PROBE = """
import json, sys
import torch
from verify.devices.setup import prepare

prepare(sys.argv[1])
if sys.argv[1] == "emulated-npu":
    from torch_npu.contrib import transfer_to_npu  # noqa: F401  (torch.cuda answers as the emulated NPU)

# A CUDA build of torch on a machine without a GPU, on any build: torch takes its CUDA-build paths, and its CUDA
# runtime raises when called. Once an emulation says cuda is available, torch's own code must ask the emulation.
reached = []


def tripwire(name):
    def reach(*args, **kwargs):
        reached.append(name)
        raise RuntimeError(f"the real CUDA runtime was reached: {name}")
    return reach


torch.backends.cuda.is_built = lambda: True
runtime = {id(getattr(torch._C, name)): name for name in dir(torch._C) if name.startswith("_cuda_")}
for module in [module for name, module in sys.modules.items() if name.split(".")[0] == "torch"]:
    for name, value in list(vars(module).items()):  # torch._C itself, and the names torch.cuda imported from it
        if id(value) in runtime:
            setattr(module, name, tripwire(f"torch._C.{runtime[id(value)]}"))
torch.cuda._lazy_init = tripwire("torch.cuda._lazy_init")

steps = {}
for optimizer_class in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
    weight = torch.nn.Parameter(torch.ones(3, device="cuda"))
    optimizer = optimizer_class([weight], lr=0.1)
    weight.grad = torch.ones(3, device="cuda")
    try:
        optimizer.step()
        steps[optimizer_class.__name__] = weight.tolist()
    except RuntimeError as error:
        steps[optimizer_class.__name__] = str(error)

from torch._dynamo import device_interface  # an optimizer's step imports it on most torch versions

interface = device_interface.get_interface_for_device("cuda")
event = torch.cuda.Event(enable_timing=True)
event.record(torch.cuda.current_stream())
print("RESULT " + json.dumps({
    "steps": steps, "reached": reached,
    "interface_takes_the_stand_ins": [interface.Event is torch.cuda.Event, interface.Stream is torch.cuda.Stream],
    "event_done": event.query(),
}))
"""


def probed(device: str) -> dict:
    env = {**os.environ, **devices.child_env(device, devices.EmulateOn.CPU.value)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(devices.STAND_IN_DIR.parents[2])]))
    done = subprocess.run([sys.executable, "-c", PROBE, device], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.parametrize("device", ["emulated-npu", "emulated-cuda"])
def test_optimizers_and_torchs_device_interface_take_the_stand_ins_and_never_the_cuda_runtime(device):
    result = probed(device)

    assert result["reached"] == []
    assert result["steps"]["SGD"] == pytest.approx([0.9] * 3)
    assert result["steps"]["Adam"] == pytest.approx([0.9] * 3)
    assert result["steps"]["AdamW"] == pytest.approx([0.899] * 3)  # its weight decay (0.01) first
    assert result["interface_takes_the_stand_ins"] == [True, True]
    assert result["event_done"] is True
