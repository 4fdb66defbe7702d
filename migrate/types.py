"""What migrate makes of a source text and of a file: the per-file results that cross process boundaries.

Everything here is frozen and picklable. The vocabulary these carry (Finding, Settings, ...) is the rules' own,
in rules/framework/types.py (imported through `rules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from migrate.facts import FileFacts
from rules import Finding


class SourceError(Exception):
    """The source cannot be ported as it is (it does not parse); carries `path:line:col: message`."""

    def __init__(self, path: str, line: int, column: int, message: str):
        super().__init__(f"{path}:{line}:{column}: {message}")
        self.path, self.line, self.column, self.message = path, line, column, message


class FileStatus(str, Enum):
    CHANGED = "changed"
    UNCHANGED = "unchanged"
    SKIPPED = "skipped"  # not Python, or copied as is
    ERROR = "error"  # did not parse or could not be read or written


@dataclass(frozen=True)
class MigrationResult:
    """What the engine made of one source text."""

    original: str
    code: str
    findings: tuple[Finding, ...] = ()
    inference: bool = False  # read as an inference script: an entry script that never trains (rules.FileState)
    rules_run: tuple[str, ...] = ()  # the codes of the rules that had something to look at in it (PortRule.wants)

    @property
    def changed(self) -> bool:
        return self.code != self.original


@dataclass(frozen=True)
class FileResult:
    """What migrate did with one file: where it read, where it wrote, and why not."""

    source: str
    target: str | None
    status: FileStatus
    findings: tuple[Finding, ...] = ()
    diff: str = ""
    error: str = ""  # "path:line:col: message" for files that could not be ported
    facts: FileFacts | None = None  # what the checklist reads from the original and ported text
    inference: bool = False  # read as an inference script (MigrationResult.inference)
    written: str = ""  # the sha256 of what the target holds after this run ("" nothing written)
