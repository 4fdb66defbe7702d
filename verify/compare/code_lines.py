"""The lines of the two scripts behind an op finding: the port's line that made the op (ops.source), the original's
line it pairs with, and the rewrite of migrate's behind the port's line, or the user's own edit.

The original's line is paired through migrate's diff where the port's report folder lies beside the port
(verify/record/migration.py); else it is the line the paired reference record names (the op's position). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.record.migration import LineOrigin, PortLines, read_port_lines
from verify.record.store import Run

CONTEXT_LINES = 3  # each side of the line, in the side-by-side view


def _split(source: Any) -> tuple[str, int] | None:
    """("train.py", 55) of "train.py:55"; None for a record without a line (missing, "", an msprobe dump)."""
    if not isinstance(source, str) or ":" not in source:
        return None
    path, _, line = source.rpartition(":")
    return (path, int(line)) if line.isdigit() else None


@dataclass
class Placement:
    """Where a finding's op was made in each script, and what made the port's line."""

    port: str  # "train_npu.py:57"
    original: str  # "train.py:55"; "" where no line pairs with it
    paired_by: str  # "migrate's diff" or "position"
    rewrites: list[str] = field(default_factory=list)  # "AMP101: forward and loss run under float16 autocast"
    codes: list[str] = field(default_factory=list)  # the rule codes of `rewrites`, each once
    user_edit: bool = False
    context: dict[str, list[list[Any]]] = field(default_factory=dict)  # side -> [[line number, text], ...]

    @property
    def words(self) -> str:
        """" at train_npu.py:57 (original train.py:55)", as the finding's message says it."""
        return f" at {self.port}" + (f" (original {self.original})" if self.original else "")

    @property
    def origin_words(self) -> str:
        """What made the port's line, as the end of the finding's message ("" a line migrate carried over)."""
        if self.rewrites:
            return f"; that line is migrate's rewrite, {self.rewrites[0]}"
        if self.user_edit:
            return "; that line is your own edit of the port (not migrate's)"
        return ""

    def as_detail(self) -> dict[str, Any]:
        return {"port": self.port, "original": self.original, "paired_by": self.paired_by, "rewrites": self.rewrites,
                "codes": self.codes, "user_edit": self.user_edit, "context": self.context}


class CodeLines:
    """The two scripts of a comparison, read once: `place()` a pair of op records."""

    def __init__(self, ref: Run, actual: Run) -> None:
        self._original_dir = ref.manifest.files_root if ref.manifest.script else None
        self._port_script = Path(actual.manifest.script) if actual.manifest.script else None
        self._port_dir, self._port_name = actual.manifest.files_root, actual.manifest.script_in_root
        self._port_lines: PortLines | None = None
        if self._port_script is not None and ref.manifest.script:
            self._port_lines = read_port_lines(Path(ref.manifest.script), self._port_script)
        self._original_name = ref.manifest.script_in_root
        self._texts: dict[Path, list[str] | None] = {}

    def place(self, ref_source: Any, actual_source: Any) -> Placement | None:
        """The lines behind a pair of records (the port's `actual_source`, the original's `ref_source`)."""
        port = _split(actual_source)
        if port is None or self._port_script is None:
            return None
        origin = self._origin(*port)
        original = _split(ref_source)
        if origin is not None and origin.original is not None:
            original, paired_by = (self._original_name, origin.original), "migrate's diff"
        else:
            paired_by = "position"
        rewrites = [rewrite.text for rewrite in origin.rewrites] if origin else []
        codes = list(dict.fromkeys(rewrite.code for rewrite in origin.rewrites)) if origin else []
        context = {"port": self._context(self._port_dir / port[0], port[1])}
        if original is not None and self._original_dir is not None:
            context["original"] = self._context(self._original_dir / original[0], original[1])
        return Placement(f"{port[0]}:{port[1]}", f"{original[0]}:{original[1]}" if original else "", paired_by,
                         rewrites, codes, bool(origin and origin.user_edit), context)

    def _origin(self, path: str, line: int) -> LineOrigin | None:
        """Migrate's record of the port script's line; None for another file or without migrate's report folder."""
        if self._port_lines is None or path != self._port_name:
            return None
        return self._port_lines.origin(line)

    def _context(self, path: Path, line: int) -> list[list[Any]]:
        """[[number, text], ...] of the lines around `line` of a script ([] where it cannot be read)."""
        if path not in self._texts:
            try:
                self._texts[path] = path.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):
                self._texts[path] = None
        text = self._texts[path] or []
        first, last = max(1, line - CONTEXT_LINES), min(len(text), line + CONTEXT_LINES)
        return [[number, text[number - 1]] for number in range(first, last + 1)]
