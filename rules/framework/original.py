"""The original script a port was made from, as the fixes of `migrate PORT --fix-from PAIR` read it (no rule lives
here): its calls in source order under a key the port's calls get alike, and the port's line that holds one of its
lines. The rules that give the port the original's seeds and data order (DET201, DATA201) compare the two this way.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from typing import Callable

import libcst as cst
import libcst.matchers as m

from rules.framework.tree import findall
from rules.framework.types import Settings

_CALL = m.Call()  # kept in a constant: findall compiles it once
_EMPTY = cst.Module([])
# The calls that build a DataLoader, by the last name of what is called (torch.utils.data.DataLoader, DataLoader).
LOADER = "DataLoader"

Key = Callable[[cst.Call], "str | None"]


class ReadsTheOriginal:
    """Mixed into the rules that give a port the original's code (`migrate PORT --fix-from PAIR`): they run only
    where the fix hands them the original's source (Settings.original_source)."""

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.original_source is not None and super().wants(source, settings)  # type: ignore[misc]


@lru_cache(maxsize=4)
def parsed(source: str) -> cst.Module:
    """The original's tree (parsed once per fix round, whichever rule asks first)."""
    return cst.parse_module(source)


def node_code(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def called_name(call: cst.Call) -> str:
    """The last name of what `call` calls: `manual_seed` for `torch.Generator().manual_seed(7)`."""
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def loader_arguments(module: cst.Module) -> set[cst.Call]:
    """The calls inside a DataLoader call's arguments (`generator=torch.Generator().manual_seed(7)`): they belong to
    the loader, whose order arguments DATA201 compares whole, and are no seeding call of their own."""
    return {inner for call in findall(module, _CALL) if called_name(call) == LOADER
            for arg in call.args for inner in findall(arg, _CALL)}


def keyed_calls(module: cst.Module, key: Key) -> dict[cst.Call, tuple[str, int]]:
    """Each call `key` names, with its key and how many calls of that key come before it in source order: the k-th
    call of a key in the port stands for the k-th of the original."""
    seen: dict[str, int] = {}
    keyed = {}
    for call in findall(module, _CALL):
        name = key(call)
        if name is not None:
            keyed[call] = (name, seen.get(name, 0))
            seen[name] = seen.get(name, 0) + 1
    return keyed


def mapped_line(original: str, port: str, line: int) -> int | None:
    """The port's line holding the original's `line` (compared stripped: migrate indents what it wraps)."""
    for a, b, size in _matching_blocks(original, port):
        if a < line <= a + size:
            return b + line - a
    return None


@lru_cache(maxsize=4)
def _matching_blocks(original: str, port: str) -> list[difflib.Match]:
    matcher = difflib.SequenceMatcher(None, [s.strip() for s in original.splitlines()],
                                      [s.strip() for s in port.splitlines()], autojunk=False)
    return matcher.get_matching_blocks()
