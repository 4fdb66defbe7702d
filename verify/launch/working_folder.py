"""Each run in a working folder of its own: a view of the folders it works in that shows every run what was there
before it, and only the run that wrote it what a run writes.

The runs of a pair go at once (the port, its reference, the calibration runs) and one after the other (`verify run`
on one machine, then on another), in the same folders. A script that resumes from its own checkpoint (`if
os.path.exists("ckpt.pt"): load it`, HF Trainer's `output_dir`) read what another side had written there: the
reference resumed from the port's step 4 and the pair judged two different trainings.

A run works where `python SCRIPT ARGS` would: in the folder verify was started in (manifest.cwd), the script's folder
first on its search path. The view mirrors both, the script's folder (manifest.files_root) and the working folder,
whole, before the child starts, below the closest folder holding both (the view's root: the working folder itself
where the script lies in it, as with `python sub/train.py data/x.txt`): their folders are made anew, their Python
files copied (so that `Path(__file__).resolve()` finds the view, not the original folder), every other file a
symbolic link to the original, read where it lies. Where the script lies outside the working folder (`verify
../other/train.py`), the folders on the way from the root to each are made too, and their other entries linked,
shared, as the folders above the view link theirs. Inside the child (verify/capture/private_files.py) a file the
script opens to write, whose entry in a mirrored folder is still such a link, is first made the run's own (copied,
or the link removed where the write replaces it), and a path into a mirrored folder is read as the same path in the
view; the script's arguments naming one are given as the view. After the run, the links are removed: RUNDIR/files/
holds what the run wrote, named from the view's root, and the manifest's `working_folder` lists it.

Left out of the view: verify's own folders (its package, a folder being written by a verify, a run folder,
`verify-out/`, `verify-runs/`) and `__pycache__`. Linked whole, never written by a training: version control's folders,
`node_modules` and virtual environments, a folder the user may not list, and every folder still unwalked once
MAX_ENTRIES entries are mirrored (a working folder that is a repository with its datasets, a home folder), the
script's folder walked first so that those are the working folder's, not the script's own; the manifest names them
(`shared`). What a native library
writes in place into an existing file of the folders mirrored, or what the script writes into a folder linked or
outside the view (an absolute path elsewhere), is not private: the mirrored folders' files and folders are checked
after the run, and those changed are named (`originals_changed`).

The folders above it: the view is made at RUNDIR/.above/<the names of UP_LEVELS folders above its root>/<the root's
name>, each of those folders holding a link to every other entry of the folder it stands for, so that `../data`
(pytorch/examples' MNIST scripts) and `../../../Datasets` (Lightning's examples: verify/frameworks) lead where they
lead from the original: into the user's folders, shared, not private. A new entry the run makes up there stays in
the run: after the run the view is moved to RUNDIR/files and what is left of .above, links removed, to RUNDIR/outside
(`written_outside`).

Cost: one link or copy per entry walked, once per run (tests/perf/bench_working_folder.py measures it on a large
data folder): past MAX_ENTRIES the folder being walked is finished and every other linked, so that a run started in
a large folder walks MAX_ENTRIES entries and the rest of one folder, besides the folders on the way.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verify import frameworks
from verify.record import run_folders
from verify.record.run_folders import WRITER_LOCK
from verify.record.schema import LOG, MANIFEST, in_view

FOLDER = "files"  # RUNDIR/files: what the run wrote in its view, after the run
ABOVE = ".above"  # RUNDIR/.above: the folders above the view while it runs
OUTSIDE = "outside"  # RUNDIR/outside: what the run made in the folders above its view, kept
# The folders above the view's root a relative path reaches: pytorch/examples' ../data, and the frameworks' examples'
# (Lightning's ../../../Datasets).
UP_LEVELS = max(1, frameworks.LEVELS_ABOVE)
MAX_ABOVE = 10_000  # entries of a folder above, at most: past it (a crowded home folder) the levels above stop
COPIED_SUFFIXES = (".py",)  # the script's own code: its __file__ must lead to the view, not the original folder
LINKED_WHOLE = frozenset({".git", ".hg", ".svn", "node_modules"})
LEFT_OUT = frozenset({"__pycache__", "verify-out", "verify-runs"})
MAX_ENTRIES = 200_000
FILESYSTEM_ROOT = "root"  # the view's name where its root is `/` (folders mirrored whole with nothing else in common)
_LISTED = 200  # the written files the manifest names, at most (the count is always whole)
# verify's own modules (run from a working folder holding its source): the child imports them, and its emulations,
# from where they lie, as verify's, never as the script's project
_VERIFY_PACKAGE = Path(__file__).resolve().parents[1]


def holds_verify(folder: str) -> bool:
    """Whether `folder` (a PYTHONPATH entry) is where verify's own package lies: the view leaves that package out, so
    the child must import it from there, not from the view."""
    return bool(folder) and (Path(folder).resolve() / _VERIFY_PACKAGE.name) == _VERIFY_PACKAGE


@dataclass
class WorkingFolder:
    """A run's view of `root` at `view`, and what it looked like when made."""

    root: Path  # the closest folder holding every folder mirrored whole
    view: Path  # where the run works: RUNDIR/.above/.../<root's name>
    settled: Path  # where its view is moved after the run: RUNDIR/files
    # the folders mirrored whole, relative to root ("": root itself): the script's folder, then the working folder
    whole: tuple[str, ...]
    shared: list[str] = field(default_factory=list)  # folders linked whole (relative to root)
    left_out: list[str] = field(default_factory=list)  # verify's folders and caches, not in the view (relative)
    entries: int = 0
    seconds: float = 0.0
    # relative path -> (mtime_ns, size) of each original file linked and folder mirrored in a folder mirrored whole,
    # to find those changed after the run
    before: dict[str, tuple[int, int]] = field(default_factory=dict)
    mirrored: set[str] = field(default_factory=set)  # the links and copies made (relative), removed after the run

    def record(self) -> dict[str, Any]:
        """What the manifest says of it before the run (manifest.working_folder)."""
        return {"root": str(self.root), "view": str(self.view),
                "mirrored_whole": [str(self.root / folder) for folder in self.whole], "entries": self.entries,
                "made_in_s": round(self.seconds, 3), "shared": self.shared, "left_out": self.left_out}

    def holds(self, relative: str) -> bool:
        """Whether `relative` lies in a folder mirrored whole."""
        return any(_within(relative, folder) for folder in self.whole)

    def on_the_way(self, relative: str) -> bool:
        """Whether `relative` is a folder mirrored whole or one above it, below root: made, whatever it is."""
        return any(_within(folder, relative) for folder in self.whole)

    def walked_first(self, relative: str) -> bool:
        """Whether `relative` is walked before the others: in the first folder mirrored whole, or on the way to it."""
        return _within(relative, self.whole[0]) or _within(self.whole[0], relative)


