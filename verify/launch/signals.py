"""How a signal stops verify: the first SIGINT, SIGTERM (what `timeout` and CI send) or SIGHUP raises
`verify.errors.Stopped` in the main thread, where the command's body runs (verify/cli/exits.py), so that the runner
stops what it started and marks its run interrupted (verify/launch/runner.py). No torch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from verify.errors import STOPPING_SIGNALS, Stopped


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """The first SIGINT, SIGTERM or SIGHUP raises Stopped in the main thread; the others while verify stops are
    ignored (it stops what it started within a grace period, then kills it). Elsewhere than the main thread, where
    Python cannot catch signals, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def stop(signum: int, frame: object) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Stopped(signum)

    previous = {signum: signal.signal(signum, stop) for signum in STOPPING_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
