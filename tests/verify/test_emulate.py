"""The emulated NPU: small ported scripts train on it in child processes; the real torch_npu is probed honestly."""

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from free_ports import free_port

from verify import devices
from verify.devices import NpuProbe, emulation_env, probe_torch_npu
from verify.errors import EmulationError

STAND_IN_PACKAGE = devices.STAND_IN_DIR / "torch_npu"

# A script as `migrate` ports it in transfer mode: the CUDA code stays, two imports send it to the NPU.
TRANSFER_MODE_CNN = """
import json, math, os
import torch, torch.nn as nn, torch.nn.functional as F
import torch_npu
from torch_npu.contrib import transfer_to_npu
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["TEST_PORT"])
dist.init_process_group("nccl", rank=0, world_size=1)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))

torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(Net().cuda(), device_ids=[0])
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("npu")
losses, dtypes = [], {}
for step in range(3):
    images = torch.randn(8, 3, 8, 8, device="cuda")
    labels = torch.randint(0, 10, (8,)).cuda()
    with torch.autocast("npu", dtype=torch.float16):
        logits = model(images)
        log_probs = F.log_softmax(logits, dim=1)
        loss = F.nll_loss(log_probs, labels)
    dtypes.update(logits=str(logits.dtype), log_softmax=str(log_probs.dtype), loss=str(loss.dtype))
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
print("RESULT", json.dumps({
    "losses": losses, "dtypes": dtypes, "backend": dist.get_backend(), "is_cuda": images.is_cuda,
    "cuda_available": torch.cuda.is_available(), "emulated": torch_npu.EMULATED, "on": torch_npu.EMULATED_ON,
}))
dist.destroy_process_group()
"""

# A script as `migrate` ports it in explicit mode: npu devices and the torch.npu API, no transfer_to_npu.
EXPLICIT_MODE_MLP = """
import io, json
import torch, torch.nn as nn, torch.nn.functional as F
import torch_npu

device = torch.device("npu", 0)
torch.npu.set_device(device)
torch.npu.manual_seed_all(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
optimizer = torch_npu.optim.NpuFusedAdam(model.parameters(), lr=1e-2)
scaler = torch_npu.npu.amp.GradScaler()
data = torch.utils.data.TensorDataset(torch.randn(24, 8), torch.randint(0, 4, (24,)))
losses = []
for inputs, labels in torch.utils.data.DataLoader(data, batch_size=8, pin_memory=True):
    inputs, labels = inputs.to("npu:0", non_blocking=True), labels.npu()
    with torch.amp.autocast("npu"):
        hidden = model[0](inputs)
        loss = F.cross_entropy(model(inputs), labels)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    torch.npu.synchronize()
    losses.append(loss.item())

checkpoint = io.BytesIO()
torch.save(model.state_dict(), checkpoint)
checkpoint.seek(0)
restored = torch.load(checkpoint, map_location="npu:0", weights_only=True)

def error_of(call):
    try:
        call()
    except Exception as error:
        return type(error).__name__ + ": " + str(error)
    return ""

print("RESULT", json.dumps({
    "losses": losses, "hidden_dtype": str(hidden.dtype), "optimizer": type(optimizer).__name__,
    "is_npu": inputs.is_npu, "tensor_device": str(inputs.device), "npu_device_type": device.type,
    "restored_device": str(next(iter(restored.values())).device), "device_name": torch.npu.get_device_name(0),
    "rms_norm_shape": list(torch_npu.npu_rms_norm(torch.randn(2, 8), torch.ones(8))[0].shape),
    "fused_attention": error_of(lambda: torch_npu.npu_fusion_attention(inputs)),
    "lamb": error_of(lambda: torch_npu.optim.NpuFusedLamb(model.parameters())),
    "cuda_scaler_state": error_of(lambda: scaler.load_state_dict(torch.amp.GradScaler("cpu").state_dict())),
    "missing_npu": error_of(lambda: torch.zeros(1, device="npu:1")),
}))
"""

# binary_cross_entropy under the emulated NPU's autocast, and after it as AMP101 ports a BCELoss step; CUDA
# autocast's own refusal (its kernel runs on any tensors, so the CPU build can call it) is the reference.
BCE_UNDER_AUTOCAST = """
import json
import torch, torch.nn as nn
import torch_npu

def error_of(call):
    try:
        call()
    except RuntimeError as error:
        return str(error)
    return ""

model = nn.Sequential(nn.Linear(4, 1), nn.Sigmoid()).npu()
inputs, target = torch.randn(8, 4).npu(), torch.rand(8, 1).npu()
criterion = nn.BCELoss()
with torch.autocast("npu", dtype=torch.float16):
    output = model(inputs)
    under_autocast = error_of(lambda: criterion(output.float(), target))
loss = criterion(output.float(), target.float())
loss.backward()
cuda_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCUDA)
print("RESULT", json.dumps({
    "under_autocast": under_autocast, "output_dtype": str(output.dtype), "loss": loss.item(),
    "grad_dtype": str(model[0].weight.grad.dtype),
    "cuda": error_of(lambda: torch.ops.aten.binary_cross_entropy.default.redispatch(cuda_autocast, target, target)),
}))
"""


