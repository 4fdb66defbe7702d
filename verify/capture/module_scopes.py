"""The module an op runs in, forward or backward, as torch.utils.module_tracker.ModuleTracker would report it, for a
small part of its cost (ModuleScopes), and the model inside its wrappers (DataParallel, DDP, torch.compile's).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import register_multi_grad_hook
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._pytree import tree_flatten
from torch.utils.hooks import RemovableHandle

from verify.frameworks import torch_compile


def leaves(value: Any) -> Sequence[Any]:
    """The pytree leaves of a module's inputs or output, without walking pytree for a tensor or tuple of tensors."""
    if isinstance(value, torch.Tensor):
        return (value,)
    if type(value) is tuple and all(isinstance(item, torch.Tensor) for item in value):
        return value
    return tree_flatten(value)[0]


# Modules that wrap a model without computing anything of their own, and the attribute holding the model.
_WRAPPERS = {"DataParallel": "module", "DistributedDataParallel": "module",
             torch_compile.WRAPPER_CLASS: torch_compile.WRAPPED_MODULE}


def _wrapped(module: torch.nn.Module) -> torch.nn.Module | None:
    attribute = _WRAPPERS.get(type(module).__name__)
    inner = getattr(module, attribute, None) if attribute else None
    return inner if isinstance(inner, torch.nn.Module) else None


def unwrapped(module: torch.nn.Module) -> torch.nn.Module:
    """The model inside any wrappers (DataParallel(model).module, DDP, torch.compile's _orig_mod)."""
    while (inner := _wrapped(module)) is not None:
        module = inner
    return module


class ModuleScopes:
    """The module an op runs in, forward or backward, as torch.utils.module_tracker.ModuleTracker reports it: its
    names, its events (in backward a module is entered when the gradients of its outputs are ready and left when
    those of its inputs are; the end of a backward leaves them all) and its innermost module (the longest active
    name), for a small part of its cost. ModuleTracker walks every module's inputs and outputs with pytree and puts a
    multi-grad hook on them, and keeps every hook until it exits. Here pytree walks only nested inputs and outputs
    (a walk costs 15 us), only the hooks on leaf tensors, which outlive the step, are kept (until
    `release_leaf_hooks`), and the innermost module is found when the active set changes instead of on every op."""

    # ModuleTracker's set holds this name too; kept so that the set, whose order decides between active names of
    # equal length, iterates as ModuleTracker's does.
    _GLOBAL = "Global"

    def __init__(self) -> None:
        self.innermost = ""  # the path of the innermost active module; "" outside modules
        self._active = {self._GLOBAL}
        self._names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._named_children: weakref.WeakSet = weakref.WeakSet()
        self._end_of_backward_queued = False
        self._module_hooks: list[RemovableHandle] = []
        self._leaf_hooks: list[RemovableHandle] = []

    def __enter__(self) -> ModuleScopes:
        self._module_hooks = [
            register_module_forward_pre_hook(self._forward_starts),
            register_module_forward_hook(self._forward_ends),
        ]
        return self

    def __exit__(self, *exc_info: object) -> None:
        for handle in self._module_hooks:
            handle.remove()
        self.release_leaf_hooks()

    @staticmethod
    def in_backward() -> bool:
        return torch._C._current_graph_task_id() != -1

    def release_leaf_hooks(self) -> None:
        for handle in self._leaf_hooks:
            handle.remove()
        self._leaf_hooks = []

    def name(self, module: torch.nn.Module) -> str:
        """The outermost module is named after its class; a module seen for the first time names its children (and
        theirs) after itself. A wrapper (DataParallel, DDP, torch.compile's) and the model it wraps share the model's
        name, so that a script wrapping its model on one device and not on another still pairs op for op."""
        name = self._names.get(module)
        if name is None:
            name = self._names[module] = type(unwrapped(module)).__name__
        if module not in self._named_children:
            inner = _wrapped(module)
            for child_name, child in module.named_children():
                self._names[child] = name if child is inner else f"{name}.{child_name}"
                self.name(child)
            self._named_children.add(module)
        return name

    def _forward_starts(self, module: torch.nn.Module, args: Any) -> None:
        name = self.name(module)
        self._enter(name)
        self._when_gradients_ready(args, lambda: self._leave(name))

    def _forward_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.name(module)
        self._leave(name)
        self._when_gradients_ready(output, lambda: self._enter_backward(name))

    def _when_gradients_ready(self, value: Any, action: Callable[[], None]) -> None:
        """Runs `action` once the gradients of the tensors in `value` that require one are computed (as ModuleTracker,
        never for the tensor that backward() starts from)."""
        tensors = [leaf for leaf in leaves(value) if isinstance(leaf, torch.Tensor) and leaf.requires_grad]
        if not tensors:
            return
        if len(tensors) == 1:
            handle = self._when_gradient_ready(tensors[0], action)
        else:
            handle = register_multi_grad_hook(tensors, lambda gradients: action())
        if any(tensor.grad_fn is None for tensor in tensors):
            self._leaf_hooks.append(handle)

    @staticmethod
    def _when_gradient_ready(tensor: torch.Tensor, action: Callable[[], None]) -> RemovableHandle:
        """register_multi_grad_hook for one tensor (most module inputs and outputs) at half its cost, and like it
        never for the tensor backward() starts from: the engine does not "execute" that tensor's node."""
        node = tensor.grad_fn  # None for a leaf, whose gradient is computed only when it is part of the graph

        def hook(gradient: torch.Tensor) -> None:
            if node is None or torch._C._will_engine_execute_node(node):
                action()

        return tensor.register_hook(hook)

    def _enter_backward(self, name: str) -> None:
        if not self._end_of_backward_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_ended)
            self._end_of_backward_queued = True
        self._enter(name)

    def _backward_ended(self) -> None:
        self._active = {self._GLOBAL}
        self._end_of_backward_queued = False
        self._find_innermost()

    def _enter(self, name: str) -> None:
        self._active.add(name)
        self._find_innermost()

    def _leave(self, name: str) -> None:
        self._active.discard(name)
        self._find_innermost()

    def _find_innermost(self) -> None:
        innermost = ""
        for name in self._active:
            if name != self._GLOBAL and len(name) > len(innermost):  # a child's path extends its parent's
                innermost = name
        self.innermost = innermost
