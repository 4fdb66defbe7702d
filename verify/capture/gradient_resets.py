"""Whether an optimizer applies gradients that hold what it has applied before: nothing reset them (zero_grad) between
its reads, so each backward() adds to gradients already used. In verify's child process.

Tracked per parameter and per optimizer, by the gradient tensor and its version counter (in-place writes bump it),
never by values, so no device sync: an optimizer *reads* its parameters' gradients when its step() ends, and also at
each backward() run inside its step() (LBFGS's closure, evaluated many times per step: the optimizer reads each
evaluation's gradients). A later backward() that finds a gradient still as its optimizer read it (the same tensor,
unwritten since) adds to it: that parameter *carries* its gradient, until a reset replaces it (set to None) or writes
it (zero_(), which bumps its version) before the next backward(). The optimizer's next read of a parameter that still
carries is a step with gradients not reset. With two optimizers (a GAN), the generator's backward() also adds to the
discriminator's gradients its optimizer read, and the discriminator's zero_grad() resets them before its next read:
that is no carry, where a step-wide "gradients left at the first backward()" would see one on every faithful GAN.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

_State = tuple[weakref.ref, int]  # a gradient tensor and its version counter at a moment


def _state(grad: Any) -> _State:
    return weakref.ref(grad), grad._version


def _unwritten(state: _State | None, grad: Any) -> bool:
    """Whether `grad` is the tensor of `state`, unwritten since."""
    return state is not None and state[0]() is grad and grad._version == state[1]


class GradientResets:
    """Watches the gradients optimizers read (module docstring); `carried` says whether a read since the last
    `take()` found a gradient not reset since the reader's previous read."""

    def __init__(self) -> None:
        self._read: dict[int, _State] = {}  # id(parameter) -> its gradient as its optimizer last read it
        self._carrying: dict[int, _State] = {}  # id(parameter) -> its gradient after the last backward added to it
        self.carried = False

    def before_backward(self, parameters: Iterable[Any]) -> None:
        """Which parameters this backward() adds to a gradient their optimizer read and nothing reset since."""
        for parameter in parameters:
            key, grad = id(parameter), parameter.grad
            as_left = self._carrying.get(key), self._read.get(key)
            if grad is not None and any(_unwritten(state, grad) for state in as_left):
                self._carrying[key] = _state(grad)
            else:
                self._carrying.pop(key, None)

    def after_backward(self, parameters: Iterable[Any], stepping: list[Any]) -> None:
        """The carried gradients as this backward() left them; inside an optimizer's step() (`stepping`: its
        parameters, a closure's backward), the optimizer reads them."""
        for parameter in parameters:
            if id(parameter) in self._carrying and parameter.grad is not None:
                self._carrying[id(parameter)] = _state(parameter.grad)
        if stepping:
            self.read(stepping)

    def read(self, parameters: list[Any]) -> None:
        """An optimizer reads its parameters' gradients (its step() ends, or a closure's backward() inside it)."""
        # The same tensor only, whatever its version: clipping and unscaling write it between backward() and step()
        self.carried |= any(id(p) in self._carrying and self._carrying[id(p)][0]() is p.grad
                            for p in parameters if p.grad is not None)
        for parameter in parameters:
            self._carrying.pop(id(parameter), None)
            if parameter.grad is None:
                self._read.pop(id(parameter), None)
            else:
                self._read[id(parameter)] = _state(parameter.grad)

    def take(self) -> bool:
        """Whether a read carried since the last take (a step's end)."""
        carried, self.carried = self.carried, False
        return carried
