"""The emulated devices differ as devices do (verify/devices/emulated/npu_port_emulation/device_numerics.py): each face
sums its products and reductions in an order of its own and draws from a generator of its own, within float32's noise of
the CPU; `--exact-emulation` turns both off. Each face runs in a child process, as under `verify`."""

import ast
import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from verify import devices

FACES = {"emulated-npu": "npu", "emulated-cuda": "cuda"}

PROBE = """
import json, sys
import torch
import torch.nn.functional as F
from verify.devices.setup import prepare

prepare(sys.argv[1])
device = "npu" if sys.argv[1] == "emulated-npu" else "cuda"
generator = torch.Generator().manual_seed(0)
a, b = torch.randn(64, 4096, generator=generator), torch.randn(4096, 32, generator=generator)
values = torch.randn(1000, 300, generator=generator)
bias = torch.randn(32, generator=generator)
images, kernel = torch.randn(2, 12, 9, 9, generator=generator), torch.randn(5, 12, 3, 3, generator=generator)
torch.manual_seed(7)
drawn = torch.randn(6, device=device)
torch.manual_seed(7)
mask = F.dropout(torch.ones(2000), 0.5)
print("RESULT " + json.dumps({
    "mm": (a.to(device) @ b.to(device)).tolist(),
    "linear": F.linear(a, b.T.contiguous(), bias).tolist(),
    "half_mm": (a.half() @ b.half()).float().tolist(),
    "sum": values.sum(0).tolist(), "mean": values.mean().item(),
    "conv": F.conv2d(images, kernel).tolist(),
    "conv_transpose": F.conv_transpose2d(images, kernel.transpose(0, 1)).tolist(),
    "randn": drawn.tolist(), "dropout": mask.tolist(),
    # calls the faces leave to the CPU run as given (an integer sum with dim=None once lost its arguments)
    "int_sum": torch.arange(12).reshape(3, 4).sum(dim=None, keepdim=True).tolist(),
    "keepdim_mean": values.mean(dim=None, keepdim=True).tolist(),
}))
"""


def inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 4096, generator=generator), torch.randn(4096, 32, generator=generator)
    values, bias = torch.randn(1000, 300, generator=generator), torch.randn(32, generator=generator)
    images, kernel = torch.randn(2, 12, 9, 9, generator=generator), torch.randn(5, 12, 3, 3, generator=generator)
    return {"a": a, "b": b, "values": values, "bias": bias, "images": images, "kernel": kernel}


def on_the_cpu() -> dict[str, torch.Tensor]:
    """What the CPU computes and draws, in this process, with one thread as the children (a sum's order depends on
    the thread count)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _computed_here()
    finally:
        torch.set_num_threads(threads)


def half_as_devices(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a.half() @ b.half() as the devices compute it (half_precision.HALF_PRECISION), in the CPU's order: the half
    inputs multiplied in float32, the result rounded to float16 (returned as float32)."""
    return (a.half().float() @ b.half().float()).half().float()


def _computed_here() -> dict[str, torch.Tensor]:
    given = inputs()
    torch.manual_seed(7)
    drawn = torch.randn(6)
    torch.manual_seed(7)
    mask = F.dropout(torch.ones(2000), 0.5)
    return {"mm": given["a"] @ given["b"], "linear": F.linear(given["a"], given["b"].T.contiguous(), given["bias"]),
            "half_mm": half_as_devices(given["a"], given["b"]), "sum": given["values"].sum(0),
            "mean": given["values"].mean(), "randn": drawn, "dropout": mask,
            "conv": F.conv2d(given["images"], given["kernel"]),
            "conv_transpose": F.conv_transpose2d(given["images"], given["kernel"].transpose(0, 1)),
            "int_sum": torch.arange(12).reshape(3, 4).sum(dim=None, keepdim=True),
            "keepdim_mean": given["values"].mean(dim=None, keepdim=True)}


def computed_on(device: str, exact: bool = False, blocks: int = 0, probe: str = PROBE) -> dict[str, torch.Tensor]:
    env = {**os.environ, **devices.child_env(device, devices.EmulateOn.CPU.value, exact_emulation=exact),
           **({devices.BLOCKS_VAR: str(blocks)} if blocks else {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(devices.STAND_IN_DIR.parents[1])]))
    # One thread, always: the module's `faces` are made before the autouse fixture sets it for the test, and a matrix
    # product sums in another order on two threads than on one (the faces then differed by a last bit)
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-c", probe, device], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    return {name: torch.tensor(value) for name, value in result.items()}


