"""Where a run computes under autocast, module call by module call; and the same places imposed on a reference.

A port that `migrate` gave mixed precision runs its model's forwards under autocast and leaves outside what autocast
refuses or what the script keeps in float32: `criterion(output.float(), label.float())` with an nn.BCELoss, which
CUDA and NPU autocast ban, or a validation pass. A reference run under one autocast around the whole script would
compute that loss under autocast, where it raises "unsafe to autocast": verify would break the run it measures. So:

- every run records, per module path (named as the op capture names them, verify/capture/ops.py `ModuleScopes.name`),
  the autocast each call of that module was entered under, in call order and run-length encoded:
  `manifest.autocast_scopes = {"Net": [["float16", 20], ["off", 5]], "BCELoss": [["off", 40]], ...}`.
- a reference that follows a port (`manifest.autocast_follow`: the port's record; `manifest.autocast`: the dtype;
  or, run at once with the port, the port's record as it is written: verify/capture/followed_port.py) enters the
  n-th call of each module under the autocast of the port's n-th call of it, and restores the autocast around it
  when the call returns. A call of an outermost module (none other running) also sets the autocast of
  the script level from then on, where the port computes its loss after the model's forward under the same
  `with torch.autocast(...)`. A module entered outside autocast from inside it gets its half-precision inputs as
  float32, as the port's call got them. Calls past the port's recorded ones take its last state; modules the port
  never called inherit the autocast around them. An empty `autocast_follow` imposes it around the whole script.

Module granularity: ops a script calls at its top level follow the latest outermost module call, and before the
first one run outside autocast (data preparation: migrate never puts it under autocast).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_map

from verify.capture.module_calls import ModuleCalls
from verify.record.schema import AUTOCAST_DTYPES

OFF = "off"
_HALF = (torch.float16, torch.bfloat16)
# What a reference follows: (module path, call number) -> the followed run's record of that module's calls, one that
# holds that call unless the run ended before it (None: the run never called the module).
Follow = Callable[[str, int], "list[list[Any]] | None"]


def _state(device_type: str) -> str:
    """The autocast this thread computes under for `device_type`: a dtype name, or "off"."""
    if not torch.is_autocast_enabled(device_type):
        return OFF
    return str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")


class ScopeRecorder(ModuleCalls):
    """Records `manifest.autocast_scopes` in place (the manifest is rewritten after every step)."""

    def __init__(self, device_type: str, scopes: dict[str, list[list[Any]]]) -> None:
        super().__init__()
        self.device_type = device_type
        self.scopes = scopes

    def entering(self, path: str, args: Any, outermost: bool) -> None:
        state = _state(self.device_type)
        runs = self.scopes.setdefault(path, [])
        if runs and runs[-1][0] == state:
            runs[-1][1] += 1
        else:
            runs.append([state, 1])


class FollowedScopes(ModuleCalls):
    """Enters each module call under the autocast of the followed run's call of the same number, restoring the
    autocast around it when the call returns; an outermost call sets the script level's too."""

    def __init__(self, device_type: str, follow: Follow) -> None:
        super().__init__()
        self.device_type = device_type
        self.follow = follow
        self._calls: dict[str, int] = {}
        self._contexts: list[contextlib.ExitStack] = []

    def entering(self, path: str, args: Any, outermost: bool) -> Any:
        wanted, current = self._followed_state(path), _state(self.device_type)
        context = contextlib.ExitStack()
        self._contexts.append(context)
        if wanted is None or wanted == current:
            return None
        if outermost:
            _set_state(self.device_type, wanted)
        else:
            context.enter_context(_autocast(self.device_type, wanted))
        return tree_map(_as_float32, args) if wanted == OFF else None

    def _followed_state(self, path: str) -> str | None:
        """The state of the followed run's call of `path` with this call's number (past its calls: its last)."""
        number = self._calls[path] = self._calls.get(path, -1) + 1
        runs = self.follow(path, number)
        if not runs:
            return None
        for state, count in runs:
            if number < count:
                return state
            number -= count
        return runs[-1][0]

    def left(self) -> None:
        self._contexts.pop().close()


def _autocast(device_type: str, state: str) -> torch.autocast:
    # No cast cache: the script-level autocast lasts the whole script, and its half copies of the weights would stay
    # those of step 0 while the optimizer updates the weights.
    if state == OFF:
        return torch.autocast(device_type, enabled=False, cache_enabled=False)
    return torch.autocast(device_type, dtype=getattr(torch, state), cache_enabled=False)


def _set_state(device_type: str, state: str) -> None:
    """The script level's autocast from now on (inside the imposed autocast, which restores it at the end)."""
    torch.set_autocast_enabled(device_type, state != OFF)
    if state != OFF:
        torch.set_autocast_dtype(device_type, getattr(torch, state))


def _as_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _HALF:
        return value.float()
    return value


@contextlib.contextmanager
def recorded(device_type: str, scopes: dict[str, list[list[Any]]]) -> Iterator[None]:
    with ScopeRecorder(device_type, scopes):
        yield


def following(record: dict[str, list[list[Any]]]) -> Follow | None:
    """A finished run's autocast record (manifest.autocast_follow) to follow; None where it is empty."""
    return (lambda path, number: record.get(path)) if record else None


@contextlib.contextmanager
def imposed(device_type: str, autocast_flag: str, follow: Follow | None) -> Iterator[None]:
    """The reference's autocast: the followed run's state at each module call, the script level off until the first
    outermost call (migrate puts data preparation outside autocast); without a run to follow, `autocast_flag` around
    the whole script."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_autocast(device_type, OFF if follow else AUTOCAST_DTYPES[autocast_flag]))
        if follow is not None:
            stack.enter_context(FollowedScopes(device_type, follow))
        yield
