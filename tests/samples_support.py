"""The sample training scripts under samples/: where they are, what migrate should make of them, how to run them.

Each sample is a folder `samples/<name>/` with
    train_gpu.py            the original GPU script
    expected_transfer.py    golden `migrate` output in transfer mode
    expected_explicit.py    golden `migrate` output in explicit mode
    verify.toml             the short CPU run verify uses: args, steps, seed, [tolerances]
"""

from __future__ import annotations

import difflib
import functools
import os
import resource
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from migrate import Mode, Settings, migrate_source

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "samples"
SCRIPT = "train_gpu.py"
# Set to regenerate the golden files from the current rules instead of comparing against them.
UPDATE_GOLDEN = os.environ.get("UPDATE_GOLDEN") == "1"


@dataclass(frozen=True)
class Sample:
    name: str
    folder: Path

    @property
    def script(self) -> Path:
        return self.folder / SCRIPT

    def golden(self, mode: Mode) -> Path:
        return self.folder / f"expected_{mode.value}.py"

    def verify_config(self) -> dict:
        with open(self.folder / "verify.toml", "rb") as file:
            return tomllib.load(file)


def all_samples() -> list[Sample]:
    return [Sample(path.parent.name, path.parent) for path in sorted(SAMPLES_DIR.glob(f"*/{SCRIPT}"))]


@functools.lru_cache(maxsize=None)  # porting runs every rule: several tests share each result
def port(code: str, mode: Mode, path: str = SCRIPT) -> str:
    """What `migrate` makes of `code` as an entry script in `mode`."""
    return migrate_source(code, path, Settings(mode=mode, is_entry=True)).code


def assert_matches_golden(actual: str, golden: Path) -> None:
    """Compare with the golden file, or (UPDATE_GOLDEN=1) rewrite it; goldens are reviewed by hand when they change."""
    if UPDATE_GOLDEN:
        golden.write_text(actual, encoding="utf-8", newline="")
        return
    assert golden.exists(), f"{golden} is missing: create it with UPDATE_GOLDEN=1 and review it"
    expected = golden.read_bytes().decode("utf-8")  # bytes: line endings must match too
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True), str(golden), "migrate"))
        raise AssertionError(f"migrate output differs from the golden file (intended? UPDATE_GOLDEN=1):\n{diff}")


@dataclass(frozen=True)
class CpuRun:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float  # user + system time of the script and its children (data loader workers)
    wall_s: float


def run_on_cpu(script: Path, args: list[str], workdir: Path, hang_guard_s: float) -> CpuRun:
    """Run a training script as verify's CPU run does: no GPU visible, outputs and temp files under `workdir`.

    Killed after `hang_guard_s` of wall time (subprocess.TimeoutExpired): that only catches hangs, because on a
    shared machine wall time depends on the neighbours; the script's own cost is `cpu_s`.
    """
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "TMPDIR": str(workdir),
        # The machine is shared: one intra-op thread per run keeps parallel test runs from starving each other.
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=hang_guard_s,
    )
    wall_s = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return CpuRun(result.returncode, result.stdout, result.stderr, cpu_s, wall_s)
