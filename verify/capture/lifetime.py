"""A training process ends with the process that started it, however that one ends (SIGKILL included): verify for
the bootstrap, the bootstrap that launched them for torch's ranks, the script for the ranks it spawns. verify stops
its runs itself when it is stopped (verify/launch/process_tree.py); this covers verify killed too hard to do so.

And it hears the signals that stop it: verify starts the bootstrap while it holds SIGINT, SIGTERM and SIGHUP
(process_tree.signals_held), and a process inherits its parent's signal mask through exec, so the bootstrap unblocks
them before anything else (`signals_heard`): a script's own handlers run when verify stops it, in the grace period
before SIGKILL.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from verify.errors import STOPPING_SIGNALS

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """SIGKILL to this process when the thread that started it ends (Linux's PR_SET_PDEATHSIG; elsewhere nothing);
    `parent` is that process's pid, which tells whether it ended before this could be set."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it ended already, so no signal will come
        os._exit(1)


def signals_heard() -> None:
    """SIGINT, SIGTERM and SIGHUP delivered to this process again, with their handlers (the script's, once it installs
    some; else Python's KeyboardInterrupt and the default ends), whatever mask it inherited."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPPING_SIGNALS)
