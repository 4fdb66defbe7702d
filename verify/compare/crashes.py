"""What makes two crashes the same: the exception's type, the frames of the script's own files it passed through
(file and function) and its message with what varies from run to run masked.

A run's exception text holds what changes with every launch (gloo's port numbers, addresses, pids, temporary paths),
so one behaviour compared by its text reads as two under torch's launcher. Line numbers are left out too: a port
moves the lines of the original (migrate adds imports), and the same statement raising is the same crash.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from verify.record.schema import RunManifest

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<function>.+)$')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::|$)")
# What differs between two launches of one crash: paths (temporary folders, the port's own name), addresses, numbers
# (ports, pids, sizes); masked in that order, so that a path's digits go with it.
_VARYING = [(re.compile(r"(?:[A-Za-z]:)?(?:[\\/][\w.\-+~@]+)+"), "<path>"), (re.compile(r"0x[0-9a-fA-F]+"), "<addr>"),
            (re.compile(r"\d+"), "#")]
ENTRY_SCRIPT = "<script>"  # the script that ran, whichever its name on each side (train.py, train_npu.py)


def crash_identity(manifest: RunManifest) -> tuple:
    """(exception type, ((file, function) of each frame in the script's folder), masked message); a run that recorded
    no traceback (a timeout, a launcher's failure) is known by its status and masked message alone."""
    last = _last_block(manifest.traceback)
    if not last:
        return manifest.status, (), _masked(manifest.message or manifest.status)
    text = "\n".join(escaped_exception(manifest.traceback))
    exception = _EXCEPTION.match(text)
    kind = exception.group("type") if exception else ""
    message = text[exception.end():] if exception else text
    return kind, tuple(_script_frames(last, manifest)), _masked(message)


def escaped_exception(traceback: str) -> list[str]:
    """The lines of the exception that escaped, its type first and its message whole (torch.load's refusal of a
    pickled numpy array runs over many lines and ends with a pointer to documentation): those after the last frame
    of the traceback's last block, not its frames' code lines; [] without a traceback."""
    lines = _last_block(traceback)
    last_frame = max((index for index, line in enumerate(lines) if line.startswith("  File ")), default=-1)
    return [line for line in lines[last_frame + 1:] if not line.startswith("    ")] or lines[-1:]


def _last_block(traceback: str) -> list[str]:
    """The lines of the exception that escaped, not of those it was raised while handling."""
    block = traceback.split("Traceback (most recent call last):")[-1]
    return [line for line in block.splitlines() if line.strip()]  # frames keep their indent: code lines are deeper


def _script_frames(lines: list[str], manifest: RunManifest) -> list[tuple[str, str]]:
    script = PurePath(manifest.script)
    frames = []
    for line in lines:
        frame = _FRAME.match(line)
        if frame is None:
            continue
        file = PurePath(frame.group("file"))
        if file == script:
            frames.append((ENTRY_SCRIPT, frame.group("function")))
        elif file.is_relative_to(script.parent) and "site-packages" not in file.parts:
            frames.append((file.relative_to(script.parent).as_posix(), frame.group("function")))
    return frames


def _masked(text: str) -> str:
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return text.strip()
