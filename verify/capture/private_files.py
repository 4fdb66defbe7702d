"""Inside the child: what the script writes in its working folder stays the run's own (the view the runner made,
verify/launch/working_folder.py, manifest.working_folder).

The view's files are links to the original folders'. A file the script opens to write (open, io.open, os.open,
os.truncate, torch.save), whose entry is still such a link, is first made the run's: copied where the write keeps
what the file holds (append, read-write), the link removed where the write replaces it. A path into the folders the
view mirrors, the working folder and the script's (an absolute path the script built, or found with
os.path.realpath through a link), is opened as the same path in the view, so that the run reads what it wrote and
writes nowhere else. The script's arguments naming them are given as the view (manifest.seen_by_script). Beside
them, in the folders on the way to them from the view's root, as in the folders above it, the view's links lead to
the user's files, shared: written through, not made the run's.

What native code opens itself (safetensors' writer, h5py, sqlite) is not seen here: a new file lands in the view
(the script's working folder is the view), an existing one it rewrites in place is written through its link; the
runner names such originals after the run (`originals_changed`).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.serialization

from verify.record.schema import RunManifest, seen_in_view

_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC


class PrivateFiles:
    """The run's view (`folder`: manifest.working_folder, which names the folders it left out: verify's own, which this
    run and verify write as they are)."""

    def __init__(self, folder: Mapping[str, Any]) -> None:
        self.folder = folder

    def seen(self, path: Any) -> Any:
        """`path` as the run sees it: in the view where it names a folder the view mirrors; anything else as given."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            return path
        if os.sep + ".." in path and os.path.isabs(path):
            path = os.path.normpath(path)  # "ROOT/../ROOT/x" is ROOT/x; "ROOT/../y" is outside it
        return seen_in_view(path, self.folder) or path

    def own(self, path: Any, keep: bool) -> None:
        """Makes the view's entry at `path` the run's where it is still a link to an original file: a copy of it
        (`keep`) or nothing (the write replaces it)."""
        if not isinstance(path, str) or not os.path.islink(path):
            return
        target = os.readlink(path)
        if seen_in_view(target, self.folder) is None or not os.path.isfile(target):
            return  # a link of the script's own, to a folder, or to a file beside the folders mirrored: shared
        if keep:
            copy = f"{path}.npu-port-{os.getpid()}.copy"
            shutil.copy2(target, copy)
            os.replace(copy, path)
        else:
            with contextlib.suppress(FileNotFoundError):  # another rank of the run made it its own first
                os.unlink(path)

    def argv(self, argv: list[str]) -> list[str]:
        """The script's arguments, those naming the original folder (alone or as `--name=PATH`) given as the view."""
        def seen(argument: str) -> str:
            name, equals, value = argument.partition("=")
            if equals and name.startswith("-"):
                return f"{name}={self.seen(value)}"
            return self.seen(argument)
        return [seen(argument) for argument in argv]


def of(manifest: RunManifest) -> PrivateFiles | None:
    """The run's PrivateFiles, None where it runs in the original folder."""
    folder = manifest.working_folder
    return PrivateFiles(folder) if folder.get("view") else None


def _writes(mode: str) -> bool:
    return any(letter in mode for letter in "wax+")


@contextlib.contextmanager
def kept_private(files: PrivateFiles) -> Iterator[None]:
    """open, io.open, os.open, os.truncate and torch.save writing in the view alone while the script runs."""
    opened, os_open, truncate, save = builtins.open, os.open, os.truncate, torch.serialization.save

    def private_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        file = files.seen(file)
        if isinstance(mode, str) and _writes(mode):
            files.own(file, keep="w" not in mode)
        return opened(file, mode, *args, **kwargs)

    def private_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if kwargs.get("dir_fd") is None:
            path = files.seen(path)
            if flags & _WRITES:
                files.own(path, keep=not flags & os.O_TRUNC)
        return os_open(path, flags, *args, **kwargs)

    def private_truncate(path: Any, length: int) -> None:
        path = files.seen(path)
        files.own(path, keep=True)
        truncate(path, length)

    def private_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f = files.seen(f)
        files.own(f, keep=False)
        save(obj, f, *args, **kwargs)

    builtins.open = io.open = private_open
    os.open, os.truncate = private_os_open, private_truncate
    torch.save = torch.serialization.save = private_save
    try:
        yield
    finally:
        builtins.open = io.open = opened
        os.open, os.truncate = os_open, truncate
        torch.save = torch.serialization.save = save
