"""Where verify's folders go and what they are called, in one place: a run directory (`verify run`), a pair's output
folder (`verify ORIGINAL PORTED`, `verify determinism`) and the folders inside it. The runner and the pair ask here;
what a run directory holds is verify/record/schema.py's.

    PAIR/ref/                  the reference's run directory
    PAIR/actual/               the port's
    PAIR/ref-under-autocast/   a reference that crashed under the port's autocast, kept as evidence
    PAIR/ref-fp32/             --amp-effect: the reference as written
    PAIR/amp-effect/           --amp-effect: its comparison's reports
    PAIR/run-1/, PAIR/run-2/   verify determinism: the two runs

A run of several ranks (`--nproc-per-node N`, or a script that spawns its own) keeps one run directory per rank
inside its run directory; a single process keeps today's layout, without rank folders:

    RUN/manifest.json          the run's manifest: how the run as a whole ended (the runner composes it)
    RUN/output.log             every rank's output, as the launcher passed it on
    RUN/rank0/, RUN/rank1/     each rank's run directory (manifest, losses, ops ...: verify/record/schema.py)

A run across several machines (--nnodes N, verify/launch/nodes.py) has one RUN that every node sees (a shared
filesystem), where each node's verify writes only its own files, so that none clashes with another's:

    RUN/node-K/                node K's verify: its writer lock, its manifest (its configuration, then how its
                               ranks ended), its output.log (its ranks' output) and its working folder
    RUN/rankR/                 each rank's run directory, R its global rank; its manifest names its node
    RUN/manifest.json          the run's manifest, written by node 0 alone once every node's ranks are in

Node 0 takes RUN only where it holds nothing but other nodes' folders (ranks start after every node joined, so
after this check); a reader reads RUN as any run of ranks. A pair across machines keeps the same layout: PAIR/node-K/
each node's claim, PAIR/actual/node-K/, PAIR/ref/node-K/ ..., node 0 writing the reports.

A folder verify writes into has one writer: claim() creates WRITER_LOCK in it with O_EXCL, so that of two verify
commands started at once into the same folder, exactly one writes and the other exits 2; the lock goes when its
process ends. The lock names its writer (pid, the process's start time, the host): a verify killed too hard to
remove it (SIGKILL) leaves a stale lock, which `writer_gone()` tells from a live one, the reader of its runs reports
as ended with that verify, and the next claim of the folder takes over, clearing what the dead writer left there
(the folder was empty when it claimed it). A folder that holds anything else is refused (exit 2), unless it holds
only what the same command wrote there before, each file as it wrote it (`verify compare -o`, `verify export`: its
WRITTEN record), which it writes again: never another run's files, a user's, or its reports after an edit. Default
names carry a random suffix besides the time, so two commands started in the same second get two folders.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import secrets
import shutil
import socket
import time
from pathlib import Path

from verify.errors import VerifyFailure
from verify.record.schema import MANIFEST

REF = "ref"
ACTUAL = "actual"
REF_UNDER_AUTOCAST = "ref-under-autocast"
REF_FP32 = "ref-fp32"
CALIBRATION = "calibration"  # the reference again under another rounding (verify/capture/perturbation.py)
WRITER_LOCK = ".verify-writer.lock"
# What a command that writes its output again wrote into the folder it claimed: {"by": the command, "files": {path
# relative to the folder: its sha256}} (record_written).
WRITTEN = ".verify-written.json"


class FolderInUse(VerifyFailure):
    """An output folder that already holds something: verify never writes into it (exit 2)."""


def calibration_run(number: int) -> str:
    """The folder of the reference's `number`-th calibration run (from 1), beside the reference's."""
    return CALIBRATION if number == 1 else f"{CALIBRATION}-{number}"


def calibration_dirs(ref_dir: Path) -> list[Path]:
    """The calibration runs beside a reference run directory, in order (none beside a run made alone)."""
    found = []
    while (folder := Path(ref_dir).parent / calibration_run(len(found) + 1)).is_dir():
        found.append(folder)
    return found


def determinism_run(number: int) -> str:
    return f"run-{number}"


_RANK_PREFIX = "rank"


def rank_dir(run_dir: Path, rank: int) -> Path:
    """The run directory of rank `rank` inside the run directory of a multi-rank run."""
    return Path(run_dir) / f"{_RANK_PREFIX}{rank}"


_NODE_PREFIX = "node-"


def node_dir(run_dir: Path, node: int) -> Path:
    """Node `node`'s own folder inside the run directory of a run across several machines."""
    return Path(run_dir) / f"{_NODE_PREFIX}{node}"