@pytest.fixture(scope="module")
def faces() -> dict[str, dict[str, torch.Tensor]]:
    return {device: computed_on(device) for device in FACES}


# float16 keeps 11 bits: one rounding flips at 5e-4; convolutions also round their fp32 inputs to TF32/HF32 (on by
# default on both devices), 10 bits
TOLERANCES = {"half_mm": 2e-3, "conv": 5e-3, "conv_transpose": 5e-3}


@pytest.mark.parametrize("name", ["mm", "linear", "half_mm", "sum", "mean", "conv", "conv_transpose"])
def test_each_face_sums_in_its_own_order_within_the_noise_of_the_cpu(faces, name):
    cpu, npu, cuda = on_the_cpu()[name], faces["emulated-npu"][name], faces["emulated-cuda"][name]
    assert not torch.equal(npu, cpu) and not torch.equal(cuda, cpu) and not torch.equal(npu, cuda)
    tolerance = TOLERANCES.get(name, 1e-5)
    for face in (npu, cuda):
        assert torch.allclose(face, cpu, rtol=tolerance, atol=tolerance * cpu.abs().max().item())


def test_a_face_summing_in_the_other_faces_order_computes_its_numbers(faces):
    """A calibration run of the reference sums in the port's device's order (verify/pair/run.py): EMULATED CUDA given
    the emulated NPU's block count computes every modelled product and sum bit for bit as that NPU does."""
    in_npu_order = computed_on("emulated-cuda", blocks=devices.row("emulated-npu").summation_blocks)
    for name in ("mm", "linear", "half_mm", "sum", "mean", "conv", "conv_transpose"):
        assert torch.equal(in_npu_order[name], faces["emulated-npu"][name]), name
        assert not torch.equal(in_npu_order[name], faces["emulated-cuda"][name]), name


def test_calls_a_face_leaves_alone_run_as_given_and_shapes_follow_keepdim(faces):
    cpu = on_the_cpu()
    for device in FACES:
        assert torch.equal(faces[device]["int_sum"], cpu["int_sum"])
        assert faces[device]["keepdim_mean"].shape == cpu["keepdim_mean"].shape == (1, 1)
        assert torch.allclose(faces[device]["keepdim_mean"], cpu["keepdim_mean"], atol=1e-6)


def test_each_device_draws_from_its_own_generator_reproducibly(faces):
    cpu = on_the_cpu()
    npu, cuda = faces["emulated-npu"], faces["emulated-cuda"]
    for name in ("randn", "dropout"):
        assert len({tuple(values.tolist()) for values in (cpu[name], npu[name], cuda[name])}) == 3, name
    assert torch.equal(computed_on("emulated-npu")["randn"], npu["randn"])  # seeded by torch.manual_seed
    assert set(npu["dropout"].unique().tolist()) == {0.0, 2.0}  # a dropout mask, kept units scaled by 1 / keep


@pytest.mark.parametrize("device", list(FACES))
def test_exact_emulation_computes_and_draws_as_the_cpu(device):
    exact, cpu = computed_on(device, exact=True), on_the_cpu()
    for name in ("mm", "linear", "half_mm", "sum", "mean", "randn", "dropout", "int_sum"):
        assert torch.equal(exact[name], cpu[name].to(exact[name].dtype)), name


def _stand_in_constants(*names: str) -> dict:
    tree = ast.parse((devices.STAND_IN_DIR / "npu_port_emulation" / "device_numerics.py").read_text())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names}


def test_parent_and_stand_in_name_the_same_variables():
    assigned = _stand_in_constants("EXACT_VAR", "BLOCKS_VAR")
    assert assigned == {"EXACT_VAR": devices.EXACT_EMULATION_VAR, "BLOCKS_VAR": devices.BLOCKS_VAR}


def test_the_device_table_knows_each_faces_summation_order():
    """A calibration run sums in the port's device's order by the table's count: it must be the stand-in's own."""
    blocks = _stand_in_constants("CUDA_BLOCKS", "NPU_BLOCKS")
    assert blocks == {"CUDA_BLOCKS": devices.row("emulated-cuda").summation_blocks,
                      "NPU_BLOCKS": devices.row("emulated-npu").summation_blocks}
    assert devices.CALIBRATION_BLOCKS not in blocks.values()


# --- half precision as the devices compute it (half_precision.HALF_PRECISION) -----------------------------------

