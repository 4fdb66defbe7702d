"""Each run in a working folder of its own: a view of the script's folder that shows every run what was there before
it, and only the run that wrote it what a run writes.

The runs of a pair go at once (the port, its reference, the calibration runs) and one after the other (`verify run`
on one machine, then on another), in the script's folder. A script that resumes from its own checkpoint (`if
os.path.exists("ckpt.pt"): load it`, HF Trainer's `output_dir`) read what another side had written there: the
reference resumed from the port's step 4 and the pair judged two different trainings (issue 43).

The view (RUNDIR/files/) mirrors the script's folder (manifest.files_root) before the child starts: its folders are
made anew, its Python files copied (so that `Path(__file__).resolve()` finds the view, not the original folder),
every other file a symbolic link to the original, read where it lies. Inside the child
(verify/capture/private_files.py) a file the script opens to write, whose entry in the view is still such a link,
is first made the run's own (copied, or the link removed where the write replaces it), and a path into the original
folder is read as the same path in the view; the script's arguments naming the original folder are given as the
view. After the run, the links are removed: RUNDIR/files/ holds what the run wrote, and the manifest's
`working_folder` lists it.

Left out of the view: verify's own folders (a folder being written by a verify, a run folder, `verify-out/`,
`verify-runs/`) and `__pycache__`. Linked whole, never written by a training: version control's folders,
`node_modules` and virtual environments, and every folder still unwalked once MAX_ENTRIES entries are mirrored (a
script run from a home folder); the manifest names them (`shared`). What a native library writes in place into an
existing file of the original folder, or what the script writes outside the folder (an absolute path elsewhere),
is not private: the original folder's files and folders are checked after the run, and those changed are named
(`originals_changed`).

The folders above it: the view is made at RUNDIR/.above/<the names of UP_LEVELS folders above the script's
folder>/<its name>, each of those folders holding a link to every other entry of the folder it stands for, so that
`../data` (pytorch/examples' MNIST scripts) and `../../../Datasets` (Lightning's examples) lead where they lead from
the script's folder: into the user's folders, shared, not private. (Made at RUNDIR/files, `..` was RUNDIR: every
such script downloaded its data again or failed to.) A new entry the run makes up there stays in the run: after the
run the view is moved to RUNDIR/files and what is left of .above, links removed, to RUNDIR/outside
(`written_outside`).

Cost: one link or copy per entry, once per run; tests/perf/bench_working_folder.py measures it on a large data
folder.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify.record import run_folders
from verify.record.run_folders import WRITER_LOCK
from verify.record.schema import LOG, MANIFEST

FOLDER = "files"  # RUNDIR/files: what the run wrote in its view, after the run
ABOVE = ".above"  # RUNDIR/.above: the folders above the view while it runs
OUTSIDE = "outside"  # RUNDIR/outside: what the run made in the folders above its view, kept
UP_LEVELS = 3  # the folders above the script's folder a relative path reaches (Lightning's ../../../Datasets)
MAX_ABOVE = 10_000  # entries of a folder above, at most: past it (a crowded home folder) the levels above stop
COPIED_SUFFIXES = (".py",)  # the script's own code: its __file__ must lead to the view, not the original folder
LINKED_WHOLE = frozenset({".git", ".hg", ".svn", "node_modules"})
LEFT_OUT = frozenset({"__pycache__", "verify-out", "verify-runs"})
MAX_ENTRIES = 200_000
_LISTED = 200  # the written files the manifest names, at most (the count is always whole)


@dataclass
class WorkingFolder:
    """A run's view of `root` at `view`, and what it looked like when made."""

    root: Path
    view: Path  # where the run works: RUNDIR/.above/.../<root's name>
    settled: Path  # where its view is moved after the run: RUNDIR/files
    shared: list[str] = field(default_factory=list)  # folders linked whole (relative to root)
    left_out: list[str] = field(default_factory=list)  # verify's folders and caches, not in the view (relative)
    entries: int = 0
    seconds: float = 0.0
    # relative path -> (mtime_ns, size) of each original file linked and folder mirrored, to find those changed after
    before: dict[str, tuple[int, int]] = field(default_factory=dict)
    mirrored: set[str] = field(default_factory=set)  # the links and copies made (relative), removed after the run

    def record(self) -> dict[str, Any]:
        """What the manifest says of it before the run (manifest.working_folder)."""
        return {"root": str(self.root), "view": str(self.view), "entries": self.entries,
                "made_in_s": round(self.seconds, 3), "shared": self.shared, "left_out": self.left_out}


def _left_out(entry: os.DirEntry) -> bool:
    if entry.name in LEFT_OUT:
        return True
    names = set(os.listdir(entry.path))
    # verify's: being written, a run folder, or a run across several machines (its nodes' folders)
    return WRITER_LOCK in names or {MANIFEST, LOG} <= names or run_folders.holds_nodes(Path(entry.path))


def _linked_whole(entry: os.DirEntry) -> bool:
    return entry.name in LINKED_WHOLE or os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))


def _link_target(entry: os.DirEntry, root: str, view: str) -> str:
    """A link of the original folder, as the view holds it: one into the folder leads into the view."""
    target = os.readlink(entry.path)
    if os.path.isabs(target) and (target + os.sep).startswith(root + os.sep):
        return view + target[len(root):]
    return target


