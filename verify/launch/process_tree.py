"""Every process a run started, found and stopped together, without cgroups: the child, its descendants by parent
pid (DataLoader workers, torch's ranks in their own sessions), and those that left the tree (a `setsid` grandchild
whose parent ended, a daemon that forked twice), found by the token each inherits in its environment (TOKEN_VAR,
which the runner sets in the child's). Read from /proc (Linux); elsewhere, the child's own process group alone.

`stop()` sends SIGTERM to each such process and its process group, waits up to a grace period, then SIGKILLs what is
left, looking again each time, since a process may start another while it ends. Runs in verify's process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from verify.errors import STOPPING_SIGNALS

TOKEN_VAR = "VERIFY_PROCESS_TREE"
GRACE_S = 5.0
_PROC = Path("/proc")
_POLL_S = 0.1


def _parent_pids() -> dict[int, int]:
    """Every living process's parent, from /proc (zombies left out: they compute nothing and cannot be signalled)."""
    parents = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while we looked
        state, parent = stat[stat.rindex(")") + 2:].split()[:2]  # the command, in parentheses, may hold spaces
        if state not in ("Z", "X"):
            parents[int(entry.name)] = int(parent)
    return parents


def _carries(pid: int, token: str) -> bool:
    try:
        return f"{TOKEN_VAR}={token}".encode() in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False  # another user's process, or gone


def members(root: int, token: str) -> set[int]:
    """The living processes of the tree `root` started: `root`, its descendants, and every process carrying `token`
    (without /proc: `root` while it lives)."""
    if not _PROC.is_dir():
        return _living({root})
    parents = _parent_pids()
    found = {pid for pid in parents if pid == root or _carries(pid, token)}
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    pending = list(found)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def _living(pids: set[int]) -> set[int]:
    if _PROC.is_dir():
        return pids & set(_parent_pids())
    living = set()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, 0)
            living.add(pid)
    return living


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    """`sig` to each process and to its process group (what it started since it was found), never to verify's own."""
    own_group = os.getpgrp()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            group = os.getpgid(pid)
            if group != own_group:
                os.killpg(group, sig)
            os.kill(pid, sig)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block ends (then their handlers run): stopping the tree is not cut
    short by a second signal, or by the first arriving while a run that ended by itself is cleared up."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop(child: subprocess.Popen, token: str, grace_s: float = GRACE_S) -> None:
    """Stops every process of the tree `child` started: SIGTERM, then SIGKILL to what is left after `grace_s`. The
    processes found are remembered: one whose parent ended is still stopped, token or not."""
    found: set[int] = set()

    def living() -> set[int]:
        child.poll()  # reaps it once it ended: a zombie is no process to wait for
        found.update(members(child.pid, token))
        return _living(found)

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not (alive := living()):
            break
        _signal(alive, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and living():
            time.sleep(_POLL_S)
    # Reaped whatever happened: the child can end between living()'s poll and its look at /proc, and its exit code is
    # what the manifest records (the CI run where it read None).
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=grace_s)
