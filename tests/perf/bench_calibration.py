"""The pair's wall time with the reference's calibration run (issue 31: the default, one more run of the reference
under another rounding) and without it (--calibration-runs 0), on a bundled sample's faithful port; and the pair's
wall time against its slowest side alone (`verify run` of the original, of the port: issue 32's target is 1.3x). The
port, the reference and its calibration run at once, each with its share of the cores, the reference following the
port's autocast and loss scales as it runs (an fp32 port with `--amp off`); three runs on a machine of two cores take
at least 1.5x one of them alone. Measured in one run, alternated, medians compared and printed as ratios. Whole commands in-process:
every run starts its own child process.

    python tests/perf/bench_calibration.py [--sample grad_accum_clip] [--rounds 3] [--amp fp16|bf16|off]
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

from migrate import Mode, Settings, migrate_source  # noqa: E402
from rules import AmpPolicy  # noqa: E402
from verify.cli import app  # noqa: E402
from verify.cli.pair import route  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def timed_pair(sample: Path, folder: Path, calibration_runs: int, amp: AmpPolicy) -> float:
    original, ported = _scripts(sample, folder, amp)
    return _timed(sample, [str(original), str(ported), "--calibration-runs", str(calibration_runs)], folder / "out")


def timed_side_alone(sample: Path, folder: Path, side: int, amp: AmpPolicy) -> float:
    """`verify run` of the original (side 0) or of the port (side 1)."""
    return _timed(sample, ["run", str(_scripts(sample, folder, amp)[side])], folder / f"alone-{side}")


def _scripts(sample: Path, folder: Path, amp: AmpPolicy) -> tuple[Path, Path]:
    """The sample and its port, with migrate's mixed precision (`amp`; off: an fp32 port)."""
    original, ported = folder / "train.py", folder / "train_npu.py"
    original.write_text((sample / "train_gpu.py").read_text())
    ported.write_text(migrate_source(original.read_text(), original.name,
                                     Settings(mode=Mode.TRANSFER, is_entry=True, amp=amp)).code)
    return original, ported


def _timed(sample: Path, command: list[str], out: Path) -> float:
    config = tomllib.loads((sample / "verify.toml").read_text())
    argv = [*command, "-n", str(config["steps"]), "--seed", str(config["seed"]), "-q", "-o", str(out),
            "--", *config["args"]]
    started = time.perf_counter()
    result = CliRunner().invoke(app, route(argv, typer.main.get_command(app)))
    wall = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="grad_accum_clip")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amp", default=AmpPolicy.FP16.value, choices=[policy.value for policy in AmpPolicy],
                        help="migrate's mixed precision for the port (off: an fp32 port)")
    options = parser.parse_args()
    sample, amp = SAMPLES / options.sample, AmpPolicy(options.amp)
    walls: dict[str, list[float]] = {"without": [], "with": [], "slowest alone": []}
    for round_number in range(options.rounds):
        for runs, name in ((0, "without"), (1, "with")):
            with tempfile.TemporaryDirectory() as folder:
                walls[name].append(timed_pair(sample, Path(folder), runs, amp))
        with tempfile.TemporaryDirectory() as folder:
            walls["slowest alone"].append(max(timed_side_alone(sample, Path(folder), side, amp) for side in (0, 1)))
        print(f"round {round_number + 1}: " + ", ".join(f"{name} {times[-1]:.2f} s" for name, times in walls.items()),
              flush=True)
    without, with_, alone = (statistics.median(walls[name]) for name in ("without", "with", "slowest alone"))
    print(f"{options.sample} (port amp {amp.value}) on {os.cpu_count()} cores, medians of {options.rounds}: pair "
          f"without calibration "
          f"{without:.2f} s, with one calibration run {with_:.2f} s: {with_ / without:.2f}x; the slowest side alone "
          f"{alone:.2f} s: the pair takes {with_ / alone:.2f}x it (target 1.3x)")


if __name__ == "__main__":
    main()