HALF_TRAINING_STEP = """
import json, sys
import torch
import torch.nn.functional as F
from verify.devices.setup import half_precision, prepare

prepare(sys.argv[1])
generator = torch.Generator().manual_seed(0)
images = torch.randn(4, 8, 12, 12, generator=generator).half().requires_grad_()
kernel = torch.randn(16, 8, 3, 3, generator=generator).half().requires_grad_()
output = F.conv2d(images, kernel, padding=1)
grad = torch.randn(output.shape, generator=generator).half()
output.backward(grad)
query = torch.randn(2, 2, 16, 8, generator=generator).half()
attended = F.scaled_dot_product_attention(query, query, query)
normed = F.batch_norm(output.detach(), None, None, training=True)
print("RESULT " + json.dumps({
    "images": images.tolist(), "kernel": kernel.tolist(), "grad": grad.tolist(),
    "dtypes": [str(tensor.dtype) for tensor in (output, images.grad, kernel.grad, attended, normed)],
    "grad_input": images.grad.tolist(), "grad_weight": kernel.grad.tolist(), "half_precision": half_precision(),
}))
"""


def half_step_on(device: str, exact: bool) -> dict:
    env = {**os.environ, **devices.child_env(device, devices.EmulateOn.CPU.value, exact_emulation=exact)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH", ""), str(devices.STAND_IN_DIR.parents[1])]))
    done = subprocess.run([sys.executable, "-c", HALF_TRAINING_STEP, device], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.parametrize("exact", [False, True], ids=["modelled", "exact"])
def test_a_half_convolution_backward_on_the_emulated_npu_is_computed_in_float32_and_rounded(exact):
    """The devices' matrix units take half inputs and accumulate in float32: the gradients are the float32 backward of
    the half inputs rounded once to float16 (bit for bit), within half an fp16 ulp of the float64 backward."""
    step = half_step_on("emulated-npu", exact)
    images, kernel, grad = (torch.tensor(step[name], dtype=torch.float16) for name in ("images", "kernel", "grad"))
    assert step["dtypes"] == ["torch.float16"] * 5

    def backward(dtype: torch.dtype, magnitudes: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        given = [tensor.to(dtype).abs() if magnitudes else tensor.to(dtype) for tensor in (grad, images, kernel)]
        try:
            grad_input, grad_weight, _ = torch.ops.aten.convolution_backward(
                *given, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
        finally:
            torch.set_num_threads(threads)
        return grad_input, grad_weight

    # float32's accumulation error (at most terms x its epsilon x the sum of the terms' magnitudes) and one rounding
    # to float16 (half its epsilon, relative): far below float16's own accumulation error
    terms = 4 * 12 * 12  # the longest sum: the weight gradient's, over the batch and the image
    for name, exact_float32, exact_float64, magnitude in zip(("grad_input", "grad_weight"), backward(torch.float32),
                                                               backward(torch.float64), backward(torch.float64, True)):
        computed = torch.tensor(step[name], dtype=torch.float16)
        assert torch.equal(computed, exact_float32.half()), name
        bound = (torch.finfo(torch.float16).eps / 2 * exact_float64.abs()
                 + terms * torch.finfo(torch.float32).eps * magnitude)
        assert ((computed.double() - exact_float64).abs() <= bound).all(), name
    computed_ops = step["half_precision"]["computed"]
    assert step["half_precision"]["table"].endswith("half_precision.py HALF_PRECISION")
    assert {"convolution", "convolution_backward", "_scaled_dot_product_flash_attention_for_cpu"} <= set(computed_ops)
    assert "native_batch_norm" not in computed_ops  # the CPU's kernel already reduces half inputs in float32


def test_the_table_names_each_op_computed_from_half_inputs_and_how():
    """Every op the emulated numerics compute from half inputs is a row of the one table, each such row is computed
    (an overload in this torch), and the autocast policy's float32 ops are its whole-op rows."""
    from verify.devices.setup import load_emulation

    package = load_emulation().__name__
    numerics = importlib.import_module(f"{package}.device_numerics")
    table = importlib.import_module(f"{package}.half_precision")
    random_ops = {"native_dropout", "bernoulli", "bernoulli_"}
    handled = {op._overloadpacket.__name__ for op in numerics.DeviceNumerics(3, torch.Generator())._handlers}
    in_float32 = set(table.computed_so(table.Computed.IN_FLOAT32))
    assert handled - random_ops == in_float32
    assert all(row.why for row in table.HALF_PRECISION.values())
    whole = set(table.computed_so(table.Computed.WHOLE_IN_FLOAT32))
    assert {"lstm", "gru", "rrelu"} <= whole and not whole & in_float32


CONV_TRAINER = """
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(4, 3, 8, 8)).float().pow(2).mean().backward()
    optimizer.step()
"""


@pytest.mark.parametrize("device", ["cpu", "emulated-npu"])
def test_a_run_under_an_imposed_autocast_computes_half_precision_by_the_table_and_names_it(tmp_path, device):
    """A CPU reference under an imposed fp16 autocast computes its products as the emulated devices do: in float32
    from the half inputs, rounded (the CPU's own fp16 convolution is 20x slower and unlike a device's)."""
    script = tmp_path / "train.py"
    script.write_text(CONV_TRAINER)
    done = subprocess.run([sys.executable, "-m", "verify.cli", "run", str(script), "--device", device, "--autocast",
                           "fp16", "--steps", "2", "-q", "-o", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())["half_precision"]
    assert record["table"] == "npu_port_emulation/half_precision.py HALF_PRECISION"
    assert {"convolution", "convolution_backward", "addmm", "mm"} <= set(record["computed"])


TF32_PROBE = """
import json, sys
import torch
import torch.nn.functional as F
from verify.devices.setup import prepare

prepare(sys.argv[1])
from npu_port_emulation.reduced_precision import hf32_rounded

generator = torch.Generator().manual_seed(0)
x, w = torch.randn(8, 64, generator=generator).requires_grad_(), torch.randn(16, 64, generator=generator)
torch.backends.cuda.matmul.allow_tf32 = True
out = F.linear(x, w)
out.backward(torch.ones_like(out))
with torch.autocast("cpu", dtype=torch.bfloat16):
    half = F.linear(x.detach(), w)
torch.backends.cuda.matmul.allow_tf32 = False
rounded_x, rounded_w = hf32_rounded(x.detach()), hf32_rounded(w)
print("RESULT " + json.dumps({
    "rounded": torch.equal(out, F.linear(rounded_x, rounded_w)),
    "changed": not torch.equal(out, F.linear(x.detach(), w)),
    "grad_rounded": torch.equal(x.grad, torch.ones(8, 16) @ rounded_w),
    "half_cast_once": torch.equal(half, F.linear(x.detach().bfloat16(), w.bfloat16())),
}))
"""


def test_tf32_rounds_the_multiplicands_of_fp32_products_forward_and_backward_and_leaves_autocast_alone():
    """On EMULATED CUDA with allow_tf32 (exact emulation: no summation order of its own), an fp32 linear multiplies
    its inputs rounded to 10 mantissa bits, as its backward does; under autocast the product's inputs are cast
    once, to bf16, as a GPU casts them (they were rounded to TF32 first)."""
    result = computed_on("emulated-cuda", exact=True, probe=TF32_PROBE)
    assert {name: bool(value) for name, value in result.items()} == {
        "rounded": True, "changed": True, "grad_rounded": True, "half_cast_once": True}


TF32_TRAINER = """
import torch
import torch.nn as nn

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 8)).to("cuda")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    optimizer.zero_grad()
    model(torch.randn(4, 64, device="cuda")).pow(2).mean().backward()
    optimizer.step()
"""


def test_the_data_flow_runs_through_tf32_rounding_to_a_products_real_inputs(tmp_path):
    """Regression: the rounding made hidden copies of a product's inputs, so under allow_tf32 (nanoGPT) the capture
    lost every fp32 linear's producers, and a port's extra op before one (its layer norm's output times 1.002) was
    named by the linear it fed ("inputs agree"). The recorded product reads the layer norm's output."""
    from pathlib import Path

    from verify.record.store import read_run

    script = tmp_path / "train.py"
    script.write_text(TF32_TRAINER)
    done = subprocess.run([sys.executable, "-m", "verify.cli", "run", str(script), "--device", "emulated-cuda",
                           "--steps", "2", "-q", "-o", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ops = read_run(Path(tmp_path / "run")).ops
    step = ops.loc[(ops["step"] == 1) & (ops["phase"] == "forward")]
    norm = step.loc[step["op"] == "aten.native_layer_norm", "seq"].iloc[0]
    product = step.loc[step["op"] == "aten.addmm"].iloc[0]
    assert str(norm) in str(product["inputs"]).split(","), product.to_dict()
