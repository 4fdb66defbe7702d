"""What a run saves with torch.save to a file name, written whole: into a temporary file beside it, then renamed onto
it, so that another process reading that file reads the former file whole or the new one whole, never half of one.

The runs of a pair go at once (verify/pair/sides.py run_together): the port, its reference and the reference's
calibration runs, each running its script in the same folders. A script that saves the data it then trains on
(tests/verify/scripts/listed_files.py; a cache, a checkpoint it loads back) has every run rewrite the files the
others read: a run that loads a file while another one writes it reads half a file ("PytorchStreamReader failed
reading zip archive") and crashes where the script alone runs well. Renamed into place (os.replace: atomic within a
file system), a file changes whole. What a script prepares before it trains, a dataset it downloads, is the port's
alone: the other runs' scripts start once the port has made its first step (manifest.starts_after).

Where the temporary file cannot be written (no such folder, no permission), the script's own save runs, with its own
outcome and error. Not made whole: a save to a file object the script opened itself, and other writers
(numpy.save, pickle.dump). The manifest counts the saves made whole (extra["saves_made_whole"]).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.serialization


def _file_name(target: Any) -> str | None:
    """The file a save to `target` writes, links resolved (the link stays, its file changes); None for a file object,
    and for what is not a regular file (/dev/null, a pipe), which a rename would replace."""
    if not isinstance(target, (str, os.PathLike)):
        return None
    name = os.path.realpath(os.fspath(target))
    return None if os.path.exists(name) and not os.path.isfile(name) else name


def temporary_name(name: str) -> str:
    """Where a save to `name` is written first: beside it, hidden (a glob's `*` skips it; listing_order hides it from
    the listings of the script: another run's save is not a file of its dataset)."""
    folder, base = os.path.split(name)
    return os.path.join(folder, f".{base}.npu-port-{os.getpid()}.tmp")


TEMPORARY = re.compile(r"\..*\.npu-port-\d+\.tmp")  # the base name of a temporary_name


@contextlib.contextmanager
def saved_whole(counts: dict[str, Any]) -> Iterator[None]:
    """torch.save (and torch.serialization.save, the same function) writing whole while the script runs."""
    save = torch.serialization.save

    def save_whole(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        name = _file_name(f)
        if name is None:
            return save(obj, f, *args, **kwargs)
        temporary = temporary_name(name)
        try:
            save(obj, temporary, *args, **kwargs)
            os.replace(temporary, name)
        except (OSError, RuntimeError):  # torch raises RuntimeError for a folder that is not there
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            return save(obj, f, *args, **kwargs)
        counts["saves_made_whole"] = counts.get("saves_made_whole", 0) + 1

    torch.save = torch.serialization.save = save_whole
    try:
        yield
    finally:
        torch.save = torch.serialization.save = save