def _within(relative: str, folder: str) -> bool:
    return not folder or relative == folder or relative.startswith(folder + os.sep)


def _left_out(entry: os.DirEntry) -> bool:
    if entry.name in LEFT_OUT or Path(entry.path) == _VERIFY_PACKAGE:
        return True
    try:
        names = set(os.listdir(entry.path))
    except OSError:
        return False  # not verify's: linked when it is walked
    # verify's: being written, a run folder, or a run across several machines (its nodes' folders)
    return WRITER_LOCK in names or {MANIFEST, LOG} <= names or run_folders.holds_nodes(Path(entry.path))


def _linked_whole(entry: os.DirEntry) -> bool:
    return entry.name in LINKED_WHOLE or os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))


def _link_target(entry: os.DirEntry, root: str, view: str) -> str:
    """A link of the original folder, as the view holds it: one into the folder leads into the view."""
    target = os.readlink(entry.path)
    return in_view(target, root, view) or target


def make(folders: Sequence[Path], settled: Path) -> WorkingFolder:
    """Mirrors `folders` (the script's folder, the working folder) into one view of the closest folder holding them
    all, below the folders above it (_above); `settled` (which must not exist) is where the view goes after the run.
    Breadth first, the first of `folders` before the others, so that a folder past MAX_ENTRIES, which is linked, is
    one of the working folder's rather than the script's own."""
    started = time.monotonic()
    folders = [Path(folder).resolve() for folder in folders]
    root, settled = Path(os.path.commonpath(folders)), settled.absolute()
    whole = dict.fromkeys("" if folder == root else str(folder.relative_to(root)) for folder in folders)
    made = WorkingFolder(root, _above(root, settled.parent / ABOVE) / (root.name or FILESYSTEM_ROOT), settled,
                         tuple(whole))
    first, then = deque([""]), deque()
    while first or then:
        relative = (first or then).popleft()
        original = os.path.join(made.root, relative)
        if made.entries > MAX_ENTRIES and not made.on_the_way(relative):
            _share(made, original, relative)
            continue
        try:
            entries = os.scandir(original)
        except OSError:
            if made.on_the_way(relative):
                raise  # the view cannot be made without it: verify's error (exit 2), naming the folder
            _share(made, original, relative)  # a folder the user may not list (another user's): read where it lies
            continue
        os.mkdir(os.path.join(made.view, relative))
        if made.holds(relative):
            made.before[relative] = _stamp(original)
        with entries:
            for entry in entries:
                name = os.path.join(relative, entry.name)
                if _mirror(made, entry, name):
                    (first if made.walked_first(name) else then).append(name)
    made.seconds = time.monotonic() - started
    return made


def _mirror(made: WorkingFolder, entry: os.DirEntry, name: str) -> bool:
    """Mirrors one entry of the original folder; True where it is a folder to walk (made when it is walked)."""
    made.entries += 1
    if entry.is_dir(follow_symlinks=False):
        return _walked(made, entry, name)
    destination = os.path.join(made.view, name)
    if entry.is_symlink():
        os.symlink(_link_target(entry, str(made.root), str(made.view)), destination)
    elif entry.name.endswith(COPIED_SUFFIXES):
        shutil.copy2(entry.path, destination)
    else:
        os.symlink(entry.path, destination)
        if made.holds(name):  # watched; beside the way, as in the folders above, the user's files are shared
            status = entry.stat(follow_symlinks=False)
            made.before[name] = status.st_mtime_ns, status.st_size
    made.mirrored.add(name)
    return False


def _walked(made: WorkingFolder, entry: os.DirEntry, name: str) -> bool:
    """Whether a folder of the original is walked; one that is not is left out or linked whole."""
    if made.on_the_way(name):
        return True
    if not made.holds(name):
        _share(made, entry.path, name)
    elif _left_out(entry):
        made.left_out.append(name)
    elif _linked_whole(entry):
        _share(made, entry.path, name)
    else:
        return True
    return False


def _share(made: WorkingFolder, original: str, name: str) -> None:
    """A folder linked whole: the run reads it where it lies, and what it writes there is not its own."""
    os.symlink(original, os.path.join(made.view, name))
    made.shared.append(name)
    made.mirrored.add(name)


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

