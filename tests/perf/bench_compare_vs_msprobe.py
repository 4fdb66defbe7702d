"""A real 20-step comparison end to end, next to msprobe's compare of the same runs exported to its format.

Runs samples/grad_accum_clip for 20 steps twice (original on the CPU, its migrate port on the emulated NPU), then
times `verify compare` on the two run directories, and `msprobe compare` on the same data written by
`verify export --msprobe` (msprobe compares one step per invocation, so it runs once per step). msprobe runs from a
separate virtualenv given by --msprobe-python (default /tmp/msprobe-venv/bin/python); without one, its part is
skipped with a message. Usage: python tests/perf/bench_compare_vs_msprobe.py [--steps 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from migrate.engine import migrate_source
from rules import Settings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "grad_accum_clip"


def verify(*args: str) -> float:
    """Seconds one `verify` command takes (it must succeed or report FAIL: exit 0 or 1)."""
    start = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("verify")), *args], capture_output=True, text=True)
    if done.returncode not in (0, 1):
        sys.exit(f"verify {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start


def msprobe_compare(python: Path, ref: Path, actual: Path, out: Path) -> float | None:
    """Seconds msprobe takes to compare every exported step, one invocation per step."""
    if not python.exists():
        print(f"msprobe: skipped, no virtualenv with mindstudio-probe at {python}")
        return None
    start = time.perf_counter()
    for step in sorted(path.name for path in ref.iterdir()):
        golden, target = next((ref / step).glob("*/dump.json")), next((actual / step).glob("*/dump.json"))
        command = [str(python.with_name("msprobe")), "compare", "-tp", str(target), "-gp", str(golden), "-o", str(out)]
        subprocess.run(command, capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--msprobe-python", type=Path, default=Path("/tmp/msprobe-venv/bin/python"))
    options = parser.parse_args()
    config = tomllib.loads((SAMPLE / "verify.toml").read_text())
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        original, port = work / "train.py", work / "train_npu.py"
        original.write_text((SAMPLE / "train_gpu.py").read_text())
        port.write_text(migrate_source(original.read_text(), str(original), Settings()).code)
        args = ["--", *config["args"], "--epochs", "10"]
        steps = ["--steps", str(options.steps)]
        verify("run", str(port), *steps, "--device", "emulated-npu", "-o", str(work / "actual"), *args)
        verify("run", str(original), *steps, "--device", "cpu", "--autocast", "fp16", "-o", str(work / "ref"), *args)
        ours = verify("compare", str(work / "ref"), str(work / "actual"), "-o", str(work / "report"))
        for side in ("ref", "actual"):
            verify("export", "--msprobe", str(work / side), str(work / f"msprobe-{side}"))
        theirs = msprobe_compare(options.msprobe_python, work / "msprobe-ref", work / "msprobe-actual", work / "ms")
    print(f"{options.steps}-step comparison of one training, end to end (wall seconds, process start included)")
    print(f"verify compare (all steps, one command, reports included)  {ours:8.2f} s")
    if theirs is not None:
        print(f"msprobe compare (one command per step)                     {theirs:8.2f} s   ratio {theirs / ours:.1f}x")


if __name__ == "__main__":
    main()
