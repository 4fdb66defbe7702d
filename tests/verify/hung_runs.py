"""Runs whose script hangs until verify's --timeout stops it: the tests of what verify does at its timeout.

verify's --timeout is a budget for the whole run ("kill the run after this many seconds"), counted from its start: it
also covers importing torch, starting the ranks and the steps before the hang, which a loaded machine stretches without
bound (on 2 cores at load 6-8, 2 ranks had made no step 15 s into their run), so no fixed timeout is both short and sure
to fall in the hang. `timed_out_in_the_hang` makes a test's command with a short timeout, and again with twice the
timeout while its runs say the timeout came too soon (before the script reached its hang, or before a run of the
command that was to end by itself had ended): such a run is no evidence of what verify does with a hang.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from verify.record.run_folders import rank_dirs
from verify.record.schema import LOG, Status
from verify.record.store import read_last_collective, read_manifest

Result = TypeVar("Result")

FIRST_TIMEOUT_S = 30.0  # 2 ranks start torch and make their 2 steps in 10-20 s on a shared machine at rest
# 30, 60, 120, 240 s: the last far beyond a loaded machine's start-up (2 ranks made their 2 steps in 24 s on 2 cores at
# load 6), after which the run is what the test judges, whatever it reached
LAST_TIMEOUT_S = 240.0


def timed_out_in_the_hang(command: Callable[[float, Path], Result], folder: Path,
                          timed_out_too_soon: Callable[[Path], bool]) -> tuple[Result, Path, float]:
    """`command(timeout, out)`, a verify command writing `out`, made into a new `out` under `folder` with a timeout
    doubled from FIRST_TIMEOUT_S while `timed_out_too_soon(out)`: its result, its `out` and the timeout it had."""
    timeout = FIRST_TIMEOUT_S
    while True:
        out = folder / f"timeout-{timeout:g}s"
        result = command(timeout, out)
        if timeout >= LAST_TIMEOUT_S or not timed_out_too_soon(out):
            return result, out, timeout
        timeout *= 2


def timed_out(run_dir: Path) -> bool:
    return read_manifest(run_dir).status == Status.TIMEOUT.value


def timed_out_before_printing(run_dir: Path, line: str) -> bool:
    """Whether the run timed out before its script printed `line`, the last it prints before it hangs."""
    return timed_out(run_dir) and line not in (run_dir / LOG).read_text(errors="replace")


def ranks_timed_out_before_their_hang(run_dir: Path) -> bool:
    """scripts/ddp_rank_fails.py's hang: whether the run timed out before rank 1 hung at step 2 and rank 0 waited in
    that step's all-reduce (the collective its rank folder records as called: rank_capture.LastCollective)."""
    folders = rank_dirs(run_dir)
    waiting = bool(folders) and read_last_collective(folders[0]).get("step") == 2
    return timed_out_before_printing(run_dir, "rank 1 hangs") or (timed_out(run_dir) and not waiting)
