"""Where a recorded call was made in the user's own files: "train.py:55", the file relative to the script's folder.

Cheap by design: no stack is taken per op. The walk up from the dispatch hook stops at the first frame whose code
object lives in the script's folder (a few frames: torch.nn.functional, a library module's forward, then the user's
line), each code object is judged once (by id, the code kept alive so that its id is never reused), and each
(code, line) is formatted once.

A backward op names the forward line whose graph it differentiates. Autograd's anomaly mode would keep a stack per
node, at a cost paid by every op. Here each autograd node is known by its sequence number, which autograd hands out
as it creates a node for a forward op just before that op reaches the dispatch hook: so a recorded forward call that
finds the counter moved since the last one created node `counter - 1` (its own), and files its line under it; in
backward, `torch._C._current_autograd_node()` is the node being differentiated, whose number finds the line. A
backward op of no node filed (the engine's own work, a graph built where nothing was recorded) takes the Python
stack's line: the `loss.backward()` that runs it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import CodeType

import torch

import verify

_VERIFY = os.path.dirname(verify.__file__) + os.sep
next_node_number = torch._C._autograd._get_sequence_nr
current_node = torch._C._current_autograd_node


class SourceLines:
    """The innermost frame in the user's files (under one of `roots`: the run's view of the script's folder, and the
    folder itself, which a script may import from by an absolute path), interned per call site; "" where there is
    none (no root, or a call made from library code alone)."""

    def __init__(self, *roots: Path) -> None:
        self._roots = tuple(os.path.join(str(root), "") for root in roots)
        self._files: dict[int, tuple[CodeType, str | None]] = {}  # id(code) -> (code, path relative to root or None)
        self._lines: dict[tuple[int, int], str] = {}  # (id(code), line) -> "path:line"
        self._nodes: dict[int, str] = {}  # an autograd node's sequence number -> the forward line that made it
        self._next_node = next_node_number()

    def _relative(self, code: CodeType) -> str | None:
        entry = self._files.get(id(code))
        if entry is None:
            name = code.co_filename
            root = next((root for root in self._roots if name.startswith(root)), None)
            mine = root is not None and not name.startswith(_VERIFY) and "site-packages" not in name
            entry = self._files[id(code)] = (code, os.path.relpath(name, root) if mine else None)
        return entry[1]

    def here(self) -> str:
        """The innermost line of the user's files on the Python stack."""
        frame = sys._getframe(1)
        files = self._files
        while frame is not None:  # most frames are judged already: their entry is read here, not by a call
            code = frame.f_code
            entry = files.get(id(code))
            relative = self._relative(code) if entry is None else entry[1]
            if relative is not None:
                key = (id(code), frame.f_lineno)
                line = self._lines.get(key)
                if line is None:
                    line = self._lines[key] = f"{relative}:{key[1]}"
                return line
            frame = frame.f_back
        return ""

    def forward(self) -> str:
        """A forward call's line, filed under the autograd node it made, if it made one."""
        line = self.here()
        number = next_node_number()
        if number != self._next_node:
            self._nodes[number - 1] = line
            self._next_node = number
        return line

    def backward(self) -> str:
        """A backward call's line: the forward line of the node it differentiates."""
        node = current_node()
        line = self._nodes.get(node._sequence_nr()) if node is not None else None
        return self.here() if line is None else line

    def discard_step(self) -> None:
        """A step's nodes are differentiated within it; numbers are not reused, so this only frees them."""
        self._nodes = {}