def run_emulated(script: str, tmp_path, **extra_env: str) -> tuple[dict, str]:
    path = tmp_path / "train_npu.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, **emulation_env("cpu"), **extra_env}
    done = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(result.removeprefix("RESULT ")), done.stderr


@pytest.mark.slow
def test_transfer_mode_cnn_trains_with_fp16_autocast_and_hccl(tmp_path):
    result, stderr = run_emulated(TRANSFER_MODE_CNN, tmp_path, TEST_PORT=free_port())

    assert len(result["losses"]) == 3 and all(math.isfinite(loss) for loss in result["losses"])
    # conv/linear in fp16 as on the NPU; log_softmax and the loss in fp32 as NPU (and CUDA) autocast does them
    assert result["dtypes"] == {"logits": "torch.float16", "log_softmax": "torch.float32", "loss": "torch.float32"}
    assert result["backend"] == "hccl"
    assert result["is_cuda"] and result["cuda_available"]
    assert result["emulated"] is True and result["on"] == "cpu"
    assert "npu-port: EMULATED NPU on cpu - a test double, not an Ascend NPU" in stderr


@pytest.mark.slow
def test_explicit_mode_mlp_trains_and_unemulated_features_fail_clearly(tmp_path):
    result, _ = run_emulated(EXPLICIT_MODE_MLP, tmp_path)

    assert len(result["losses"]) == 3 and all(math.isfinite(loss) for loss in result["losses"])
    assert result["hidden_dtype"] == "torch.float16"
    assert result["optimizer"] == "NpuFusedAdam"
    assert result["is_npu"] and result["tensor_device"] == "cpu" and result["npu_device_type"] == "npu"
    assert result["restored_device"] == "cpu"
    assert result["device_name"] == "Emulated NPU (CPU)"
    assert result["rms_norm_shape"] == [2, 8]
    assert result["fused_attention"].startswith("NotImplementedError: torch_npu.npu_fusion_attention")
    assert "emulated NPU" in result["fused_attention"] and "not emulated" in result["lamb"]
    assert result["cuda_scaler_state"].startswith("KeyError") and "'dynamic'" in result["cuda_scaler_state"]
    assert "npu:1 does not exist" in result["missing_npu"]


@pytest.mark.slow
def test_autocast_refuses_binary_cross_entropy_as_cuda_and_npu_do_and_the_float32_loss_after_it_trains(tmp_path):
    result, _ = run_emulated(BCE_UNDER_AUTOCAST, tmp_path)

    assert "unsafe to autocast" in result["cuda"]
    assert result["under_autocast"].splitlines()[0] == result["cuda"].splitlines()[0]
    assert result["output_dtype"] == "torch.float16"
    assert math.isfinite(result["loss"]) and result["grad_dtype"] == "torch.float32"
def test_the_stand_in_refuses_to_load_without_the_emulation_env(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(devices.STAND_IN_DIR)}
    env.pop(devices.EMULATE_ON_VAR, None)
    done = subprocess.run(
        [sys.executable, "-c", "import torch_npu"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "a test double" in done.stderr


def test_this_process_cannot_import_torch_npu():
    emulation_env("cpu")  # computing the environment changes nothing here
    assert importlib.util.find_spec("torch_npu") is None
    with pytest.raises(ImportError, match="only as `torch_npu`"):
        importlib.import_module("verify.devices.emulated.torch_npu")


def test_emulation_env_puts_the_stand_in_first_and_names_the_target(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/somewhere{os.pathsep}{devices.STAND_IN_DIR}")
    env = emulation_env("cpu")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(devices.STAND_IN_DIR), "/somewhere"]
    assert env[devices.EMULATE_ON_VAR] == "cpu"
    assert env["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0"


def test_emulation_env_rejects_unknown_targets():
    with pytest.raises(EmulationError, match="choose one of cpu, cuda"):
        emulation_env("npu")


def test_parent_and_stand_in_name_the_same_variables():
    tree = ast.parse((devices.STAND_IN_DIR / "npu_port_emulation" / "target.py").read_text())
    names = ("EMULATE_ON_VAR", "DEVICE_COUNT_VAR")
    assigned = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names
    }
    assert assigned == {name: getattr(devices, name) for name in names}


def test_probe_reports_torch_npu_not_installed():
    assert probe_torch_npu() == NpuProbe(available=False, version="", reason="torch_npu is not installed")


@pytest.mark.slow
def test_probe_reports_why_an_installed_torch_npu_cannot_load(tmp_path, monkeypatch):
    # A test double of torch_npu 2.13.0 installed without CANN: registered for torch's backend autoload, as the real
    # wheel is, so `import torch` itself fails first; only the retry with autoload off shows the cause.
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('libascendcl.so: cannot open shared object file: No such file or directory')\n"
    )
    metadata = tmp_path / "torch_npu-2.13.0.dist-info"
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: torch_npu\nVersion: 2.13.0\n")
    (metadata / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))

    probe = probe_torch_npu()

    assert probe == NpuProbe(
        available=False,
        version="2.13.0",
        reason="torch_npu 2.13.0 is installed but cannot load: "
        "ImportError: libascendcl.so: cannot open shared object file: No such file or directory",
    )


