"""Python's cyclic garbage collector, paused while migrate ports one file.

A port builds big, long-lived trees (libcst's of the source and of the port, Python's `ast` of the source for the
checklist): a hundred thousand objects for a real script, all alive until the file is done. Each collection of the
oldest generation walks all of them to free nothing, and building them starts many: parsing costs a third more with the
collector on. Paused for one file, it collects what the file left once it runs again.

The command's start-up is the same story: the modules it loads (libcst's matchers alone make hundreds of classes) are
kept for the whole run, and every collection of the oldest generation would walk them again. Paused while they load,
they are then frozen (gc.freeze: moved where no collection looks) before the first file.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic garbage collection inside; a caller that had paused it already keeps it paused."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


_paused_for_startup = False


def pause_for_startup() -> None:
    """The command starts: no cyclic garbage collection until `startup_done`."""
    global _paused_for_startup
    if gc.isenabled():
        gc.disable()
        _paused_for_startup = True


def startup_done() -> None:
    """The modules are loaded: freeze what exists now, and let the collector run again (only if the start-up paused
    it; before any worker process is made, so that the workers inherit a collector that runs)."""
    global _paused_for_startup
    if _paused_for_startup:
        gc.freeze()
        gc.enable()
        _paused_for_startup = False
