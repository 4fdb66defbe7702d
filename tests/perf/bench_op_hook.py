"""What an op costs the host when a dispatch mode's handler is C++ instead of Python (issue 57's probe, now the capture's
compiled op hook).

    PYTHONPATH=. python tests/perf/bench_op_hook.py [--rounds 7] [--models mlp cnn gpt]

The capture is a TorchDispatchMode: torch hands it every aten op below autograd through its Python-key fallback,
which converts the op's stack to Python objects and calls `__torch_dispatch__` (~5-13 us an op, bench_capture_host.py's
"an empty Python dispatch mode costs ~7 us per op"). verify/capture/_op_hook.cpp (built by verify/capture/op_hook.py
against the installed torch, or taken from its cache) serves the ops a mode hands it in C++ at that same place
(torch's interpreter vtable, its `dispatch` and `detach`), so that it sees the ops the Python handler sees. This times,
on bench_capture_host.py's tiny models (batch 1, widths of a few units: kernels of a few microseconds), one torch
thread, least of interleaved blocks of CPU seconds: the plain step; under an empty Python mode
(`func(*args, **kwargs)`); under the same mode handing every op to the hook at its first call. Printed per model: the
ops each serves a step (the Python handler also sees the detaches autograd makes of saved tensors while a mode is on,
which the hook leaves to TensorImpl, as with no mode), and each one's host cost per op. Then it checks that the three
give the same losses, bit for bit.

Printed by its first version (tests/perf/op_hook_probe.cpp, the same vtable copy serving every op of the mode) on the
shared 2-core development machine (torch 2.13 CPU, a CI run beside it), us per op:
            ops a step (Python, C++)    empty Python mode    served in C++
    mlp     164, 148                    6.47                 1.17
    cnn     103, 95                     9.13                 2.19
    gpt     532, 526                    7.02                 1.35
At the two ends of the torch range (CI's venvs, CUDA builds on the CPU, least of 3 blocks), us per op, Python / C++:
    torch 2.4.1     mlp 5.51 / 1.20 (183 / 148 ops)    gpt 7.94 / 2.12 (562 / 526 ops)
    torch 2.14.1    mlp 9.73 / 1.50 (164 / 148 ops)    gpt 10.60 / 1.70 (532 / 526 ops)
One source builds against both (20-70 s); the losses are the same, bit for bit, under the three.
A recorded call of the capture is two or three ops: the plumbing alone is ~15-25 us of it in Python, ~3-5 us in C++,
which is what makes issue 57's 15 us a recorded call reachable, with the statistics computed in C++ too.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).parent))  # the benches beside this file
from bench_capture_host import STEPS_PER_BLOCK, tiny_models_arguments, tiny_workload

from verify.capture import op_hook


class EmptyMode(TorchDispatchMode):
    """Runs each op as it comes, counting the calls its Python handler sees: the least a Python dispatch mode does.
    Given the op hook, it hands each op over at its first call, as the capture hands over the ops it never records."""

    ops = 0

    def __init__(self, hook=None) -> None:
        super().__init__()
        self.hook = hook

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        EmptyMode.ops += 1
        if self.hook is not None:
            self.hook.pass_through(self, func)
        return func(*args, **(kwargs or {}))


def runners(name: str, served: EmptyMode) -> dict[str, Callable[[int], list[float]]]:
    def variant(mode: TorchDispatchMode | None) -> Callable[[int], list[float]]:
        workload = tiny_workload(name)  # the same seed each: the same losses, bit for bit

        def run(steps: int) -> list[float]:
            losses = []
            if mode is not None:
                mode.__enter__()
            try:
                for _ in range(steps):
                    losses.append(workload.step())
            finally:
                if mode is not None:
                    mode.__exit__(None, None, None)
            return losses

        return run

    return {"plain": variant(None), "empty Python mode": variant(EmptyMode()), "served in C++": variant(served)}


def first_losses(run: Callable[[int], list[float]]) -> tuple[float, ...]:
    torch.manual_seed(1)  # the draws of dropout from the same state for each
    return tuple(float(loss) for loss in run(3))


def ops_per_step(run: Callable[[int], list[float]], count: Callable[[], int]) -> int:
    before = count()
    run(1)
    return count() - before


def bench(name: str, rounds: int, hook, served: EmptyMode) -> bool:
    variants = runners(name, served)
    losses = {variant: first_losses(run) for variant, run in variants.items()}  # the warm-up, and the check
    seen = {"empty Python mode": ops_per_step(variants["empty Python mode"], lambda: EmptyMode.ops),
            "served in C++": ops_per_step(variants["served in C++"], lambda: hook.counts()[0])}
    steps = STEPS_PER_BLOCK[name]
    least = dict.fromkeys(variants, float("inf"))
    for _ in range(rounds):  # interleaved blocks: on a shared machine the neighbours only ever add time
        for variant, run in variants.items():
            started = time.process_time()
            run(steps)
            least[variant] = min(least[variant], (time.process_time() - started) / steps)
    plain = least.pop("plain")
    print(f"{name}: least of {rounds} interleaved blocks of {steps} steps; plain step {plain * 1e6:.0f} us")
    for variant, seconds in least.items():
        print(f"  {variant:18} {seen[variant]:5} ops a step  {seconds * 1e6:8.0f} us/step  "
              f"{(seconds - plain) / seen[variant] * 1e6:6.2f} us per op")
    same = len(set(losses.values())) == 1
    print(f"  losses of the three, bit for bit: {'the same' if same else 'DIFFERENT'}")
    return same


def main() -> int:
    args = tiny_models_arguments(__doc__, rounds=7)
    torch.set_num_threads(1)
    hook = op_hook.hook()
    if hook is None:
        print(f"the op hook cannot be built here: {op_hook.why_not()}")
        return 1
    print(f"torch {torch.__version__}, {op_hook.library_path().name}")
    same = []
    for name in args.models:
        served = EmptyMode(hook)
        hook.serve(served)  # its ops served in C++ while it is on top; every other mode's go to Python as before
        try:
            same.append(bench(name, args.rounds, hook, served))
        finally:
            hook.unserve(served)
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