def test_the_emulations_on_the_cpu_present_one_device_a_rank(tmp_path):
    """verify launches N ranks with one emulated device each: set_device(local_rank) works, device_count() is N."""
    script = """
    import json
    import torch, torch_npu
    torch.npu.set_device(1)
    try:
        torch.zeros(1, device="npu:2")
        missing = ""
    except RuntimeError as error:
        missing = str(error)
    print("RESULT", json.dumps({"count": torch.npu.device_count(), "current": torch.npu.current_device(),
                                "missing": missing}))
    """
    result, _ = run_emulated(script, tmp_path, **{devices.DEVICE_COUNT_VAR: "2"})
    assert result["count"] == 2 and result["current"] == 1
    assert "npu:2 does not exist" in result["missing"] and "2 device(s)" in result["missing"]


def test_child_env_tells_the_emulations_how_many_devices_to_present():
    assert devices.child_env("emulated-npu", "cpu", device_count=4)[devices.DEVICE_COUNT_VAR] == "4"
    assert devices.child_env("emulated-cuda", "cpu", device_count=2)[devices.DEVICE_COUNT_VAR] == "2"
    assert devices.child_env("emulated-cuda", "cpu")[devices.DEVICE_COUNT_VAR] == "1"


def test_the_npus_default_process_group_backend_is_hccl_as_torch_npu_registers_it(tmp_path):
    """pytorch/examples' minGPT-ddp asks torch for the accelerator's default backend
    (`get_default_backend_for_device(f"{torch.accelerator.current_accelerator()}:{rank}")`); on the emulated NPU
    that raised 'Default backend not registered for device : npu:0', where torch_npu registers hccl for npu."""
    result, _ = run_emulated("""
        import json
        import torch, torch_npu
        import torch.distributed as dist
        asked = getattr(dist, "get_default_backend_for_device", None)  # torch 2.6 and newer
        print("RESULT " + json.dumps({"backend": asked and asked(torch.device("npu:0"))}))
    """, tmp_path)
    if result["backend"] is None:
        pytest.skip("this torch has no get_default_backend_for_device (torch 2.6 and newer have)")
    assert result["backend"] == "hccl"


def test_the_device_capability_is_none_unless_torch_npu_device_capability_sets_it_as_on_the_npu(tmp_path):
    """torch_npu answers get_device_capability() with None (and a warning) unless TORCH_NPU_DEVICE_CAPABILITY is
    "major.minor", read at each call; migrate's DEV021 sets it for Lightning, which unpacks the answer."""
    script = """
    import json, os, warnings
    import torch, torch_npu
    from torch_npu.contrib import transfer_to_npu
    answers = {}
    for value in ("", "8.0", "9.x"):
        os.environ["TORCH_NPU_DEVICE_CAPABILITY"] = value
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answers[value] = [torch.cuda.get_device_capability(0), len(caught)]
    print("RESULT", json.dumps(answers))
    """
    result, _ = run_emulated(script, tmp_path)
    assert {value: answer for value, (answer, _) in result.items()} == {"": None, "8.0": [8, 0], "9.x": None}
    assert result[""][1] == 1  # the warning that names the variable


def test_a_device_named_by_its_index_is_the_emulated_gpu_and_pickles_as_torch_device(tmp_path):
    """`torch.device(torch.cuda.current_device())` (and transformers' device_map="auto", which names devices by
    index) asks torch for the current accelerator: under EMULATED CUDA, on a CPU build with no CUDA hooks, that stopped
    with 'Cannot access accelerator device when none is available'. A device still pickles as torch.device, so a
    checkpoint saved in the run loads in a plain process."""
    from typer.testing import CliRunner

    from verify.cli import app

    script = tmp_path / "project" / "by_index.py"  # saved.pt outside the script's folder: not the run's own copy
    script.parent.mkdir()
    script.write_text(textwrap.dedent("""
        import sys
        import torch
        device = torch.device(torch.cuda.current_device())
        assert isinstance(device, torch.device) and issubclass(type(device), torch.device)
        torch.save({"device": device, "weights": torch.ones(2, device=device)}, sys.argv[1])
        print("DEVICE", device, flush=True)
        layer = torch.nn.Linear(2, 1).to(device)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            layer(torch.ones(3, 2, device=device)).sum().backward()
            optimizer.step()
    """))
    saved = tmp_path / "saved.pt"
    result = CliRunner().invoke(app, ["run", str(script), "--device", "emulated-cuda", "--steps", "2", "-o",
                                      str(tmp_path / "run"), "--", str(saved)])
    assert result.exit_code == 0, result.output
    assert "DEVICE cuda:0" in (tmp_path / "run" / "output.log").read_text()
    done = subprocess.run([sys.executable, "-c", f"import torch; print(torch.load({str(saved)!r})['device'])"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "cuda:0", done.stderr[-2000:]
