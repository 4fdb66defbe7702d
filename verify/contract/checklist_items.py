"""The accuracy checklist's items (C1..C9: what Ascend's porting guide asks to rule out before accuracy tuning), which
migrate builds into its report folder's checklist.json and checklist.md and verify fills in (C1) and shows in its
reports, and the Markdown escaping of quoted text that migrate's report.md and checklist.md and verify's adaptation.md
share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum


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