def ranks_home(run_dir: Path, multi_node: bool) -> Path:
    """The folder that holds the rank folders of the run `run_dir` runs: itself, or for a node's folder of a run
    across several machines, the run's."""
    return Path(run_dir).parent if multi_node else Path(run_dir)


def _is_node_dir(entry: Path) -> bool:
    return entry.name.startswith(_NODE_PREFIX) and entry.name.removeprefix(_NODE_PREFIX).isdigit()


def holds_nodes(folder: Path) -> bool:
    """Whether `folder` is a run (or a pair) across several machines: it holds a node's folder that verify wrote."""
    return any(_is_node_dir(entry) and ((entry / WRITER_LOCK).exists() or (entry / MANIFEST).exists())
               for entry in Path(folder).iterdir())


def _not_other_nodes(folder: Path) -> list[str]:
    """What in `folder` is neither another node's folder nor a folder of such only (a pair's side another node
    started first): another run's files, a user's."""
    def others(entry: Path) -> bool:
        if _is_node_dir(entry):
            return entry.name != node_dir(folder, 0).name
        return entry.is_dir() and not entry.is_symlink() and not _not_other_nodes(entry)
    return sorted(entry.name for entry in folder.iterdir() if not others(entry))


def claim_node(run_dir: Path, node: int) -> Path:
    """Node `node`'s folder of a run across several machines, claimed (claim()); node 0 also makes sure the run
    directory holds nothing but other nodes' folders: no other run's files."""
    if node == 0 and Path(run_dir).is_dir():
        if foreign := _not_other_nodes(Path(run_dir)):
            raise FolderInUse(f"{run_dir} already holds {', '.join(foreign[:3])}, not only other nodes' folders of "
                              "this run; choose another -o")
    return claim(node_dir(run_dir, node))


def rank_dirs(run_dir: Path) -> list[Path]:
    """The rank folders of a run directory, by rank number ([] for a single-process run)."""
    folders = {}
    if Path(run_dir).is_dir():
        for entry in Path(run_dir).iterdir():
            number = entry.name.removeprefix(_RANK_PREFIX)
            if entry.name.startswith(_RANK_PREFIX) and number.isdigit() and entry.is_dir():
                folders[int(number)] = entry
    return [folders[rank] for rank in sorted(folders)]


