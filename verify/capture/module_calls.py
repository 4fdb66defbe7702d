"""Global forward hooks that see each module call's entry and exit with its path, for the child's own bookkeeping
(verify/capture/precision_scopes.py, verify/capture/random_streams.py): the paths are the op records'
(module_scopes.ModuleScopes.name)."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from verify.capture.module_scopes import ModuleScopes


class ModuleCalls:
    """Global forward hooks that see each module call's entry and exit, exceptions included, with its path."""

    def __init__(self) -> None:
        self.names = ModuleScopes()  # naming only: the same paths as the op records
        self.depth = 0
        self._handles: list[Any] = []

    def __enter__(self):
        self._handles = [register_module_forward_pre_hook(self._entering),
                         register_module_forward_hook(self._left, always_call=True)]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._handles:
            handle.remove()

    def _entering(self, module: torch.nn.Module, args: Any) -> Any:
        result = self.entering(self.names.name(module), args, outermost=self.depth == 0)
        self.depth += 1
        return result

    def _left(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self.depth -= 1
        self.left()

    def entering(self, path: str, args: Any, outermost: bool) -> Any:
        """At each call's entry; may return the call's arguments replaced."""

    def left(self) -> None:
        """At each call's exit."""
