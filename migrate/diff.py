"""Unified diffs of a port, as `git diff` writes them: `--- a/train.py` / `+++ b/train_npu.py`.

libcst's `diff_code` names one file on both sides, splits on "\\n" only and leaves the last line without a newline,
so diffs of several files could not be concatenated into one patch. This keeps its contract (empty when nothing
changed) and fixes those three things.
"""

from __future__ import annotations

import difflib
import os

NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(old: str, new: str, source: str, target: str, context: int = 3) -> str:
    """The diff from `old` (the file at `source`) to `new` (written to `target`); "" when they are equal."""
    if old == new:
        return ""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=_quoted(f"a/{_posix(source)}"),
        tofile=_quoted(f"b/{_posix(target)}"),
        n=context,
    )
    return "".join(line if line.endswith("\n") else line + "\n" + NO_NEWLINE for line in lines)


def _posix(path: str) -> str:
    return path.replace("\\", "/").removeprefix("./").lstrip("/")


def _quoted(name: str) -> str:
    """A name as git writes it in a patch: as it is, or, where its bytes are not UTF-8 (a file name as the OS gave it,
    undecodable bytes as surrogates), in quotes with those bytes as octal escapes, which `git apply` reads back."""
    raw = os.fsencode(name)
    try:
        raw.decode("utf-8")
        return name
    except UnicodeDecodeError:
        escaped = "".join(chr(byte) if 0x20 <= byte < 0x7F and byte not in b'"\\' else f"\\{byte:03o}"
                          for byte in raw)
        return f'"{escaped}"'
