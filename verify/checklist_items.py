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
