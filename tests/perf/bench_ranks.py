"""Cost of a run of 2 ranks against 1 rank of the same steps (issue 21: within 3x), measured in one run and printed
as a ratio: `verify run --nproc-per-node N` of tests/verify/scripts/ddp_torchrun_npu.py (DDP, a DistributedSampler,
hccl on the emulated NPU: gloo stands in) with the capture on, whole processes (the launcher, torch's import in every
rank, the steps, the records), alternated and the medians compared, as the machine is shared.

    python tests/perf/bench_ranks.py [--steps 40] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from verify.launch.runner import RunOptions, run_script
from verify.record.store import read_run

SCRIPT = Path(__file__).resolve().parents[1] / "verify" / "scripts" / "ddp_torchrun_npu.py"
TARGET_RATIO = 3.0


def timed_run(ranks: int, steps: int, folder: Path) -> float:
    """Wall seconds of one `verify run` of `ranks` ranks; checks that every rank ran the steps."""
    options = RunOptions(steps=steps, nproc_per_node=ranks, extra_env={"OMP_NUM_THREADS": "1"})
    started = time.perf_counter()
    run_dir = run_script(SCRIPT, ["1000", "4"], options, folder / f"ranks{ranks}")
    wall = time.perf_counter() - started
    run = read_run(run_dir)
    assert run.manifest.status == "ok" and len(run.ranks) == ranks, run.manifest.message
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    walls: dict[int, list[float]] = {1: [], 2: []}
    for round_number in range(options.rounds):
        for ranks in (1, 2):
            with tempfile.TemporaryDirectory() as folder:
                walls[ranks].append(timed_run(ranks, options.steps, Path(folder)))
        print(f"round {round_number + 1}: 1 rank {walls[1][-1]:.2f} s, 2 ranks {walls[2][-1]:.2f} s", flush=True)
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"{options.steps} steps on {os.cpu_count()} cores, medians of {options.rounds}: 1 rank {one:.2f} s, "
          f"2 ranks {two:.2f} s: {two / one:.2f}x (target {TARGET_RATIO:g}x)")


if __name__ == "__main__":
    main()