def _stamp() -> str:
    """The time to the second, and a random suffix: unique per invocation, even for two in the same second."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def default_run_dir(script: Path, device: str) -> Path:
    """`verify run` without -o: verify-runs/STEM-DEVICE-TIME-RANDOM in the working folder."""
    return Path("verify-runs") / f"{script.stem}-{device}-{_stamp()}"


def default_pair_dir(script: Path) -> Path:
    """A pair without -o: verify-out/STEM-TIME-RANDOM beside the original."""
    return script.parent / "verify-out" / f"{script.stem}-{_stamp()}"


def claim(folder: Path, rewriter: str = "") -> Path:
    """`folder`, created where it does not exist, with this process as its only writer until it exits: a folder
    that holds anything (another run's files, a user's, another writer's lock) is refused (FolderInUse, exit 2),
    except what a writer that is gone left there (its stale lock, taken over) and, for a `rewriter` (the command that
    writes it: "verify compare"), its own earlier output, each file as it wrote it (record_written)."""
    if folder.exists() and not folder.is_dir():
        raise FolderInUse(f"{folder} already exists and is not a folder; choose another -o")
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / WRITER_LOCK
    if writer_gone(folder):
        _take_over(lock)
    try:
        descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)  # atomic: one creator wins
    except FileExistsError:
        raise FolderInUse(f"{folder} is being written by another verify (its lock {WRITER_LOCK} is there); choose "
                          "another -o") from None
    with os.fdopen(descriptor, "w") as file:
        file.write(_this_writer())
    if any(entry.name != WRITER_LOCK for entry in folder.iterdir()):
        if not rewriter or (foreign := _not_written_by(folder, rewriter)):
            lock.unlink()
            raise FolderInUse(f"{folder} already exists and is not an empty folder" + (
                f" nor {rewriter}'s earlier output ({foreign})" if rewriter else "") + "; choose another -o")
    _held.add(lock)
    return folder


def _take_over(lock: Path) -> None:
    """Removes a stale lock and what its writer left beside it. Of claimants racing for the folder, the one whose
    rename takes the lock away clears it; the others find it gone and are refused (or find the new writer's lock)."""
    taken = lock.with_name(f"{WRITER_LOCK}.taken-{os.getpid()}-{secrets.token_hex(3)}")
    try:
        os.rename(lock, taken)
    except FileNotFoundError:
        raise FolderInUse(f"{lock.parent} is being taken over by another verify; choose another -o") from None
    for entry in lock.parent.iterdir():
        if entry == taken:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    taken.unlink()


_UNKNOWN_START = "?"


def _start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, /proc/PID/stat's 22nd field), which tells it from a later one
    given the same pid; _UNKNOWN_START without /proc; None for a process that does not exist, or ended and waits for
    its parent to reap it (a zombie writes nothing)."""
    if not Path("/proc/self").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return _UNKNOWN_START
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return _UNKNOWN_START
    fields = stat[stat.rindex(")") + 2:].split()  # the command, in parentheses, may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


def _this_writer() -> str:
    return f"{os.getpid()} {_start_time(os.getpid())} {socket.gethostname()}\n"


def writer_gone(folder: Path) -> str:
    """Why the writer whose lock is in `folder` cannot be writing any more (its process ended without removing the
    lock: killed by SIGKILL, or the machine went down), or "" (no lock, a live writer, another host's, or a lock
    being written)."""
    try:
        pid, started, host = (Path(folder) / WRITER_LOCK).read_text().split()
    except (OSError, ValueError):
        return ""
    now = _start_time(int(pid))
    if host != socket.gethostname() or now in (started, _UNKNOWN_START):  # alive, or it cannot be told
        return ""
    return f"its verify (process {pid}) ended without closing it (killed by SIGKILL, or the machine stopped)"


def record_written(folder: Path, rewriter: str) -> None:
    """Records every file in `folder` as `rewriter`'s output (WRITTEN), which claim() lets it write again: call it
    once the command has written them all."""
    files = {path.relative_to(folder).as_posix(): file_sha256(path) for path in sorted(folder.rglob("*"))
             if path.is_file() and path.name not in (WRITER_LOCK, WRITTEN)}
    (folder / WRITTEN).write_text(json.dumps({"by": rewriter, "files": files}, indent=1), encoding="utf-8")


def _not_written_by(folder: Path, rewriter: str) -> str:
    """What in `folder` is not `rewriter`'s output as it wrote it (its WRITTEN record), in words; "" where nothing."""
    try:
        record = json.loads((folder / WRITTEN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"no {WRITTEN} record of it"
    files = record.get("files") if isinstance(record, dict) and record.get("by") == rewriter else None
    if not isinstance(files, dict):
        return f"{WRITTEN} is not {rewriter}'s record"
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.is_symlink() or (path.is_file() and name not in (WRITER_LOCK, WRITTEN)
                                 and files.get(name) != file_sha256(path)):
            return f"{name} is not a file it wrote" if name not in files or path.is_symlink() else f"{name} changed"
    return ""


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read a MiB at a time (a report's ops.csv is tens of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def release(folder: Path) -> None:
    """Ends this process's claim on `folder` (a run written to its end); every claim ends when the process does."""
    lock = folder / WRITER_LOCK
    if lock in _held:
        _held.discard(lock)
        lock.unlink(missing_ok=True)


_held: set[Path] = set()


@atexit.register
def _release_all() -> None:
    for lock in list(_held):
        release(lock.parent)
