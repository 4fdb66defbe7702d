"""Whole-process cost of `verify run` on the CPU: the small CNN of bench_capture.py as a script of its own, run
plainly and under `verify run --device cpu` (its defaults: statistics of every op, keyed random draws, a run folder
written step by step, the manifest included), printed as a ratio of the cost per step.

    python tests/perf/bench_verify_run.py [--steps 30 150] [--rounds 3]

bench_capture.py measures the capture inside one process; this measures what a user waits for, the child process
verify starts and everything it writes. Each side runs at two step counts, and the cost per step is the difference of
their CPU seconds over the difference of their steps: the start-up (imports, the model's build, verify's set-up) cancels
out, and is printed apart. CPU seconds of the child processes (getrusage), whose neighbours on a shared machine add
little; the rounds are interleaved and the least of each is taken. One torch thread (the script sets it).
Target: issue 57's whole `verify run` at most 2x the plain script (there on a GPU; here the CPU figure).
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

TARGET_RATIO = 2.0

SCRIPT = '''import sys

import torch

sys.path.insert(0, {perf!r})
from bench_capture import make_step

torch.set_num_threads(1)
_, _, step = make_step()
for _ in range(int(sys.argv[1])):
    step()
'''


def child_cpu_seconds(command: list[str], cwd: Path) -> float:
    """CPU seconds (user and system) of `command` and the processes it waited for."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stdout + done.stderr)[-3000:]
        raise SystemExit(f"{' '.join(command)} exited with {done.returncode}:\n{said}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def commands(script: Path, out: Path) -> dict[str, Callable[[int, int], list[str]]]:
    """Per side, the command line of the `repeat`-th run of `steps` steps (each verify run into a folder of its own)."""
    return {
        "plain": lambda steps, repeat: [sys.executable, str(script), str(steps)],
        "verify run": lambda steps, repeat: [
            sys.executable, "-m", "verify", "run", str(script), "--device", "cpu", "-q", "-n", str(steps),
            "-o", str(out / f"run{steps}-{repeat}"), "--", str(steps)],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=(30, 150), help="the two step counts")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per side and step count")
    args = parser.parse_args()
    few, many = args.steps
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        script = folder / "train.py"
        script.write_text(SCRIPT.format(perf=str(Path(__file__).resolve().parent)))
        sides = commands(script, folder)
        least: dict[tuple[str, int], float] = {}
        for repeat in range(args.rounds):
            for side, command in sides.items():
                for steps in (few, many):
                    seconds = child_cpu_seconds(command(steps, repeat), folder)
                    least[side, steps] = min(least.get((side, steps), seconds), seconds)
    per_step = {side: (least[side, many] - least[side, few]) / (many - few) for side in sides}
    print(f"CPU seconds of whole processes, least of {args.rounds} interleaved rounds; per step from {few} and {many} "
          "steps")
    for side in sides:
        start = least[side, few] - few * per_step[side]
        print(f"  {side:10} {per_step[side] * 1e3:8.2f} ms per step   start-up {start:6.2f} s")
    ratio = per_step["verify run"] / per_step["plain"]
    print(f"verify run / plain per step: {ratio:.2f}x  (target <= {TARGET_RATIO}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
