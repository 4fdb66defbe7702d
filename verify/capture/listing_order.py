"""Directory listings in one order on both sides: a script's os.listdir and os.scandir, and what reads through them
(glob, os.walk, pathlib's iterdir and glob), give their entries sorted by name.

The order a directory lists its entries in is the file system's (ext4 hashes names, another file system keeps them
in creation order): the same folder lists in another order on another machine. A dataset that indexes the files as
listed (pytorch/examples' super_resolution: `[join(dir, x) for x in listdir(dir)]`) gives each index another file
there, and its port, which `migrate` makes list them sorted (rules: data order), would read other batches than its
original from the first step, whatever its computation. Sorted on both sides, both read the batches the original
reads wherever its files list by name. Python's own imports read directories through `posix` directly, untouched. A
listing leaves out what another run is saving (whole_saves). The manifest counts the listings a run sorted
(extra["listings_sorted"]).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from verify.capture import whole_saves


class _SortedScandir:
    """os.scandir's iterator with its entries sorted by name; a context manager as os.scandir's is."""

    def __init__(self, entries: list[os.DirEntry]) -> None:
        self._entries = iter(sorted(entries, key=lambda entry: entry.name))

    def __iter__(self) -> "_SortedScandir":
        return self

    def __next__(self) -> os.DirEntry:
        return next(self._entries)

    def __enter__(self) -> "_SortedScandir":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._entries = iter(())


def _being_saved(name: Any) -> bool:
    """Whether a listed name is a file a run going at once is saving (whole_saves.temporary_name): not one of the
    script's files, and gone once it is renamed into place."""
    return isinstance(name, str) and whole_saves.TEMPORARY.fullmatch(name) is not None


@contextlib.contextmanager
def sorted_listings(counts: dict[str, Any]) -> Iterator[None]:
    """os.listdir and os.scandir sorted while the script runs; `counts["listings_sorted"]` counts their calls."""
    listdir, scandir = os.listdir, os.scandir

    def sorted_listdir(path: Any = ".") -> list:
        counts["listings_sorted"] = counts.get("listings_sorted", 0) + 1
        return sorted(name for name in listdir(path) if not _being_saved(name))

    def sorted_scandir(path: Any = ".") -> _SortedScandir:
        counts["listings_sorted"] = counts.get("listings_sorted", 0) + 1
        with scandir(path) as entries:
            return _SortedScandir([entry for entry in entries if not _being_saved(entry.name)])

    os.listdir, os.scandir = sorted_listdir, sorted_scandir
    try:
        yield
    finally:
        os.listdir, os.scandir = listdir, scandir
