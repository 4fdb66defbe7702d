"""A run read as evidence, as every command reads one (`verify compare`, `report`, `export`, the pair, `verify
determinism`): a verify run directory or an msprobe dump, never a damaged one (what it lacks or cannot read of what
its manifest promises is no evidence: CompareError, exit 2, never a verdict), and a reference's calibration runs,
never another's (verify/record/provenance.py). No torch.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from verify.errors import CompareError, RunDirError
from verify.record import msprobe, provenance, run_folders
from verify.record.store import Run, read_run


def read_run_directory(root: Path) -> Run:
    """A run directory via verify.record.store; what it had to skip is in the run's notes (shown in every report).
    A damaged one (Run.damage: it lacks or cannot read what its manifest promises) is no evidence: CompareError,
    exit 2, never a verdict."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the same problems come back as Run.notes
            run = read_run(root)
    except RunDirError as error:
        raise CompareError(f"{error} (and it is not an msprobe dump either)") from None
    if run.damage:
        raise CompareError(f"damaged run directory {root}: {'; '.join(run.damage)}; damaged evidence is not judged")
    return run


def read_side(path: Path) -> Run:
    """A verify run directory or an msprobe dump (any layout, see verify/record/msprobe.py)."""
    if not path.exists():
        raise CompareError(f"{path}: no such file or directory")
    if msprobe.is_msprobe_dump(path):
        return msprobe.read_dump(path)
    if not path.is_dir():
        raise CompareError(f"{path}: not a directory")
    return read_run_directory(path)


def read_calibrations(ref: Run, folders: list[Path] | None = None) -> list[Run]:
    """The reference's calibration runs: `folders`, else those a pair left beside it (none beside an msprobe dump);
    ProvenanceError (exit 2) for one that is not a calibration of this reference (verify/record/provenance.py)."""
    folders = run_folders.calibration_dirs(ref.root) if folders is None and ref.root.is_dir() else folders or []
    calibrations = [read_side(folder) for folder in folders]
    for calibration in calibrations:
        provenance.check_calibration(ref, calibration)
    return calibrations
