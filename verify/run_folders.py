"""Where verify's folders go and what they are called, in one place: a run directory (`verify run`), a pair's output
folder (`verify ORIGINAL PORTED`, `verify determinism`) and the folders inside it. The runner and the pair ask here;
what a run directory holds is verify/schema.py's.

    PAIR/ref/                  the reference's run directory
    PAIR/actual/               the port's
    PAIR/ref-under-autocast/   a reference that crashed under the port's autocast, kept as evidence
    PAIR/ref-fp32/             --amp-effect: the reference as written
    PAIR/amp-effect/           --amp-effect: its comparison's reports
    PAIR/run-1/, PAIR/run-2/   verify determinism: the two runs
"""

from __future__ import annotations

import time
from pathlib import Path

from verify.schema import VerifyFailure

REF = "ref"
ACTUAL = "actual"
REF_UNDER_AUTOCAST = "ref-under-autocast"
REF_FP32 = "ref-fp32"
AMP_EFFECT = "amp-effect"


class FolderInUse(VerifyFailure):
    """An output folder that already holds something: verify never writes into it (exit 2)."""


def determinism_run(number: int) -> str:
    return f"run-{number}"


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def default_run_dir(script: Path, device: str) -> Path:
    """`verify run` without -o: verify-runs/STEM-DEVICE-TIME in the working folder."""
    return Path("verify-runs") / f"{script.stem}-{device}-{_stamp()}"


def default_pair_dir(script: Path) -> Path:
    """A pair without -o: verify-out/STEM-TIME beside the original."""
    return script.parent / "verify-out" / f"{script.stem}-{_stamp()}"


def claim(folder: Path) -> Path:
    """`folder`, created, where it does not exist or is an empty folder."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise FolderInUse(f"{folder} already exists and is not an empty folder; choose another -o")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
