"""A sequence classifier whose hot spots run on hand-written GPU kernels, each with a plain-PyTorch fallback.

- the MLP's bias+GELU is a custom CUDA op compiled at start-up with torch.utils.cpp_extension.load_inline,
  or a Triton kernel when the extension cannot be built, or PyTorch ops without a GPU;
- attention uses flash-attn when it is installed and the GPU is Ampere or newer, else scaled_dot_product_attention;
- GPU memory and utilisation are logged through NVML (pynvml), or nvidia-smi when pynvml is missing.

    python train_gpu.py --steps 2000 --batch-size 64
"""
import argparse
import os
import shutil
import subprocess
import time
import warnings

import torch
import torch_npu
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline
import random

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

try:
    from flash_attn import flash_attn_func
except ImportError:
    flash_attn_func = None

try:
    import pynvml
except ImportError:
    pynvml = None

# ----------------------------------------------------------------------------------------------------------------
# Fused bias + GELU (tanh approximation), three ways

BIAS_GELU_CUDA = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void bias_gelu_kernel(const float* x, const float* bias, float* out, int64_t n, int64_t width) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + bias[i % width];
        out[i] = 0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
    }
}

torch::Tensor bias_gelu(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "bias_gelu: float32 CUDA tensors only");
    auto input = x.contiguous();
    auto out = torch::empty_like(input);
    int64_t n = input.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    bias_gelu_kernel<<<blocks, threads>>>(input.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
                                          n, bias.numel());
    return out;
}
"""
BIAS_GELU_CPP = "torch::Tensor bias_gelu(torch::Tensor x, torch::Tensor bias);"


def build_cuda_ops():
    """Compile the CUDA op (cached under ~/.cache/torch_extensions); None without a GPU or a CUDA toolkit."""
    if not torch.npu.is_available() or os.environ.get("DISABLE_CUSTOM_OPS") == "1":
        return None
    try:
        return load_inline(
            name="bias_gelu_ext",
            cpp_sources=[BIAS_GELU_CPP],
            cuda_sources=[BIAS_GELU_CUDA],
            functions=["bias_gelu"],
            extra_cuda_cflags=["-O3", "--use_fast_math"],
            verbose=False,
        )
    except (RuntimeError, OSError) as error:
        warnings.warn(f"custom CUDA op unavailable, falling back: {error}")
        return None


if HAS_TRITON:

    @triton.jit
    def bias_gelu_triton_kernel(x_ptr, bias_ptr, out_ptr, n, width, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        v = tl.load(x_ptr + offsets, mask=mask) + tl.load(bias_ptr + offsets % width, mask=mask)
        inner = 0.7978845608 * (v + 0.044715 * v * v * v)
        tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        tl.store(out_ptr + offsets, 0.5 * v * (1.0 + tanh), mask=mask)

    def bias_gelu_triton(x, bias):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        grid = (triton.cdiv(n, 1024),)
        bias_gelu_triton_kernel[grid](x, bias, out, n, bias.numel(), BLOCK=1024)
        return out


def bias_gelu_reference(x, bias):
    return F.gelu(x + bias, approximate="tanh")


class BiasGelu(torch.autograd.Function):
    """Forward on the fastest kernel available; backward recomputes through the reference ops (cheap, exact)."""

    @staticmethod
    def forward(ctx, x, bias):
        ctx.save_for_backward(x, bias)
        if CUDA_OPS is not None and x.is_npu and x.dtype == torch.float32:
            return CUDA_OPS.bias_gelu(x, bias)
        if HAS_TRITON and x.is_npu:
            return bias_gelu_triton(x, bias)
        return bias_gelu_reference(x, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, bias = ctx.saved_tensors
        with torch.enable_grad():
            x, bias = x.detach().requires_grad_(), bias.detach().requires_grad_()
            out = bias_gelu_reference(x, bias)
        return torch.autograd.grad(out, (x, bias), grad_out)


CUDA_OPS = build_cuda_ops()

# ----------------------------------------------------------------------------------------------------------------
# Model


def flash_attention_usable(device):
    """flash-attn kernels need an Ampere (sm80) or newer GPU."""
    if flash_attn_func is None or device.type != "npu":
        return False
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, use_flash):
        super().__init__()
        self.heads, self.use_flash = heads, use_flash
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, dim // self.heads).unbind(2)
        if self.use_flash and x.dtype in (torch.float16, torch.bfloat16):
            y = flash_attn_func(q, k, v)  # (B, L, H, D) layout
        else:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            y = y.transpose(1, 2)
        return self.out(y.reshape(batch, length, dim))


class FusedMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.up_bias = nn.Parameter(torch.zeros(hidden))
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(BiasGelu.apply(self.up(x), self.up_bias))


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, use_flash):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads, use_flash)
        self.mlp = FusedMLP(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SequenceClassifier(nn.Module):
    def __init__(self, vocab, dim, heads, layers, classes, use_flash):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, use_flash) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


# ----------------------------------------------------------------------------------------------------------------
# Monitoring


def gpu_stats(device_index):
    """'mem 1234MiB util 87%' for the GPU, from NVML or nvidia-smi; '' when neither is there."""
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = pynvml.nvmlDeviceGetUtilizationRates(handle)
            return f"mem {memory.used // 2**20}MiB util {utilization.gpu}%"
        except pynvml.NVMLError:
            return ""
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", f"--id={device_index}", "--query-gpu=memory.used,utilization.gpu",
                 "--format=csv,noheader,nounits"]
        result = subprocess.run(query, capture_output=True, text=True, timeout=10)
        if result.returncode == 0 and result.stdout.strip():
            used, util = (part.strip() for part in result.stdout.split(","))
            return f"mem {used}MiB util {util}%"
    return ""


# ----------------------------------------------------------------------------------------------------------------
# Training


def synthetic_batch(batch_size, length, vocab, generator, device):
    """Token sequences labelled by whether token 1 occurs more often than token 2: needs attention over the sequence."""
    tokens = torch.randint(3, vocab, (batch_size, length), generator=generator)
    marks = torch.randint(0, 3, (batch_size, length), generator=generator)
    tokens = torch.where(marks > 0, marks, tokens)  # about a third each: token 1, token 2, other tokens
    labels = ((tokens == 1).sum(1) > (tokens == 2).sum(1)).long()
    return tokens.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    device = torch.device("npu", torch.npu.current_device()) if torch.npu.is_available() else torch.device("cpu")
    use_flash = flash_attention_usable(device)
    kernels = "cuda extension" if CUDA_OPS else "triton" if HAS_TRITON and device.type == "npu" else "pytorch"
    print(f"device {device}, bias-gelu kernel: {kernels}, flash-attn: {use_flash}")

    model = SequenceClassifier(args.vocab, args.dim, args.heads, args.layers, 2, use_flash).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # Batches are made on the CPU from their own generator: the same data whatever the device does.
    generator = torch.Generator().manual_seed(args.seed)

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        tokens, labels = synthetic_batch(args.batch_size, args.seq_len, args.vocab, generator, device)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_flash):
            logits = model(tokens)
            loss = F.cross_entropy(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        if step % args.log_every == 0 or step == 1:
            if device.type == "npu":
                torch.npu.synchronize()
            rate = step / (time.perf_counter() - start)
            stats = gpu_stats(device.index or 0) if device.type == "npu" else ""
            print(f"step {step:5d} loss {loss.item():.4f} {rate:.1f} it/s {stats}".rstrip())

    if device.type == "npu":
        peak = torch.npu.max_memory_allocated(device) / 2**20
        print(f"peak memory {peak:.0f}MiB")


if __name__ == "__main__":
    main()
