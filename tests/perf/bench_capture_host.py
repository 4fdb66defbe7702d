"""Host (Python) cost of the capture per recorded call, measured on the CPU where kernels cost next to nothing.

    PYTHONPATH=. python tests/perf/bench_capture_host.py [--rounds 5] [--models mlp cnn gpt]

On a GPU the device runs asynchronously, so whatever the capture does in Python per recorded call is on the critical
path of the step: bench_capture_gpu.py measures the step times there. This measures that Python cost without a GPU:
an MLP, and the models of bench_capture_gpu.py at tiny sizes (batch 1, widths of a few units, so that each op's
kernel costs a few microseconds), captured as bench_capture_gpu.py's BootstrapLikeCapture captures them but with the
CPU tensors sent the device's way (StatBatch(device_path_on_cpu=True): copies kept and reduced together at the ship,
no C extension), inside the keyed random streams every run enters (verify/capture/random_streams.py, itself a
dispatch mode), each call's line named. One torch thread; CPU seconds of the process; blocks of steps interleaved
between the variants, the least block of each compared (the neighbours on a shared machine only ever add time).
Printed per model: the plain step, then each variant's step and its cost per recorded call (its step minus the plain
one, over the calls the capture recorded per step): the keyed streams alone, the capture alone, and both, as a run
has them.

Measured on the shared 2-core development machine (torch 2.13 CPU), this file run against the capture before and
after issue 34b's cuts, alternated twice (least of 5 blocks each; the neighbours move single figures by +-20%), us
per recorded call:
            capture alone        capture and keyed streams (as a run)
    mlp     38, 42 -> 40, 38     66, 77 -> 55, 50
    cnn     66, 56 -> 57, 52     99, 99 -> 66, 67
    gpt     71, 54 -> 79, 55    130, 105 -> 97, 81
The cut is the keyed streams' mode no longer seeing the device path's own ops (tensor_stats.BelowDispatchModes).

Issue 57's first cut, the keyed streams' mode served by the capture's handler (ops.ServedInline), this file run
against the capture before and after it, alternated twice (least of 7 blocks each), us per recorded call:
            capture and keyed streams (as a run)    what the keyed streams add to the capture alone
    mlp     137, 80 -> 79, 82                       33, 19 -> -5, 15
    cnn     120, 137 -> 112, 112                    13, 32 -> 22, 7
    gpt     140, 145 -> 111, 124                    39, 35 -> 19, 20
What is left is their module hooks and the seeded ops they draw for. The capture alone, 62-110 us here, is the bulk:
an empty Python dispatch mode costs ~7 us per op (and a recorded call is two or three ops, views and the detaches
autograd makes only while a mode is on), its statistics ~6 us per tensor on the device path, the step's columns and
record batches ~1-2 ms per step; issue 57's 15 us needs the per-op path compiled, below Python.

Issue 57's second cut, the capture's __torch_dispatch__ entry in C (verify/capture/_dispatch.c: the ops never recorded,
105 of the MLP's 164 a step, pass straight to torch), against the Python handler alone in one process, alternated
(least of 9 blocks each, quiet machine, two runs), us per recorded call, capture and keyed streams:
    mlp     67.8, 70.7 -> 66.4, 65.6
    cnn     98.4, 98.4 -> 97.0, 96.3
    gpt    108.5, 110.1 -> 108.9, 107.7
A few percent at most: torch's Python-key plumbing costs ~2.7 us an op even for a handler in C (an empty Python
mode's op 4.97 us, a C handler's 3.83, plain 1.16), and a recorded call's ~50 us stay in Python.

Issue 57's third cut, the step's own host work (parameters and gradients copied in one cat per dtype, op keys by one
format each, the manifest's JSON without a deep copy): this file for the code before and after it, the two processes
run at once three times (one core each, the same neighbours; a noisy day, single figures moved by 30% from run to run),
us per recorded call, capture alone / capture and keyed streams:
            before                          after
    mlp     102/95, 62/90, 108/111          108/109, 59/72, 98/109
    cnn     145/139, 88/113, 150/181        127/166, 78/93, 144/172
    gpt     110/169, 105/140, 144/195       102/134, 102/129, 143/193
Within the noise, a few percent: a step's ~70-100 recorded calls pay ~1-3 ms of per-step work, the rest is per op.

Issue 57's fourth cut, the compiled op hook (verify/capture/_op_hook.cpp: ops never recorded, autograd's detaches and
the keyed streams' other ops passed in C++, recorded ops that write no argument run there and handed to the Python
recording), this file's "both, without the op hook" (the C entry) against "capture and keyed streams" in one run, us
per recorded call (least of 5 blocks; the shared machine moved single figures by 15% from run to run):
            torch 2.13 CPU                        torch 2.14.1 (CUDA build on the CPU, 3 blocks)
    mlp     67.8 -> 58.1 (keyed alone 3.4)       92.9 -> 74.1
    cnn     93.0 -> 79.8 (keyed alone 9.6)
    gpt     88.3 -> 67.4 (keyed alone 6.9)       126.2 -> 110.2
The keyed streams alone cost 13-33 us per recorded call before (their mode's Python handler saw every op, the
optimizer's among them). What is left is Python's: the recording itself (begin_call, producers, the device path's copy
and its PendingStats, ~25 us of a call), the step's end (the ship's reductions, the step's columns and record batch:
~12-17 us a call), the module hooks (~5 us). And the garbage collector: the capture's rows, alive until the step
ends, reach the oldest generation, and every ~160 steps of the tiny GPT a full collection of the process's ~430,000
tracked objects (torch's) takes ~155 ms (~10 us a call over those steps), which the plain run never pays; the least
of blocks above leaves it out. gc.freeze() would remove it, but would also keep any garbage cycle of the script's
that was alive at the freeze from ever being collected (a DataLoader iterator's worker shutdown among them): left to
the compiled recording, whose records hold no Python objects.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))  # the benches beside this file
from bench_capture import SmallCnn
from bench_capture_gpu import BootstrapLikeCapture, Gpt, Workload, _workload

from verify.capture.ops import dispatch_path

STEPS_PER_BLOCK = {"mlp": 40, "cnn": 40, "gpt": 20}


def tiny_workload(name: str, seed: int = 0) -> Workload:
    """Models of a few units' width, batch 1, on the CPU: each op's kernel costs a few microseconds."""
    torch.manual_seed(seed)
    if name == "mlp":
        model = nn.Sequential(*(layer for _ in range(8) for layer in (nn.Linear(8, 8), nn.Tanh())), nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        return _workload(model, optimizer, torch.randn(1, 8), torch.randn(1, 1), F.mse_loss)
    if name == "cnn":
        model = SmallCnn(widths=(4, 8), hidden=16, side=2)  # widths of a few units on 8x8 images
        inputs, targets = torch.randn(1, 3, 8, 8), torch.randint(0, 10, (1,))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return _workload(model, optimizer, inputs, targets, F.cross_entropy)
    if name == "gpt":
        model = Gpt(vocab=64, width=16, layers=2, heads=2, length=8)
        tokens = torch.randint(0, 64, (1, 9))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

        def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

        return _workload(model, optimizer, tokens[:, :-1], tokens[:, 1:], next_token_loss)
    raise ValueError(f"unknown model {name!r}")


def _keyed_streams() -> contextlib.AbstractContextManager:
    from verify.capture import random_streams

    return random_streams.keyed(lambda: 0, [])


def plain_runner(workload: Workload, keyed: bool = False) -> Callable[[int], None]:
    def run(steps: int) -> None:
        with _keyed_streams() if keyed else contextlib.nullcontext():
            for _ in range(steps):
                workload.step()

    return run


@contextlib.contextmanager
def _without_op_hook() -> Iterator[None]:
    """The capture as where verify/capture/_op_hook.cpp is not built: the C entry pip built, or Python alone."""
    from verify.capture import op_hook

    built = op_hook.hook
    op_hook.hook = lambda: None
    try:
        yield
    finally:
        op_hook.hook = built


def captured_runner(capture: BootstrapLikeCapture, keyed: bool, op_hook: bool = True) -> Callable[[int], None]:
    def run(steps: int) -> None:
        with _keyed_streams() if keyed else contextlib.nullcontext(), \
                contextlib.nullcontext() if op_hook else _without_op_hook():
            capture.run(steps)

    return run


def seconds_per_step(run: Callable[[int], None], steps: int) -> float:
    started = time.process_time()
    run(steps)
    return (time.process_time() - started) / steps


def calls_per_step(capture: BootstrapLikeCapture) -> int:
    """The calls the capture records in one step (the op calls and the updated parameters)."""
    rows = []
    capture.capture.close_step = lambda step, close=capture.capture.close_step: rows.append(close(step)) or rows[-1]
    try:
        capture.run(1)
    finally:
        del capture.capture.close_step
    return len({row.seq for row in rows[-1]})


def bench(name: str, rounds: int, out_dir: Path) -> None:
    capture, both, unhooked = (BootstrapLikeCapture(tiny_workload(name), out_dir / name / variant,
                                                    device_path_on_cpu=True) for variant in ("capture", "both", "cut"))
    runners = {
        "plain": plain_runner(tiny_workload(name)),
        "keyed streams alone": plain_runner(tiny_workload(name), keyed=True),
        "capture alone": captured_runner(capture, keyed=False),
        "capture and keyed streams": captured_runner(both, keyed=True),
        "both, without the op hook": captured_runner(unhooked, keyed=True, op_hook=False),
    }
    steps = STEPS_PER_BLOCK[name]
    for run in runners.values():  # warm-up: lazy imports, the allocator, first-call caches
        run(3)
    samples: dict[str, list[float]] = {variant: [] for variant in runners}
    for _ in range(rounds):
        for variant, run in runners.items():
            samples[variant].append(seconds_per_step(run, steps))
    # the least of the interleaved blocks: on a shared machine the neighbours only ever add time
    least = {variant: min(values) for variant, values in samples.items()}
    calls = calls_per_step(capture)
    plain = least.pop("plain")
    print(f"{name}: {calls} recorded calls per step, least of {rounds} interleaved blocks of {steps} steps "
          f"(op dispatch: {dispatch_path()})")
    print(f"  plain step {plain * 1e6:10.0f} us")
    for variant, seconds in least.items():
        per_call = (seconds - plain) / calls
        print(f"  {variant:26} {seconds * 1e6:10.0f} us/step  {per_call * 1e6:6.1f} us per recorded call")


def tiny_models_arguments(doc: str, rounds: int) -> argparse.Namespace:
    """The command line of a bench of the tiny models."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved timed blocks per variant")
    parser.add_argument("--models", nargs="+", choices=list(STEPS_PER_BLOCK), default=list(STEPS_PER_BLOCK))
    return parser.parse_args()


def main() -> int:
    args = tiny_models_arguments(__doc__, rounds=5)
    print(f"torch {torch.__version__}")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out_dir:
        for name in args.models:
            bench(name, args.rounds, Path(out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
