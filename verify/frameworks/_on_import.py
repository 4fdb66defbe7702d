"""Patches applied to a module when a script imports it, before the importer binds any of its names: what the
capture follows of a framework (its loss scaler) and what an emulated device answers for one (FSDP's, DeepSpeed's
questions) cost nothing in a run that never imports it. Standard library only, as the whole package.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from types import ModuleType
from typing import Any, Callable


def when_imported(patches: dict[str, Callable[[ModuleType], None]]) -> None:
    """Each patch of `patches` (module name: patch) runs on its module once the module's code has run, before the
    importer binds any of its names; now, for a module imported already."""
    patches = dict(patches)
    for name in [name for name in patches if name in sys.modules]:
        patches.pop(name)(sys.modules[name])
    if patches:
        sys.meta_path.insert(0, _PatchedWhenImported(patches))


class _PatchedWhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a module it patches, it takes the spec the other finders give and patches the module
    once its code has run, before the importer binds any of its names."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self._patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self._patches.pop(name, None)
        if patch is None:
            return None
        spec = importlib.util.find_spec(name)  # the other finders' (this one has no patch for it any more)
        if spec is not None:
            run_module = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                run_module(module)
                patch(module)

            spec.loader.exec_module = exec_module
        return spec
