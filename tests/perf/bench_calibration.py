"""The pair's wall time with the reference's calibration run (issue 31: the default, one more run of the reference
under another rounding) and without it (--calibration-runs 0), on a bundled sample's faithful port, measured in one
run, alternated, medians compared and printed as a ratio. Whole `verify ORIGINAL PORT` commands in-process: both
sides and the calibration start their own child processes.

    python tests/perf/bench_calibration.py [--sample grad_accum_clip] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import typer
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/samples_support.py
from samples_support import port  # noqa: E402
from migrate import Mode  # noqa: E402
from verify.cli import app  # noqa: E402
from verify.cli.pair import route  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def timed_pair(sample: Path, folder: Path, calibration_runs: int) -> float:
    config = tomllib.loads((sample / "verify.toml").read_text())
    original, ported = folder / "train.py", folder / "train_npu.py"
    original.write_text((sample / "train_gpu.py").read_text())
    ported.write_text(port(original.read_text(), Mode.TRANSFER))
    argv = [str(original), str(ported), "-n", str(config["steps"]), "--seed", str(config["seed"]), "-q",
            "--calibration-runs", str(calibration_runs), "-o", str(folder / "out"), "--", *config["args"]]
    started = time.perf_counter()
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    wall = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="grad_accum_clip")
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    walls: dict[int, list[float]] = {0: [], 1: []}
    for round_number in range(options.rounds):
        for runs in (0, 1):
            with tempfile.TemporaryDirectory() as folder:
                walls[runs].append(timed_pair(SAMPLES / options.sample, Path(folder), runs))
        print(f"round {round_number + 1}: without calibration {walls[0][-1]:.2f} s, with {walls[1][-1]:.2f} s",
              flush=True)
    without, with_ = statistics.median(walls[0]), statistics.median(walls[1])
    print(f"{options.sample} on {os.cpu_count()} cores, medians of {options.rounds}: pair without calibration "
          f"{without:.2f} s, with one calibration run {with_:.2f} s: {with_ / without:.2f}x")


if __name__ == "__main__":
    main()
