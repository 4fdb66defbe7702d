"""The emulators run what the device runs: every op of the autocast lists and every recurrent module computes under
the NPU autocast policy on the CPU, forward and backward, in float16 and bfloat16, in the dtype the device gives.

The emulated NPU, EMULATED CUDA and a cpu run under an imposed autocast all install the same policy on the CPU
(verify/devices/emulated/npu_port_emulation/autocast_policy.py), so the fast tests load it in this process, once per
module (its registrations last as long as the library object: the fixture drops it). The slow tests run each emulator in
a child process, and a ported LSTM trainer through `verify`.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import typer
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils._pytree import tree_flatten
from typer.testing import CliRunner

from migrate import Settings, migrate_source
from verify.devices import setup as device_setup
from verify import devices
from verify.cli import app
from verify.cli.pair import route

REDUCED = (torch.float16, torch.bfloat16)
aten = torch.ops.aten


@pytest.fixture(scope="module")
def policy():
    library = device_setup.install_autocast_casts_on_cpu()
    yield sys.modules[f"{devices.EMULATION_PACKAGE}.autocast_policy"]
    del library  # unregisters the policy for the tests after these


# --- every op of the autocast lists -------------------------------------------------------------------------------

def _unary(name: str):
    return lambda t: getattr(aten, name)(t(2, 3))


def _pair(name: str, *extra):
    return lambda t: getattr(aten, name)(t(2, 3), t(2, 3), *extra)


def _loss(name: str, *extra):
    return lambda t: getattr(aten, name)(t(2, 3), t(2, 3, grad=False), *extra)


def _labels(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.long)


def _upsample(name: str, spatial: int, *extra):
    return lambda t: getattr(aten, name)(t(1, 1, *[2] * spatial), [4] * spatial, *extra)


# One call of each op (its aten name: the dispatcher's, so that nothing on the way routes it elsewhere), given `t`,
# which makes small inputs in (0.1, 0.9) of the dtype under test (requiring grad unless told).
FLOAT32_CALLS = {
    **{name: _unary(name) for name in ("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2",
                                       "log1p", "reciprocal", "rsqrt", "sinh", "tan", "softplus", "prod", "sum",
                                       "linalg_vector_norm", "nuclear_norm", "linalg_matrix_norm", "pdist")},
    **{name: _loss(name) for name in ("l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "soft_margin_loss",
                                      "kl_div", "binary_cross_entropy_with_logits")},
    **{name: _pair(name) for name in ("dist", "cdist", "cosine_similarity")},
    "layer_norm": lambda t: aten.layer_norm(t(2, 3), [3]),
    "native_layer_norm": lambda t: aten.native_layer_norm(t(2, 3), [3], None, None, 1e-5),
    "group_norm": lambda t: aten.group_norm(t(2, 4, 3), 2),
    "poisson_nll_loss": _loss("poisson_nll_loss", True, False, 1e-8, 1),
    "cosine_embedding_loss": _pair("cosine_embedding_loss", torch.ones(2)),
    "hinge_embedding_loss": lambda t: aten.hinge_embedding_loss(t(2, 3), torch.ones(2, 3)),
    "triplet_margin_loss": lambda t: aten.triplet_margin_loss(t(2, 3), t(2, 3), t(2, 3)),
    "margin_ranking_loss": lambda t: aten.margin_ranking_loss(t(3), t(3), torch.ones(3)),
    "nll_loss": lambda t: aten.nll_loss(t(2, 3), _labels(2)),
    "nll_loss2d": lambda t: aten.nll_loss2d(t(2, 3, 2, 2), _labels(2, 2, 2)),
    "multi_margin_loss": lambda t: aten.multi_margin_loss(t(2, 3), _labels(2)),
    "multilabel_margin_loss": lambda t: aten.multilabel_margin_loss(t(2, 3), torch.tensor([[0, 1, -1], [2, -1, 0]])),
    "renorm": lambda t: aten.renorm(t(2, 3), 2, 0, 1.0),
    "logsumexp": lambda t: aten.logsumexp(t(2, 3), [1]),
    **{name: _upsample(name, 1) for name in ("upsample_nearest1d", "_upsample_nearest_exact1d")},
    **{name: _upsample(name, 2) for name in ("upsample_nearest2d", "_upsample_nearest_exact2d")},
    **{name: _upsample(name, 3) for name in ("upsample_nearest3d", "_upsample_nearest_exact3d")},
    "upsample_linear1d": _upsample("upsample_linear1d", 1, False),
    **{name: _upsample(name, 2, False) for name in ("upsample_bilinear2d", "_upsample_bilinear2d_aa",
                                                    "upsample_bicubic2d", "_upsample_bicubic2d_aa")},
    "upsample_trilinear3d": _upsample("upsample_trilinear3d", 3, False),
    **{name: lambda t, name=name: getattr(aten, name)(t(2, 3), 1)
       for name in ("softmax", "log_softmax", "cumprod", "cumsum")},
    "pow": lambda t: aten.pow(t(2, 3), 2),
    "frobenius_norm": lambda t: aten.frobenius_norm(t(3, 3), [0, 1]),
    "norm": lambda t: aten.norm(t(2, 3), 2),
}

LOW_PRECISION_CALLS = {
    "_convolution": lambda t: aten._convolution(t(1, 2, 5), t(3, 2, 3), None, [1], [0], [1], False, [0], 1, False,
                                                False, True, True),
    "convolution": lambda t: aten.convolution(t(1, 2, 5), t(3, 2, 3), None, [1], [0], [1], False, [0], 1),
    "conv1d": lambda t: aten.conv1d(t(1, 2, 5), t(3, 2, 3)),
    "conv2d": lambda t: aten.conv2d(t(1, 2, 5, 5), t(3, 2, 3, 3)),
    "conv3d": lambda t: aten.conv3d(t(1, 2, 4, 4, 4), t(3, 2, 3, 3, 3)),
    "conv_tbc": lambda t: aten.conv_tbc(t(5, 1, 2), t(3, 2, 4), t(4)),
    "conv_transpose1d": lambda t: aten.conv_transpose1d(t(1, 2, 5), t(2, 3, 3)),
    "conv_transpose2d": lambda t: aten.conv_transpose2d(t(1, 2, 5, 5), t(2, 3, 3, 3)),
    "conv_transpose3d": lambda t: aten.conv_transpose3d(t(1, 2, 3, 3, 3), t(2, 3, 2, 2, 2)),
    "prelu": lambda t: aten.prelu(t(2, 3), t(1)),
    "addmm": lambda t: aten.addmm(t(2, 4), t(2, 3), t(3, 4)),
    "addmv": lambda t: aten.addmv(t(2), t(2, 3), t(3)),
    "addr": lambda t: aten.addr(t(2, 3), t(2), t(3)),
    "matmul": lambda t: aten.matmul(t(2, 3), t(3, 4)),
    "einsum": lambda t: aten.einsum("ij,jk->ik", [t(2, 3), t(3, 4)]),
    "mm": lambda t: aten.mm(t(2, 3), t(3, 4)),
    "mv": lambda t: aten.mv(t(2, 3), t(3)),
    "linalg_vecdot": _pair("linalg_vecdot"),
    "linear": lambda t: aten.linear(t(2, 3), t(4, 3), t(4)),
    "addbmm": lambda t: aten.addbmm(t(2, 4), t(3, 2, 5), t(3, 5, 4)),
    "baddbmm": lambda t: aten.baddbmm(t(3, 2, 4), t(3, 2, 5), t(3, 5, 4)),
    "bmm": lambda t: aten.bmm(t(3, 2, 5), t(3, 5, 4)),
    "chain_matmul": lambda t: aten.chain_matmul([t(2, 3), t(3, 4), t(4, 2)]),
    "linalg_multi_dot": lambda t: aten.linalg_multi_dot([t(2, 3), t(3, 4), t(4, 2)]),
    "lstm_cell": lambda t: aten.lstm_cell(t(2, 3), [t(2, 4), t(2, 4)], t(16, 3), t(16, 4)),
    "gru_cell": lambda t: aten.gru_cell(t(2, 3), t(2, 4), t(12, 3), t(12, 4)),
    "rnn_tanh_cell": lambda t: aten.rnn_tanh_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
    "rnn_relu_cell": lambda t: aten.rnn_relu_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
    "scaled_dot_product_attention": lambda t: aten.scaled_dot_product_attention(t(1, 2, 4, 8), t(1, 2, 4, 8),
                                                                                t(1, 2, 4, 8)),
}
# On CUDA's list, but CUDA kernels only: on the CPU the cells and attention above dispatch to other ops.
CUDA_ONLY = {"_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "_scaled_dot_product_flash_attention"}


def _run_forward_and_backward(call, input_dtype: torch.dtype, autocast_dtype: torch.dtype) -> list[torch.Tensor]:
    """The floating outputs of `call` under the policy's autocast, after a backward through them that reached an
    input with finite gradients."""
    generator, made = torch.Generator().manual_seed(0), []

    def t(*shape: int, grad: bool = True) -> torch.Tensor:
        made.append((torch.rand(shape, generator=generator) * 0.8 + 0.1).to(input_dtype).requires_grad_(grad))
        return made[-1]

    with torch.autocast("cpu", dtype=autocast_dtype, cache_enabled=False):
        outputs = [value for value in tree_flatten(call(t))[0]
                   if isinstance(value, torch.Tensor) and value.is_floating_point()]
    sum(output.float().sum() for output in outputs).backward()
    grads = [tensor.grad for tensor in made if tensor.grad is not None]
    assert grads and all(torch.isfinite(grad).all() for grad in grads)
    return outputs


def test_the_calls_cover_every_op_of_the_lists(policy):
    listed = {name for name, _ in (*policy.FLOAT32_OPS, *policy.LOW_PRECISION_OPS)}
    assert set(FLOAT32_CALLS) == {name for name, _ in policy.FLOAT32_OPS}
    assert set(LOW_PRECISION_CALLS) | CUDA_ONLY == {name for name, _ in policy.LOW_PRECISION_OPS}
    assert CUDA_ONLY <= listed and not set(policy.COMPUTED_IN_FLOAT32) & listed


@pytest.mark.parametrize("autocast_dtype", REDUCED, ids=str)
def test_every_op_of_the_lists_runs_forward_and_backward_in_the_devices_dtype(policy, autocast_dtype):
    """Whether its inputs come from an fp32 model or from an earlier autocast op, a float32-list op answers in
    float32 and a low-precision-list op in the autocast dtype, as on the device."""
    for input_dtype in (torch.float32, autocast_dtype):
        for calls, expected in ((FLOAT32_CALLS, torch.float32), (LOW_PRECISION_CALLS, autocast_dtype)):
            for name, call in calls.items():
                outputs = _run_forward_and_backward(call, input_dtype, autocast_dtype)
                assert {output.dtype for output in outputs} == {expected}, (name, input_dtype)


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
def test_rrelu_in_training_runs_in_the_dtype_it_receives(policy, dtype):
    """The CPU has no float16 rrelu_with_noise; the device runs it in the dtype an autocast linear gives it."""
    for input_dtype in (torch.float32, dtype):
        outputs = _run_forward_and_backward(lambda t: aten.rrelu(t(2, 3), 0.1, 0.3, True), input_dtype, dtype)
        assert [output.dtype for output in outputs] == [input_dtype]
    assert "aten::rrelu" in policy.computed_in_float32()


# --- the recurrent modules ----------------------------------------------------------------------------------------

RECURRENT_MODULES = {
    "RNN tanh": lambda: nn.RNN(3, 4),
    "RNN relu": lambda: nn.RNN(3, 4, nonlinearity="relu"),
    "LSTM": lambda: nn.LSTM(3, 4),
    "LSTM proj_size": lambda: nn.LSTM(3, 4, proj_size=2),
    "LSTM 2 layers bidirectional batch_first": lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True,
                                                               batch_first=True),
    "GRU": lambda: nn.GRU(3, 4),
    "GRU 2 layers bidirectional batch_first": lambda: nn.GRU(3, 4, num_layers=2, bidirectional=True,
                                                             batch_first=True),
    "LSTMCell": lambda: nn.LSTMCell(3, 4),
    "GRUCell": lambda: nn.GRUCell(3, 4),
    "RNNCell": lambda: nn.RNNCell(3, 4),
}
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 4e-2}  # against fp32: a few ulps of each dtype


def _floats(value) -> list[torch.Tensor]:
    return [tensor for tensor in tree_flatten(value)[0] if isinstance(tensor, torch.Tensor)]


@pytest.mark.parametrize("dtype", REDUCED, ids=str)
@pytest.mark.parametrize("name", RECURRENT_MODULES)
def test_every_recurrent_module_trains_under_autocast_in_the_devices_dtype(policy, name, dtype):
    torch.manual_seed(0)
    module = RECURRENT_MODULES[name]()
    inputs = torch.randn(2, 5, 3) if "Cell" not in name else torch.randn(2, 3)
    expected = _floats(module(inputs))

    with torch.autocast("cpu", dtype=dtype, cache_enabled=False):
        outputs = _floats(module(inputs))
    sum(output.float().sum() for output in outputs).backward()

    assert {output.dtype for output in outputs} == {dtype}  # output and hidden states, as the device's kernel
    for output, reference in zip(outputs, expected, strict=True):
        torch.testing.assert_close(output.float(), reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    grads = [parameter.grad for parameter in module.parameters()]
    assert all(grad.dtype == torch.float32 and torch.isfinite(grad).all() for grad in grads)
    assert sum(grad.abs().sum() for grad in grads) > 0  # (a cell's weight_hh meets a zero state: its grad is 0)


def test_a_packed_sequence_runs_through_the_lstm_in_float16(policy):
    lstm = nn.LSTM(3, 4)
    packed = pack_padded_sequence(torch.randn(5, 2, 3), [5, 3])
    with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
        output, (hidden, cell) = lstm(packed)
    output.data.float().sum().backward()
    assert (output.data.dtype, hidden.dtype, cell.dtype) == (torch.float16,) * 3
    assert lstm.weight_ih_l0.grad is not None
    # the packed overload is named (the padded one, aten::lstm.input, only where a test in this process ran it)
    assert "aten::lstm.data" in policy.computed_in_float32()


def test_without_autocast_the_policy_leaves_fp32_modules_alone(policy):
    """The kernels are autocast's: an fp32 LSTM outside autocast runs the CPU's own fp32 kernel, unrounded."""
    torch.manual_seed(0)
    lstm, inputs = nn.LSTM(3, 4), torch.randn(5, 2, 3)
    output, _ = lstm(inputs)
    with torch.autocast("cpu", enabled=False):
        again, _ = lstm(inputs)
    assert output.dtype == torch.float32 and torch.equal(output, again)
    assert not torch.equal(output, output.half().float())  # so a rounding would have shown


# --- each emulator, in its own process ----------------------------------------------------------------------------

RECURRENT_UNDER_AUTOCAST = """
import json, sys
import torch, torch.nn as nn
{setup}
dtypes = {{}}
for dtype in (torch.float16, torch.bfloat16):
    for module in (nn.LSTM(3, 4, num_layers=2), nn.GRU(3, 4, bidirectional=True), nn.RNN(3, 4), nn.LSTMCell(3, 4),
                   nn.Sequential(nn.Linear(3, 4), nn.RReLU())):
        module = module.to("{face}")
        with torch.autocast("{face}", dtype=dtype):
            output = module(torch.randn(5, 3, device="{face}"))
        output = output[0] if isinstance(output, tuple) else output
        output.float().sum().backward()
        dtypes[f"{{type(module).__name__}} {{dtype}}"] = str(output.dtype)
