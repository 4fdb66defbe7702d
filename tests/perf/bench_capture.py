"""Cost of per-op capture on one training step of a small CNN on CPU: plain, with verify's statistics capture, and
with Huawei msprobe's statistics dump (L1), measured in one run and printed as ratios.

    python tests/perf/bench_capture.py [--steps 20] [--rounds 9] [--msprobe-python /path/to/venv/bin/python]

msprobe runs in its own virtualenv (it pins other numpy/pandas versions and must never go into the project's):
    python -m venv /tmp/msprobe-venv && /tmp/msprobe-venv/bin/pip install torch==2.13.0 mindstudio-probe
The msprobe part is skipped, with a message, when that interpreter is missing or cannot import msprobe. It reruns
this file there with --worker msprobe, so the model, data and step are the same code on both sides.

The model and step are those of dump-and-compare.md §5-6 (conv 3->16 + BN + ReLU + pool, conv 16->32 + ReLU + pool,
fc 2048->64->10, SGD with momentum, batch 32x3x32x32, one torch thread), with a dropout (p=0.1) after fc1 so that
verify's keyed dropout masks (verify/capture/random_streams.py, on in every verify run) are part of what is measured. Times are CPU seconds of the process;
plain and instrumented blocks of steps are interleaved and the medians compared, as the machine is shared.
Targets: ours <= 1.5x plain, and our overhead <= 1/3 of msprobe's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGET_RATIO = 1.5
TARGET_SHARE_OF_MSPROBE = 1 / 3


class SmallCnn(nn.Module):
    """Two convolutions of `widths` channels (batch norm, pooling), then linear layers through `hidden` units; `side`
    is the feature maps' side after both poolings (a quarter of the images')."""

    def __init__(self, widths: tuple[int, int] = (16, 32), hidden: int = 64, side: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.conv2 = nn.Conv2d(widths[0], widths[1], 3, padding=1)
        self.fc1 = nn.Linear(widths[1] * side * side, hidden)
        self.fc2 = nn.Linear(hidden, 10)
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(self.dropout(F.relu(self.fc1(x.flatten(1)))))


def make_step() -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], float]]:
    torch.manual_seed(0)
    model = SmallCnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    inputs, targets = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def step() -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    return model, optimizer, step


def seconds_per_step(run_steps: Callable[[int], None], steps: int) -> float:
    """CPU seconds of this process per step: with one torch thread that is the work done, while wall time on a
    shared machine mostly measures the neighbours."""
    started = time.process_time()
    run_steps(steps)
    return (time.process_time() - started) / steps


def plain_runner() -> Callable[[int], None]:
    _, _, step = make_step()
    return lambda steps: [step() for _ in range(steps)] and None


def ours_runner(out_dir: Path, native: bool = True) -> Callable[[int], None]:
    """verify's capture as the bootstrap uses it: ops recorded during forward and backward, the parameters after
    optimizer.step() (not its ops one by one), one ship and one table write per step, dropout masks from the keyed
    stream, each call's line in this file (ops.source). native=False: statistics by
    torch's reductions, as where verify.capture._stats (the C extension) is not built."""
    import verify.capture.tensor_stats
    from verify.capture import random_streams
    from verify.capture.ops import OpCapture, step_columns
    from verify.capture.tensor_stats import StatBatch
    from verify.record.schema import OPS_DIR, DumpMode
    from verify.record.store import RunWriter

    model, optimizer, step = make_step()
    parameters = list(model.named_parameters())
    optimizer.register_step_pre_hook(lambda *_: capture.optimizer_step_begins())
    optimizer.register_step_post_hook(lambda *_: capture.optimizer_step_ends(parameters))
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = RunWriter(out_dir)
    batch = StatBatch()
    capture = OpCapture(DumpMode.STATS, batch, user_files=Path(__file__).parent)  # each call's line, as a run
    counter = iter(range(10**9))
    steps_done = [0]  # the step the keyed stream reads, as StepRecorder.steps_done
    extension = verify.capture.tensor_stats.native_stats

    def run(steps: int) -> None:
        verify.capture.tensor_stats.native_stats = extension if native else None
        try:
            with random_streams.keyed(lambda: steps_done[0], []), capture:  # the order of a run (session.py)
                for _ in range(steps):
                    step()
                    index = next(counter)
                    steps_done[0] = index + 1
                    with capture.paused():  # as StepRecorder._end_step, where the copy is done at once (CPU)
                        shipment, rows = batch.ship(), capture.close_step(index)
                        writer.write_step_table(OPS_DIR, index, step_columns(index, rows, shipment.read()))
        finally:
            verify.capture.tensor_stats.native_stats = extension

    return run


