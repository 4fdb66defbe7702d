"""What a rank of a multi-rank run does in its own process, besides what every run does (verify/capture/bootstrap.py):
its run directory inside the run's (verify/record/run_folders.py), the record of its process group, and the last
collective it called, kept where a rank that hangs or is killed still leaves it. Runs only in the child, which imports
torch.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from verify import devices
from verify.record import run_folders
from verify.record.schema import LAST_COLLECTIVE, RunManifest
from verify.record.store import write_manifest

# The process group classes torch's backends run as, by the name a person knows them by.
_BACKEND_CLASSES = {"ProcessGroupGloo": "gloo", "ProcessGroupNCCL": "nccl", "ProcessGroupHCCL": "hccl",
                    "ProcessGroupMPI": "mpi", "ProcessGroupUCC": "ucc"}


RANK_ROLE = "--rank"  # the bootstrap's argument that makes it a rank a launcher started (RANK in its environment)


def rank_command(run_dir: Path, *script_and_argv: str) -> list[str]:
    """The command a launcher starts a rank with (torch.distributed.run for --nproc-per-node, or an elastic launch in
    the script): the bootstrap as a rank of `run_dir`, dying with this process, running the run's script or, where
    given, `script_and_argv` (the script the elastic launch runs, and its arguments)."""
    return [sys.executable, "-P", "-m", "verify.capture.bootstrap", str(run_dir), str(os.getpid()), RANK_ROLE,
            *script_and_argv]


def launched_rank() -> int | None:
    """This process's rank where torch.distributed.run started it (RANK in its environment), else None."""
    rank = os.environ.get("RANK", "")
    return int(rank) if rank.isdigit() else None


def open_rank_dir(run_dir: Path, manifest: RunManifest, rank: int, world_size: int) -> tuple[Path, RunManifest]:
    """This rank's run directory inside the run's (beside the node's folder, across several machines), created with
    its own manifest: the run's configuration (its node's, which names the node), its rank and world size, and its
    process id."""
    folder = run_folders.rank_dir(run_folders.ranks_home(run_dir, bool(manifest.nodes)), rank)
    folder.mkdir(exist_ok=True)
    own = replace(manifest, rank=rank, world_size=world_size, extra={**manifest.extra, "pid": os.getpid()})
    write_manifest(folder, own)
    return folder, own


def _backend_ran(group: Any) -> str:
    """The backend class that runs the default process group ("gloo" where the emulations stand it in for nccl or
    hccl), read from the group itself."""
    names = []
    for device_type in getattr(group, "_device_types", []):
        backend = type(group._get_backend(device_type)).__name__
        names.append(_BACKEND_CLASSES.get(backend, backend))
    return ",".join(dict.fromkeys(names))


class _Recording:
    """The manifest that init_process_group's wrapper records into (None: no run is being captured)."""

    manifest: RunManifest | None = None


def record_process_groups() -> None:
    """Wraps dist.init_process_group, once in a process, to record the backend the script asks for and the one that
    ran it (manifest.process_group), and the rank and world size of a process the script started itself, into the
    manifest of the run being captured. Installed before the script is imported in a spawned rank (session's
    _DeviceFirst), so that a script that imports init_process_group by name calls it too."""
    if getattr(dist.init_process_group, "records_into_the_manifest", False):
        return
    original = dist.init_process_group

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        manifest = _Recording.manifest
        if manifest is None:
            return
        asked = kwargs.get("backend", args[0] if args else None)
        known = devices.DEVICE_TABLE.get(manifest.device)
        if asked in (None, "undefined") and known:  # torch's choice for the device: init_device_mesh("cuda"), nccl
            asked = dist.Backend.default_device_backend_map.get(known.family.value)
        manifest.process_group = {"backend": str(asked or dist.get_backend()),
                                  "runs_as": _backend_ran(dist.group.WORLD)}
        manifest.rank, manifest.world_size = dist.get_rank(), dist.get_world_size()

    init_process_group.records_into_the_manifest = True
    # init_device_mesh starts the default group by the name device_mesh imported from distributed_c10d
    for namespace in (dist, *(sys.modules.get(f"torch.distributed.{name}") for name in _HOLDING_INIT)):
        if getattr(namespace, "init_process_group", None) is original:
            namespace.init_process_group = init_process_group


_HOLDING_INIT = ("distributed_c10d", "device_mesh")  # torch.distributed's modules that hold init_process_group


@contextlib.contextmanager
def process_group_recorded(manifest: RunManifest) -> Iterator[None]:
    """The process group the script starts, recorded into `manifest` (record_process_groups) while the block runs."""
    record_process_groups()
    _Recording.manifest = manifest
    try:
        yield
    finally:
        _Recording.manifest = None


# The process groups the script destroyed, kept until the rank's process ends (os._exit: never freed).
_DESTROYED_GROUPS: list[Any] = []


@contextlib.contextmanager
def destroyed_groups_kept() -> Iterator[None]:
    """destroy_process_group() shuts the groups' backends down, but a group is freed only when its last reference goes,
    often a DistributedDataParallel's reducer as the script's function returns: gloo's destructor then joins its worker
    threads while holding the GIL, and a worker still releasing a collective's tensors that Python also holds (an
    all_gather's) waits for the GIL: the rank deadlocks (torch's own race; a plain run aborts on it at exit now and
    then, "terminate called without an active exception"). The groups a destroy unregisters are kept here instead, and
    the rank's process ends with os._exit, which frees nothing. Hooked where destroy_process_group() unsets the default
    group, which it looks up as it runs: a script that imported destroy_process_group by name before verify's hooks (a
    spawned rank re-imports it) is covered too."""
    c10d = dist.distributed_c10d
    original = getattr(c10d, "_update_default_pg", None)
    if original is None or not hasattr(c10d, "_world"):
        yield
        return

    @functools.wraps(original)
    def update_default_pg(group: Any) -> None:
        if group is None:  # destroy_process_group(): every group is about to be unregistered
            _DESTROYED_GROUPS.extend(c10d._world.pg_map)
        original(group)

    c10d._update_default_pg = update_default_pg
    try:
        yield
    finally:
        c10d._update_default_pg = original


class LastCollective:
    """The last collective (c10d op) this rank called: its step, name and how many it had called, rewritten in place in
    LAST_COLLECTIVE with one write of a fixed size (a few microseconds; the OS keeps it when the process is killed).
    A rank that waits forever in a collective the others never called is told apart by it after a timeout."""

    SIZE = 512

    def __init__(self, run_dir: Path) -> None:
        self._path = Path(run_dir) / LAST_COLLECTIVE
        self._fd: int | None = None  # opened at the first collective: a run without any has no such file
        self.count = 0

    def called(self, step: int, op: str, module: str) -> None:
        if self._fd is None:
            self._fd = os.open(self._path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        self.count += 1
        record = json.dumps({"step": step, "op": op, "module": module, "count": self.count}).encode()
        os.pwrite(self._fd, record[: self.SIZE].ljust(self.SIZE), 0)


class CollectiveWatch(TorchDispatchMode):
    """A rank's collectives where no op capture sees them (--dump off): each c10d op goes to `on_collective` with the
    step, as the capture hands it (module unknown: ""), so that a hang still names the collective; every op passes
    untouched."""

    def __init__(self, on_collective: Callable[[int, str, str], None], step: Callable[[], int]) -> None:
        super().__init__()
        self.on_collective, self.step = on_collective, step

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.on_collective(self.step(), str(func._overloadpacket), "")
        return func(*args, **(kwargs or {}))