policy = sys.modules["npu_port_emulation.autocast_policy"]
print("RESULT", json.dumps({{"dtypes": dtypes, "computed": policy.computed_in_float32()}}))
"""
EMULATORS = {
    "emulated-npu": ("import torch_npu", "npu", devices.emulation_env("cpu")),
    "emulated-cuda": ("from verify.devices import setup; setup.prepare('emulated-cuda')", "cuda",
                      {devices.EMULATE_ON_VAR: "cpu", "CUDA_VISIBLE_DEVICES": ""}),
}


@pytest.mark.slow
@pytest.mark.parametrize("device", EMULATORS)
def test_each_emulator_trains_recurrent_layers_in_the_devices_dtype(tmp_path, device):
    setup, face, env = EMULATORS[device]
    script = tmp_path / "recurrent.py"
    script.write_text(textwrap.dedent(RECURRENT_UNDER_AUTOCAST.format(setup=setup, face=face)))
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])

    assert result["dtypes"] == {f"{module} {dtype}": dtype for dtype in ("torch.float16", "torch.bfloat16")
                                for module in ("LSTM", "GRU", "RNN", "LSTMCell", "Sequential")}
    assert result["computed"] == ["aten::gru.input", "aten::lstm.input", "aten::rnn_tanh.input", "aten::rrelu"]


# --- a ported LSTM trainer through verify ------------------------------------------------------------------------

LSTM_TRAIN = Path(__file__).resolve().parent / "scripts" / "lstm_train.py"


@pytest.mark.slow
def test_a_faithful_port_of_an_lstm_trainer_passes_where_the_cpu_has_no_fp16_lstm(tmp_path):
    """migrate adds fp16 autocast and a GradScaler; oneDNN has no fp16 LSTM, so before the emulations computed it in
    float32 the port crashed at step 0 ("could not create a primitive descriptor for the LSTM forward ...")."""
    code = LSTM_TRAIN.read_text()
    (tmp_path / "lstm_train.py").write_text(code)
    port = migrate_source(code, "lstm_train.py", Settings(is_entry=True)).code
    assert 'torch.autocast(device_type="npu", dtype=torch.float16)' in port and "GradScaler" in port
    (tmp_path / "lstm_train_npu.py").write_text(port)
    out = tmp_path / "out"

    argv = [str(tmp_path / "lstm_train.py"), "-n", "3", "-o", str(out)]
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)), env={"OMP_NUM_THREADS": "1"})

    summary = json.loads((out / "summary.json").read_text())
    assert (result.exit_code, summary["verdict"]) == (0, "PASS"), summary["reason"]
    for side, device in (("ref", "emulated-cuda"), ("actual", "emulated-npu")):
        manifest = json.loads((out / side / "manifest.json").read_text())
        assert (manifest["device"], manifest["extra"]["computed_in_fp32"]) == (device, ["aten::lstm.input"])
    assert any("computed aten::lstm.input in float32 and rounded" in note for note in summary["notes"])
