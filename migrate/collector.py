"""Python's cyclic garbage collector, paused while migrate ports one file.

A port builds big, long-lived trees (libcst's of the source and of the port, Python's `ast` of the source for the
checklist): a hundred thousand objects for a real script, all alive until the file is done. Each collection of the
oldest generation walks all of them to free nothing, and building them starts many: parsing costs a third more with the
collector on. Paused for one file, it collects what the file left once it runs again.
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
