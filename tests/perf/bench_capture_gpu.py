"""Cost of per-op capture on a CUDA GPU: plain training steps, the same steps under verify's statistics capture (as
`verify run --device cuda --dump stats` sets it up), and under Huawei msprobe's statistics dump (L1) where msprobe
imports, measured in one run and printed as ms/step and ratios.

    PYTHONPATH=. python tests/perf/bench_capture_gpu.py [--rounds 3] [--models cnn gpt resnet18]

Models (issue 10): the small CNN of bench_capture.py at batch 32 (80 steps per timed block), a GPT of 6 layers,
d=512, sequence 256, batch 32, written here in plain torch (20 steps), and torchvision's resnet18 at batch 64, 224 px
(20 steps; torchvision is imported only for it). Each variant is warmed up, then timed blocks alternate between
variants, torch.cuda.synchronize() on both sides of each block, and the medians are compared. The steps never read a
number back (no loss.item()): the plain loop keeps the GPU queue full, and so must the capture. The capture runs
twice: as verify runs it (large floating tensors reduced by one fused Triton pass where triton imports), and with
torch's reductions for them (as where triton is missing). After the timings, torch.profiler counts each variant's
kernel launches per step over one block: each launch costs host time, and they explain most of the ratio.
Targets: ours <= 1.5x plain on resnet18 and the GPT, <= 2x on the CNN, and our overhead <= 1/3 of msprobe's.
Without a CUDA device it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))  # bench_capture, beside this file, when imported from tests/gpu
from bench_capture import SmallCnn  # noqa: E402

TARGET_RATIOS = {"cnn": 2.0, "gpt": 1.5, "resnet18": 1.5}
TARGET_SHARE_OF_MSPROBE = 1 / 3


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (part.view(batch, length, self.heads, -1).transpose(1, 2) for part in self.qkv(x).split(width, 2))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(attended.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int = 8192, width: int = 512, layers: int = 6, heads: int = 8, length: int = 256):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(length, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.tokens(tokens) + self.positions(positions))))


@dataclass
class Workload:
    """A model, its optimizer and one batch on the device; `step()` is one training step, returning the loss."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[], torch.Tensor]