def msprobe_runner(out_dir: Path) -> Callable[[int], None]:
    """msprobe's documented usage (dump-and-compare.md §1): start/stop/step around each step, statistics task, L1."""
    from msprobe.pytorch import PrecisionDebugger

    config = out_dir / "config.json"
    config.write_text(json.dumps({
        "task": "statistics", "dump_path": str(out_dir / "dump"), "rank": [], "step": [], "level": "L1",
        "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
    }))
    model, _, step = make_step()
    debugger = PrecisionDebugger(config_path=str(config))

    def run(steps: int) -> None:
        for _ in range(steps):
            debugger.start(model=model)
            step()
            debugger.stop()
            debugger.step()

    return run


def interleaved_medians(runners: dict[str, Callable[[int], None]], steps: int, rounds: int) -> dict[str, float]:
    for run in runners.values():  # warm-up: lazy imports, allocator, first-call caches
        run(3)
    samples: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            samples[name].append(seconds_per_step(run, steps))
    return {name: statistics.median(values) for name, values in samples.items()}


def measure_msprobe(python: str, steps: int, rounds: int) -> dict[str, float] | str:
    """Medians from the msprobe virtualenv, or the reason it could not run."""
    if not Path(python).exists():
        return f"no interpreter at {python}"
    command = [python, __file__, "--worker", "msprobe", "--steps", str(steps), "--rounds", str(rounds)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "MSPROBE_LOG_LEVEL": "3"})
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return json.loads(lines[-1])


def worker_msprobe(steps: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as out_dir:
        runners = {"plain": plain_runner(), "msprobe": msprobe_runner(Path(out_dir))}
        medians = interleaved_medians(runners, steps, rounds)
    print(json.dumps(medians))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved blocks per variant")
    parser.add_argument("--msprobe-python", default=os.environ.get("MSPROBE_PYTHON", "/tmp/msprobe-venv/bin/python"))
    parser.add_argument("--worker", choices=["msprobe"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.worker:
        worker_msprobe(args.steps, args.rounds)
        return
    import verify.capture.tensor_stats

    built = verify.capture.tensor_stats.native_stats is not None
    with tempfile.TemporaryDirectory() as out_dir:
        runners = {"plain": plain_runner(), "ours": ours_runner(Path(out_dir) / "ours")}
        if built:
            runners["torch reductions"] = ours_runner(Path(out_dir) / "torch", native=False)
        ours = interleaved_medians(runners, args.steps, args.rounds)
    ratio = ours["ours"] / ours["plain"]
    print(f"CPU time per step, median of {args.rounds} interleaved blocks of {args.steps} steps")
    print(f"plain step            {ours['plain'] * 1e3:8.2f} ms")
    how = ("one-pass C statistics (verify.capture._stats)" if built
           else "torch reductions: verify.capture._stats is not built here")
    print(f"verify stats capture  {ours['ours'] * 1e3:8.2f} ms  {ratio:5.2f}x plain  "
          f"(target <= {TARGET_RATIO}x; {how})")
    if built:
        slower = ours["torch reductions"]
        print(f"  with torch reductions {slower * 1e3:6.2f} ms  {slower / ours['plain']:5.2f}x plain  "
              "(without the C extension)")
    msprobe = measure_msprobe(args.msprobe_python, args.steps, args.rounds)
    if isinstance(msprobe, str):
        print(f"msprobe statistics    skipped: {msprobe}")
        return
    msprobe_ratio = msprobe["msprobe"] / msprobe["plain"]
    share = (ratio - 1) / (msprobe_ratio - 1)
    print(f"msprobe plain step    {msprobe['plain'] * 1e3:8.2f} ms  (its own process)")
    print(f"msprobe statistics    {msprobe['msprobe'] * 1e3:8.2f} ms  {msprobe_ratio:5.2f}x plain")
    print(f"our overhead / msprobe's: {share:.2f}  (target <= {TARGET_SHARE_OF_MSPROBE:.2f})")


if __name__ == "__main__":
    main()
