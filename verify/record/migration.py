"""What `migrate` did to each line of a port, read from the report folder it writes beside the port
(<port stem>_report/: diff.patch, findings.json, written.json), as files: verify never imports migrate.

A port's line is one of three: a line migrate carried over from the original, a line of a hunk migrate made (with
the findings of the rules that made it), or a line the user edited after migrate wrote the port. The last are told
apart by rebuilding the port migrate wrote (the original with diff.patch's hunks applied, checked against the
sha256 migrate recorded in written.json) and comparing the port on disk with it. No torch, no pandas.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from verify.contract.files import DIFF_PATCH, FINDINGS_JSON, WRITTEN_JSON, report_folder

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Rewrite:
    """A finding of migrate's on the original's lines `line`..`end_line`: its rule's code and message."""

    code: str
    message: str
    line: int
    end_line: int

    @property
    def text(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class LineOrigin:
    """Where a line of the port comes from: the original's line it pairs with (None: none does), the rewrites of
    migrate's behind it (a line in a hunk migrate made; the nearest finding first), or the user's own edit."""

    original: int | None
    rewrites: tuple[Rewrite, ...] = ()
    user_edit: bool = False


@dataclass
class _Hunk:
    original_start: int
    original_count: int
    lines: list[str]  # " x", "-x", "+x" as diff.patch has them


@dataclass
class PortLines:
    """The port on disk, line by line, against the original: `origin(line)`."""

    migrated: list[LineOrigin]  # the port migrate wrote, line n at index n - 1
    current_to_migrated: list[tuple[int | None, bool]]  # the port on disk -> (migrate's line, edited by the user)

    def origin(self, line: int) -> LineOrigin | None:
        if not 1 <= line <= len(self.current_to_migrated):
            return None
        migrated, user_edit = self.current_to_migrated[line - 1]
        if migrated is None:
            return LineOrigin(None, user_edit=True)
        if user_edit:
            return LineOrigin(self.migrated[migrated - 1].original, user_edit=True)
        return self.migrated[migrated - 1]


def read_port_lines(original: Path, port: Path) -> PortLines | None:
    """The origin of each line of `port`, a port of `original`, from migrate's report folder beside it; None where
    there is none, it does not describe this pair of files, or a file cannot be read."""
    folder = report_folder(port)
    try:
        diff = (folder / DIFF_PATCH).read_text(encoding="utf-8")
        findings = json.loads((folder / FINDINGS_JSON).read_text(encoding="utf-8"))
        written = json.loads((folder / WRITTEN_JSON).read_text(encoding="utf-8")).get("files", {})
        original_lines = original.read_text(encoding="utf-8").splitlines()
        current = port.read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError, AttributeError):
        return None
    hunks = _hunks_of(diff, port.name)
    migrated_text, migrated = _apply(original_lines, hunks, _rewrites(findings, original.name))
    expected = next((digest for name, digest in written.items() if Path(name).name == port.name), None)
    if hunks is None or migrated_text is None or expected != _sha256(migrated_text):
        return None  # the original changed since migrate read it, or the diff is another file's
    return PortLines(migrated, _pair_lines(migrated_text, current))


def _sha256(lines: list[str]) -> str:
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode()).hexdigest()


def _hunks_of(diff: str, port_name: str) -> list[_Hunk] | None:
    """The hunks of the file diff.patch writes as `+++ b/.../port_name`; None where it has no such file."""
    hunks: list[_Hunk] | None = None
    inside = False
    for line in diff.splitlines():
        if line.startswith("+++ "):
            inside = Path(line[4:].strip()).name == port_name
            hunks = [] if inside and hunks is None else hunks
        elif line.startswith("--- "):
            inside = False
        elif inside and (match := _HUNK.match(line)):
            hunks.append(_Hunk(int(match[1]), int(match[2] or 1), []))
        elif inside and hunks and line[:1] in (" ", "-", "+", ""):
            hunks[-1].lines.append(line or " ")
    return hunks


def _rewrites(findings: list[dict], original_name: str) -> list[Rewrite]:
    return [Rewrite(str(row["code"]), str(row["message"]), int(row["line"]), int(row.get("end_line") or row["line"]))
            for row in findings if isinstance(row, dict) and Path(str(row.get("path", ""))).name == original_name
            and row.get("action") == "changed" and isinstance(row.get("line"), int)]


def _apply(original: list[str], hunks: list[_Hunk] | None,
           rewrites: list[Rewrite]) -> tuple[list[str] | None, list[LineOrigin]]:
    """The port migrate wrote (None: the hunks do not apply to `original`) and the origin of each of its lines."""
    text: list[str] = []
    origins: list[LineOrigin] = []
    done = 0  # original lines consumed
    for hunk in hunks or []:
        start = hunk.original_start - 1 if hunk.original_count else hunk.original_start
        if start < done:
            return None, []
        text += original[done:start]
        origins += [LineOrigin(number) for number in range(done + 1, start + 1)]
        done = start
        removed = {line[1:].strip(): done + 1 + n for n, line in enumerate(
            [line for line in hunk.lines if line[0] != "+"]) if line[0] == "-"}
        end = start + hunk.original_count
        in_hunk = [r for r in rewrites if r.line <= max(end, start + 1) and r.end_line >= start + 1]
        block_start = done + 1
        for line in hunk.lines:
            kind, body = line[0], line[1:]
            if kind != "+" and (done >= len(original) or original[done] != body):
                return None, []
            if kind == " ":
                text.append(body)
                origins.append(LineOrigin(done + 1))
                done += 1
                block_start = done + 1
            elif kind == "-":
                done += 1
            else:
                paired = removed.get(body.strip(), block_start)
                text.append(body)
                origins.append(LineOrigin(paired, tuple(sorted(in_hunk, key=lambda r: _distance(r, paired)))))
    text += original[done:]
    origins += [LineOrigin(number) for number in range(done + 1, len(original) + 1)]
    return text, origins


def _distance(rewrite: Rewrite, line: int) -> tuple[int, int]:
    """How far a finding is from an original line: 0 where it covers it; one before it ranks first."""
    if rewrite.line <= line <= rewrite.end_line:
        return 0, 0
    return (line - rewrite.end_line, 0) if rewrite.end_line < line else (rewrite.line - line, 1)


def _pair_lines(migrated: list[str], current: list[str]) -> list[tuple[int | None, bool]]:
    """Each line of the port on disk -> its line in the port migrate wrote, and whether the user edited it: a line
    the user replaced pairs with the one in its place (the n-th of the block it replaced, where there is one), a line
    the user added with none."""
    paired: list[tuple[int | None, bool]] = [(None, True)] * len(current)
    matcher = difflib.SequenceMatcher(None, migrated, current, autojunk=False)
    for tag, first, first_end, second, second_end in matcher.get_opcodes():
        for offset in range(second_end - second):
            if tag == "equal":
                paired[second + offset] = (first + offset + 1, False)
            elif tag == "replace":
                paired[second + offset] = (min(first + offset, first_end - 1) + 1, True)
    return paired
