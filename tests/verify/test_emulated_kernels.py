"""The emulators run what the device runs: every recurrent module, and the functional form of every op of the CUDA
autocast lists the emulation applies, forward and backward under fp16 and bf16 autocast, on the emulated NPU and on
EMULATED CUDA, without a crash where the device has a kernel (an fp16 LSTM: the CPU has none, the emulation computes
it in float32 and rounds). One child process per emulation, as verify runs them."""

import json
import os
import subprocess
import sys

import pytest

from verify import devices
from verify.devices import Device

_EVERY_OP = r"""
import json, sys
import torch, torch.nn as nn, torch.nn.functional as F
device = sys.argv[1]
if device == "emulated-cuda":
    from verify import device_setup
    device_setup.prepare(device, True)
    face = "cuda"
else:
    import torch_npu
    from torch_npu.contrib import transfer_to_npu
    face = "npu"

def x(*shape):
    return torch.randn(*shape, device=face, requires_grad=True)

recurrent = {
    "LSTM": lambda: nn.LSTM(8, 16, num_layers=2, batch_first=True)(x(4, 5, 8))[0],
    "LSTM bidirectional": lambda: nn.LSTM(8, 16, bidirectional=True)(x(5, 4, 8))[0],
    "LSTM proj_size": lambda: nn.LSTM(8, 16, proj_size=4)(x(5, 4, 8))[0],
    "LSTM packed": lambda: nn.utils.rnn.pad_packed_sequence(nn.LSTM(8, 16, batch_first=True)(
        nn.utils.rnn.pack_padded_sequence(x(3, 5, 8), [5, 4, 2], batch_first=True))[0], batch_first=True)[0],
    "GRU": lambda: nn.GRU(8, 16, num_layers=2, batch_first=True)(x(4, 5, 8))[0],
    "RNN tanh": lambda: nn.RNN(8, 16)(x(5, 4, 8))[0],
    "RNN relu": lambda: nn.RNN(8, 16, nonlinearity="relu", bidirectional=True)(x(5, 4, 8))[0],
    "LSTMCell": lambda: nn.LSTMCell(8, 16)(x(4, 8))[0],
    "GRUCell": lambda: nn.GRUCell(8, 16)(x(4, 8)),
    "RNNCell": lambda: nn.RNNCell(8, 16)(x(4, 8)),
}
low_precision = {
    "conv1d": lambda: F.conv1d(x(2, 3, 9), x(4, 3, 3)), "conv2d": lambda: F.conv2d(x(2, 3, 9, 9), x(4, 3, 3, 3)),
    "conv3d": lambda: F.conv3d(x(1, 2, 5, 5, 5), x(3, 2, 3, 3, 3)),
    "conv_transpose1d": lambda: F.conv_transpose1d(x(2, 3, 9), x(3, 4, 3)),
    "conv_transpose2d": lambda: F.conv_transpose2d(x(2, 3, 9, 9), x(3, 4, 3, 3)),
    "conv_transpose3d": lambda: F.conv_transpose3d(x(1, 2, 4, 4, 4), x(2, 3, 3, 3, 3)),
    "prelu": lambda: F.prelu(x(4, 3, 5), x(3)), "linear": lambda: F.linear(x(4, 8), x(6, 8), x(6)),
    "matmul": lambda: torch.matmul(x(4, 8), x(8, 6)), "mm": lambda: torch.mm(x(4, 8), x(8, 6)),
    "mv": lambda: torch.mv(x(4, 8), x(8)), "bmm": lambda: torch.bmm(x(2, 4, 8), x(2, 8, 6)),
    "addmm": lambda: torch.addmm(x(4, 6), x(4, 8), x(8, 6)), "addmv": lambda: torch.addmv(x(4), x(4, 8), x(8)),
    "addr": lambda: torch.addr(x(4, 6), x(4), x(6)), "addbmm": lambda: torch.addbmm(x(4, 6), x(2, 4, 8), x(2, 8, 6)),
    "baddbmm": lambda: torch.baddbmm(x(2, 4, 6), x(2, 4, 8), x(2, 8, 6)),
    "einsum": lambda: torch.einsum("ij,jk->ik", x(4, 8), x(8, 6)),
    "chain_matmul": lambda: torch.linalg.multi_dot([x(4, 8), x(8, 6), x(6, 3)]),
    "linalg_vecdot": lambda: torch.linalg.vecdot(x(4, 8), x(4, 8)),
    "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(x(2, 2, 5, 8), x(2, 2, 5, 8), x(2, 2, 5, 8)),
}
float32 = {
    "softmax": lambda: F.softmax(x(4, 8), -1), "log_softmax": lambda: F.log_softmax(x(4, 8), -1),
    "layer_norm": lambda: F.layer_norm(x(4, 8), (8,)), "group_norm": lambda: F.group_norm(x(2, 4, 5), 2),
    "mse_loss": lambda: F.mse_loss(x(4, 8), x(4, 8)), "l1_loss": lambda: F.l1_loss(x(4, 8), x(4, 8)),
    "smooth_l1_loss": lambda: F.smooth_l1_loss(x(4, 8), x(4, 8)), "huber_loss": lambda: F.huber_loss(x(4, 8), x(4, 8)),
    "nll_loss": lambda: F.nll_loss(F.log_softmax(x(4, 8), -1), torch.tensor([1, 2, 3, 0], device=face)),
    "cross_entropy": lambda: F.cross_entropy(x(4, 8), torch.tensor([1, 2, 3, 0], device=face)),
    "kl_div": lambda: F.kl_div(x(4, 8), x(4, 8), reduction="batchmean"),
    "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(x(4, 8), torch.rand(4, 8,
                                                                                                   device=face)),
    "cosine_similarity": lambda: F.cosine_similarity(x(4, 8), x(4, 8)), "cdist": lambda: torch.cdist(x(4, 8), x(5, 8)),
    "exp": lambda: torch.exp(x(4, 8)), "log": lambda: torch.log(x(4, 8).abs() + 1),
    "sum": lambda: torch.sum(x(4, 8)), "prod": lambda: torch.prod(x(4, 3)), "cumsum": lambda: torch.cumsum(x(4, 8), 1),
    "norm": lambda: torch.linalg.vector_norm(x(4, 8)), "logsumexp": lambda: torch.logsumexp(x(4, 8), 1),
    "upsample_bilinear2d": lambda: F.interpolate(x(1, 2, 4, 4), scale_factor=2, mode="bilinear"),
    "upsample_nearest2d": lambda: F.interpolate(x(1, 2, 4, 4), scale_factor=2), "pow": lambda: torch.pow(x(4, 8), 2),
}
failures, dtypes = [], {}
for dtype in (torch.float16, torch.bfloat16):
    for table in (recurrent, low_precision, float32):
        for name, make in table.items():
            try:
                torch.manual_seed(0)
                with torch.autocast(face, dtype=dtype):
                    out = make()
                out.float().sum().backward()
                dtypes[f"{name} {dtype}"] = str(out.dtype)
            except Exception as error:
                failures.append(f"{name} under {dtype}: {type(error).__name__}: {str(error).splitlines()[0][:160]}")
policy = sys.modules["npu_port_emulation.autocast_policy"]
print(json.dumps({"failures": failures, "dtypes": dtypes, "computed_in_fp32": sorted(policy.COMPUTED_IN_FP32)}))
"""


@pytest.mark.parametrize("device", [Device.EMULATED_NPU.value, Device.EMULATED_CUDA.value])
def test_every_recurrent_module_and_autocast_op_runs_on_the_emulators(device, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1",
           **devices.child_env(device, devices.EmulateOn.CPU.value)}
    done = subprocess.run([sys.executable, "-c", _EVERY_OP, device], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failures"] == []
    assert result["dtypes"]["LSTM torch.float16"] == "torch.float16"  # the device's dtype, not the fallback's
    assert result["dtypes"]["linear torch.bfloat16"] == "torch.bfloat16"
    assert result["dtypes"]["softmax torch.float16"] == "torch.float32"
    assert result["computed_in_fp32"] == ["aten.lstm.data (float16)", "aten.lstm.input (float16)"]
