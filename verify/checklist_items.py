"""What `migrate` and `verify` must agree on: the port's name (migrate writes it, verify finds it), the accuracy
checklist's items (C1..C9: what Ascend's porting guide asks to rule out before accuracy tuning) and where migrate writes
them (migrate builds the checklist, verify fills in C1 and shows it in its reports). Standard library only, so that
verify reads them without loading migrate, the rules or libcst.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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


# The Markdown both tools write (migrate's report.md and checklist.md, verify's adaptation.md) quotes what scripts,
# file names and crash messages hold: escaped here, so that a quoted "## Verdict" or "<script>" stays text.
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#~!&])")
_BLOCK_START = re.compile(r"^(\s*(?:\d+(?=[.)]))?)([-+=.)])")  # what would open a list or underline a heading at a line's start


def markdown_text(text: object) -> str:
    """`text` as Markdown that shows it as it is, on one line (a table cell's `|`: `markdown_row`)."""
    flat = _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))
    return _BLOCK_START.sub(lambda start: start[1] + "\\" + start[2], flat)


def markdown_code(text: object, block: bool = False) -> str:
    """`text` as an inline code span on one line, or a fenced `block` of its lines: fenced by more backticks than it
    holds in a row, so that nothing in it closes the fence."""
    text = str(text) if block else " ".join(str(text).splitlines())
    longest = max(map(len, re.findall("`+", text)), default=0)
    if block:
        fence = "`" * max(3, longest + 1)
        return f"{fence}\n{text}\n{fence}"
    pad = " " if text[:1] == "`" or text[-1:] == "`" else ""
    return f"{'`' * (longest + 1)}{pad}{text}{pad}{'`' * (longest + 1)}"


def markdown_row(cells: Iterable[object]) -> str:
    """A table row of cells already in Markdown: a `|` in one (inside code too) is escaped, as GFM reads it."""
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"
