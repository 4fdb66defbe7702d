"""What `migrate` and `verify` must agree on: the port's name (migrate writes it, verify finds it), the accuracy
checklist's items (C1..C9: what Ascend's porting guide asks to rule out before accuracy tuning) and where migrate writes
them (migrate builds the checklist, verify fills in C1 and shows it in its reports). Standard library only, so that
verify reads them without loading migrate, the rules or libcst.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

# migrate writes the port of train.py as train_npu.py, and of src/ as src_npu/, beside the original.
PORT_SUFFIX = "_npu"


def port_name(original: Path, suffix: str = PORT_SUFFIX) -> Path:
    """Where `migrate ORIGINAL` writes the port by default, and where `verify ORIGINAL` looks for it (`migrate
    --suffix` names it otherwise)."""
    return original.with_name(f"{original.stem}{suffix}{original.suffix}")


def project_trees(original: Path, ported: Path) -> tuple[Path, Path] | None:
    """The folders at which the paths of a script and of its port part, the folders below them the same: minGPT/ and
    minGPT_npu/ for minGPT/projects/chargpt/chargpt.py and minGPT_npu/projects/chargpt/chargpt.py (`migrate minGPT`
    ports the project as one tree, naming the port's after the original's). None for scripts in one folder or in
    folders of other names."""
    a, b = original.resolve().parent, ported.resolve().parent
    while a != b and a.name == b.name and a.parent != a:
        a, b = a.parent, b.parent
    ported_tree = b.name.startswith(a.name) and b.name != a.name
    return (a, b) if ported_tree and not (a.is_relative_to(b) or b.is_relative_to(a)) else None


# migrate writes its reports into <port stem>_report/ beside the port, the checklist as checklist.json in it.
REPORT_SUFFIX = "_report"
CHECKLIST_JSON = "checklist.json"


class Status(str, Enum):
    PASSED = "Passed"
    FAILED = "Failed"
    NOT_CHECKED = "Not checked"


TITLES = {
    "C1": "The benchmark gives constant results (same seed, same loss)",
    "C2": "Mixed precision is enabled in the port",
    "C3": "The port is complete (runs on the NPU; hccl for distributed; mixed precision)",
    "C4": "Loss scaling is enabled (a dynamic scaler around backward and the optimizer step)",
    "C5": "The dataset is complete and the same on both sides",
    "C6": "Preprocessing has no resource-dependent setting; shuffling is seeded",
    "C7": "Sharding does not depend on file-system order; the sampler's epoch is set",
    "C8": "The training process is correct (zero_grad, no kept graphs, validation under no_grad/eval)",
    "C9": "Hyperparameters of the port equal the benchmark's",
}