def _workload(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
              loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Workload:
    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = loss_of(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return Workload(model, optimizer, step)


def make_workload(name: str, device: torch.device, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    if name == "cnn":
        model = SmallCnn().to(device)
        inputs, targets = torch.randn(32, 3, 32, 32, device=device), torch.randint(0, 10, (32,), device=device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return _workload(model, optimizer, inputs, targets, F.cross_entropy)
    if name == "gpt":
        model = Gpt().to(device)
        tokens = torch.randint(0, 8192, (32, 257), device=device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

        def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        return _workload(model, optimizer, tokens[:, :-1], tokens[:, 1:], next_token_loss)
    if name == "resnet18":
        import torchvision  # only here: the GPU machine has it, the project does not need it

        model = torchvision.models.resnet18(num_classes=1000).to(device)
        inputs, targets = torch.randn(64, 3, 224, 224, device=device), torch.randint(0, 1000, (64,), device=device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        return _workload(model, optimizer, inputs, targets, F.cross_entropy)
    raise ValueError(f"unknown model {name!r}")


STEPS_PER_BLOCK = {"cnn": 80, "gpt": 20, "resnet18": 20}


class BootstrapLikeCapture:
    """verify's capture as verify/capture/bootstrap.py's StepRecorder drives it: the op capture, the loss and the
    gradients recorded into one StatBatch, optimizer.step() recorded as its updated parameters, and at each step's end
    one ship of the statistics; a step is written when its copy has arrived, else at the end of the next step."""

    def __init__(self, workload: Workload, out_dir: Path, fused: bool = True, device_path_on_cpu: bool = False) -> None:
        """fused=False: large floating tensors reduced by torch's reductions, not the fused Triton kernels (the path
        where triton is missing), to measure what the kernels save. device_path_on_cpu: CPU tensors go the device's
        way (StatBatch), to measure its host cost on the CPU (bench_capture_host.py). Each call's line is named, in
        this folder's files, as a run names the script's."""
        from verify.capture.ops import OpCapture
        from verify.capture.tensor_stats import FusedReduction, StatBatch
        from verify.record.schema import DumpMode
        from verify.record.store import RunWriter

        self.workload = workload
        self.batch = StatBatch(device_path_on_cpu=device_path_on_cpu)
        if not fused:
            self.batch.device_stats.fused = FusedReduction(devices=())
        self.capture = OpCapture(DumpMode.STATS, self.batch, user_files=Path(__file__).parent)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.writer = RunWriter(out_dir)
        self.parameters = list(workload.model.named_parameters())
        self.grads: list = []
        self.unwritten: tuple | None = None
        self.steps = 0
        workload.optimizer.register_step_pre_hook(self._before_optimizer_step)
        workload.optimizer.register_step_post_hook(lambda *_: self.capture.optimizer_step_ends(self.parameters))

    def _before_optimizer_step(self, *_: object) -> None:
        from verify.capture.tensor_stats import summarize

        with torch.no_grad(), self.capture.paused():
            self.grads = [(name, summarize(p.grad, self.batch)) for name, p in self.parameters if p.grad is not None]
        self.capture.optimizer_step_begins()

    def run(self, steps: int) -> list[float]:
        """`steps` training steps under capture; the losses as recorded, once every step is written."""
        losses: list[float] = []
        with self.capture:
            for _ in range(steps):
                loss = self.workload.step()
                with torch.no_grad(), self.capture.paused():
                    loss_handle = self.batch.add(loss.float())
                    self._end_step(loss_handle, losses)
            self._write(losses)
        return losses

    def _end_step(self, loss_handle, losses: list[float]) -> None:
        step, self.steps = self.steps, self.steps + 1
        shipment, rows = self.batch.ship(), self.capture.close_step(step)
        previous, self.unwritten = self.unwritten, (step, shipment, rows, loss_handle, self.grads)
        if previous is not None:
            self._write_step(*previous, losses)
        if shipment.arrived():
            self._write(losses)

    def _write(self, losses: list[float]) -> None:
        unwritten, self.unwritten = self.unwritten, None
        if unwritten is not None:
            self._write_step(*unwritten, losses)

    def _write_step(self, step, shipment, rows, loss_handle, grads, losses: list[float]) -> None:
        from verify.capture.ops import step_columns
        from verify.record.schema import STAT_COLUMNS
        from verify.record.schema import GRADS_DIR, OPS_DIR

        fetched = shipment.read()
        losses.append(fetched(loss_handle)[0])
        self.writer.write_step_table(OPS_DIR, step, step_columns(step, rows, fetched))
        resolved = [stats.resolve(fetched) for _, stats in grads]
        self.writer.write_step_table(GRADS_DIR, step, {
            "step": [step] * len(grads), "param": [name for name, _ in grads],
            **{column: [values[column] for values in resolved] for column in STAT_COLUMNS},
        })


def plain_runner(workload: Workload) -> Callable[[int], None]:
    def run(steps: int) -> None:
        for _ in range(steps):
            workload.step()

    return run


def ours_runner(capture: BootstrapLikeCapture) -> Callable[[int], None]:
    return lambda steps: capture.run(steps) and None


def msprobe_runner(workload: Workload, out_dir: Path) -> Callable[[int], None] | str:
    """msprobe's documented usage (dump-and-compare.md §1), statistics task, L1; or why it cannot run here."""
    try:
        from msprobe.pytorch import PrecisionDebugger
    except Exception as error:  # not installed, or its own imports fail
        return f"msprobe does not import: {type(error).__name__}: {error}"
    out_dir.mkdir(parents=True, exist_ok=True)  # msprobe makes its dump_path, not the folder of its config
    config = out_dir / "config.json"
    config.write_text(json.dumps({
        "task": "statistics", "dump_path": str(out_dir / "dump"), "rank": [], "step": [], "level": "L1",
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }))
    debugger = PrecisionDebugger(config_path=str(config))

    def run(steps: int) -> None:
        for _ in range(steps):
            debugger.start(model=workload.model)
            workload.step()
            debugger.stop()
            debugger.step()

    return run


def ms_per_step(run: Callable[[int], None], steps: int) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    run(steps)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps * 1e3


def launches_per_step(run: Callable[[int], None], steps: int) -> tuple[float, float]:
    """(kernels, copies and fills) the device ran per step over one block, by torch.profiler: the count that
    explains most of the capture's cost, as each launch costs host time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        run(steps)
        torch.cuda.synchronize()
    on_device = [event.name for event in profiled.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    copies = sum(name.startswith(("Memcpy", "Memset")) for name in on_device)
    return (len(on_device) - copies) / steps, copies / steps


def interleaved_medians(runners: dict[str, Callable[[int], None]], steps: int, rounds: int) -> dict[str, float]:
    for run in runners.values():  # warm-up: cuDNN/cuBLAS plans, the allocator, lazy imports, first-call caches
        run(3)
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            samples[name].append(ms_per_step(run, steps))
    return {name: statistics.median(values) for name, values in samples.items()}


def bench(name: str, rounds: int, out_dir: Path) -> None:
    device = torch.device("cuda")
    ours = BootstrapLikeCapture(make_workload(name, device), out_dir / name / "ours")
    runners: dict[str, Callable[[int], None]] = {
        "plain": plain_runner(make_workload(name, device)),
        "ours": ours_runner(ours),
        "ours, torch reductions": ours_runner(
            BootstrapLikeCapture(make_workload(name, device), out_dir / name / "torch", fused=False)),
    }
    msprobe = msprobe_runner(make_workload(name, device), out_dir / name / "msprobe")
    if callable(msprobe):
        runners["msprobe"] = msprobe
    steps = STEPS_PER_BLOCK[name]
    medians = interleaved_medians(runners, steps, rounds)
    plain = medians["plain"]
    ratio = medians["ours"] / plain
    print(f"{name}: median of {rounds} interleaved blocks of {steps} steps")
    print(f"  plain step            {plain:8.2f} ms")
    print(f"  verify stats capture  {medians['ours']:8.2f} ms  {ratio:5.2f}x plain  (target <= {TARGET_RATIOS[name]}x)")
    unfused = medians["ours, torch reductions"]
    print(f"    without the fused kernels {unfused:8.2f} ms  {unfused / plain:5.2f}x plain")
    print(f"    {ours.batch.device_stats.fused.note or 'no large floating tensor on CUDA'}")
    for variant, run in runners.items():
        kernels, copies = launches_per_step(run, steps)
        print(f"  device launches per step, {variant}: {kernels:.0f} kernels, {copies:.0f} copies and fills")
    if not callable(msprobe):
        print(f"  msprobe statistics    skipped: {msprobe}")
        return
    msprobe_ratio = medians["msprobe"] / plain
    share = (ratio - 1) / (msprobe_ratio - 1) if msprobe_ratio > 1 else float("inf")
    print(f"  msprobe statistics    {medians['msprobe']:8.2f} ms  {msprobe_ratio:5.2f}x plain")
    print(f"  our overhead / msprobe's: {share:.2f}  (target <= {TARGET_SHARE_OF_MSPROBE:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed blocks per variant")
    parser.add_argument("--models", nargs="+", choices=list(STEPS_PER_BLOCK), default=list(STEPS_PER_BLOCK))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_capture_gpu: no CUDA device here (torch.cuda.is_available() is False); nothing measured. "
              "Run it on a GPU machine; tests/perf/bench_capture.py measures the CPU.")
        return 0
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as out_dir:
        for name in args.models:
            bench(name, args.rounds, Path(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