def make(root: Path, settled: Path) -> WorkingFolder:
    """Mirrors `root` into a view below the folders above it (_above), breadth first (a folder beyond MAX_ENTRIES is
    linked); `settled` (which must not exist) is where the view goes after the run."""
    started = time.monotonic()
    root, settled = root.resolve(), settled.absolute()
    made = WorkingFolder(root, _above(root, settled.parent / ABOVE) / root.name, settled)
    made.view.mkdir()
    folders = deque([""])
    while folders:
        relative = folders.popleft()
        made.before[relative] = _stamp(os.path.join(made.root, relative))
        with os.scandir(os.path.join(made.root, relative)) as entries:
            for entry in entries:
                if folder := _mirror(made, entry, os.path.join(relative, entry.name)):
                    folders.append(folder)
    made.seconds = time.monotonic() - started
    return made


def _mirror(made: WorkingFolder, entry: os.DirEntry, name: str) -> str | None:
    """Mirrors one entry of the original folder; returns the folder's name where it is a folder to walk."""
    made.entries += 1
    destination = os.path.join(made.view, name)
    if entry.is_symlink():
        os.symlink(_link_target(entry, str(made.root), str(made.view)), destination)
    elif entry.is_dir():
        if _left_out(entry):
            made.left_out.append(name)
            return None
        if not _linked_whole(entry) and made.entries <= MAX_ENTRIES:
            os.mkdir(destination)
            return name
        os.symlink(entry.path, destination)
        made.shared.append(name)
    elif entry.name.endswith(COPIED_SUFFIXES):
        shutil.copy2(entry.path, destination)
    else:
        os.symlink(entry.path, destination)
        status = entry.stat(follow_symlinks=False)
        made.before[name] = status.st_mtime_ns, status.st_size
    made.mirrored.add(name)
    return None


def _above(root: Path, tree: Path) -> Path:
    """The folders above `root` mirrored at `tree`, the highest first: each holds a link to every entry of the folder
    it stands for but the one on the way down, which is made. Up to UP_LEVELS, stopping below a folder that cannot
    be listed or holds more than MAX_ABOVE entries. Returns the folder standing for root's parent."""
    levels: list[tuple[Path, list[str]]] = []  # the closest first
    for folder in root.parents[:UP_LEVELS]:
        try:
            names = os.listdir(folder)
        except OSError:
            break
        if folder == folder.parent or len(names) > MAX_ABOVE:
            break
        levels.append((folder, names))
    here = tree
    here.mkdir(parents=True)
    on_the_way = [root, *(folder for folder, _ in levels[:-1])]
    for (folder, names), child in reversed(list(zip(levels, on_the_way))):
        for name in names:
            if name != child.name:
                os.symlink(os.path.join(folder, name), here / name)
        if child != root:
            here = here / child.name
            here.mkdir()
    return here


def _stamp(path: str) -> tuple[int, int]:
    status = os.stat(path, follow_symlinks=False)
    return status.st_mtime_ns, status.st_size


def settle(made: WorkingFolder) -> dict[str, Any]:
    """After the run: the links, unchanged copies and bytecode caches removed from the view, leaving what the run
    wrote; returns what the manifest says of it after the run (the files written, relative to the view; the
    originals that changed meanwhile)."""
    written: list[str] = []
    _settle_folder(made, "", written)
    written.sort()
    os.rename(made.view, made.settled)
    return {"view": str(made.settled), "written": written[:_LISTED], "written_count": len(written),
            "originals_changed": _changed(made), "written_outside": _settle_above(made.settled.parent)}


def _settle_above(run_dir: Path) -> list[str]:
    """The folders above the view, their links removed; what the run made there kept at RUNDIR/outside and named."""
    tree = run_dir / ABOVE
    outside: list[str] = []
    for folder, names, files in os.walk(tree, topdown=False):
        for name in names + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                os.unlink(path)
            elif not os.path.isdir(path):
                outside.append(os.path.relpath(path, tree))
            elif not os.listdir(path):
                os.rmdir(path)
    if outside:
        os.rename(tree, run_dir / OUTSIDE)
    else:
        os.rmdir(tree)
    return sorted(outside)[:_LISTED]


def _settle_folder(made: WorkingFolder, relative: str, written: list[str]) -> bool:
    """Settles one folder of the view, depth first; returns whether it is left empty."""
    left = 0
    with os.scandir(os.path.join(made.view, relative)) as entries:
        for entry in entries:
            name = os.path.join(relative, entry.name)
            if name in made.mirrored and _as_mirrored(made, entry, name):
                os.unlink(entry.path)
            elif entry.name == "__pycache__" and entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)  # Python's bytecode of the copied modules, not the script's output
            elif entry.is_dir(follow_symlinks=False) and _settle_folder(made, name, written):
                os.rmdir(entry.path)
            else:
                left += 1
                if not entry.is_dir(follow_symlinks=False):
                    written.append(name)
    return left == 0


def _as_mirrored(made: WorkingFolder, entry: os.DirEntry, relative: str) -> bool:
    """Whether a mirrored entry is as the view made it: a link still, or a copy of unchanged text."""
    if entry.is_symlink():
        return True
    try:
        return Path(entry.path).read_bytes() == (made.root / relative).read_bytes()
    except OSError:
        return False


def _changed(made: WorkingFolder) -> list[str]:
    """The original files and folders mirrored that changed while the run ran (written in place, or entries added
    or removed), by a writer the view could not keep to itself."""
    changed = []
    for relative, stamp in made.before.items():
        try:
            now = _stamp(os.path.join(made.root, relative))
        except OSError:
            now = None
        if now != stamp:
            changed.append(relative or ".")
    return sorted(changed)[:_LISTED]

