"""The calibration run's perturbation: the reference computed once more under another, equally valid summation order
or rounding, so that the comparison can measure how far the script's own numbers move when nothing but that changes
(the reference's envelope, verify/compare/envelope.py).

A calibration sums in the order the plan names: the first, the port's emulated device's own order (an emulated face
reads it from verify.devices' BLOCKS_VAR, set by the runner; on a real CPU or GPU, verify/capture/session.py enters a
mode that sums so). Summation order alone is what separates a faithful port from its original
on the emulators, and its effects are not all small: a result near zero (a ReLU's input, a cancelling sum) changes
sign under another order, and the gradient it gates flips. Random rounding moves each result relative to its own
value, so it never flips such a sign; measured on pytorch/examples' mnist_rnn ported to fp16, the bias gradient of the
layer after a ReLU took the same flipped value (1232 against 1206) in the port, in the reference summed in three or
four blocks, and in the reference at two threads, and the unflipped one in each of four rounding calibrations. So
rounding is added only where the order cannot be set (--exact-emulation), where the plan asks for it (the further
calibration runs, and the first where the port's order is not modelled), or where an fp32 reference must cover a
half-precision port (`half`).

Stochastic arithmetic's idea (Verificarlo's Monte Carlo arithmetic, Verrou's random rounding): every floating result
an op computes is moved by a random fraction of its dtype's unit roundoff, up or down, so each rounding goes another
way than in the reference. Where the port computes in half precision and the reference in fp32 (a pair judged fp32
against AMP), the fp32 results are moved by the half dtype's unit roundoff: the port's precision is what the
envelope must cover.

A dispatch mode entered below the op capture, so the capture records the perturbed values; it runs on any device
(a real GPU included) and draws from a generator of its own, never the script's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

# Unit roundoff: half the distance from 1 to the next number, the most a rounding to nearest moves a result.
_UNIT_ROUNDOFF = {dtype: torch.finfo(dtype).eps / 2 for dtype in (torch.float64, torch.float32, torch.float16,
                                                                  torch.bfloat16)}
_HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# Ops that compute nothing (they move, cast or copy values) or draw random numbers: their results are not roundings.
_NOT_COMPUTED = {"aten._to_copy", "aten.copy_", "aten.clone", "aten.detach", "aten.alias", "aten.lift_fresh",
                 "aten._local_scalar_dense", "aten.empty_like", "aten.zeros_like", "aten.ones_like", "aten.full_like"}


class RandomRounding(TorchDispatchMode):
    """Moves every floating result of a computing op by up to its dtype's unit roundoff (or `half`'s, for fp32
    results), relative to its value, so that it rounds to either neighbour; draws from its own seeded generator."""

    def __init__(self, seed: int, half: torch.dtype | None) -> None:
        super().__init__()
        self.seed, self.half = seed, half
        self._generators: dict[torch.device, torch.Generator] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if _computes(func, args):
            for tensor in tree_flatten(result)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
                    self._perturb(tensor)
        return result

    def _perturb(self, tensor: torch.Tensor) -> None:
        """Whole numbers stay: a mask, a count, a saturated sigmoid's 1.0 or a clamp's bound is exact on every
        device, and moved it would leave its domain (a probability above 1, an index cut to the one below)."""
        epsilon = _UNIT_ROUNDOFF.get(self.half if self.half and tensor.dtype == torch.float32 else tensor.dtype)
        if epsilon is None:
            return
        with _disable_current_modes():  # drawn beside the run: no mode below (aligned streams, a device's) sees it
            noise = torch.rand(tensor.shape, generator=self._generator(tensor.device), device=tensor.device,
                               dtype=tensor.dtype)
        noise.mul_(2 * epsilon).sub_(epsilon).masked_fill_(torch.frac(tensor) == 0, 0)
        tensor.add_(tensor * noise)

    def _generator(self, device: torch.device) -> torch.Generator:
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]


def _computes(func: Any, args: tuple) -> bool:
    """A computation on tensors: not a view, a copy, a cast, a factory or a random draw."""
    if func.is_view or torch.Tag.nondeterministic_seeded in func.tags:
        return False
    if f"aten.{func.__name__.split('.')[0]}" in _NOT_COMPUTED:
        return False
    return any(isinstance(arg, torch.Tensor) for arg in tree_flatten(args)[0])


def rounds(plan: dict[str, Any], order_set: bool) -> bool:
    """Whether a calibration run (manifest.perturbation: {"seed", "half", "blocks", "rounding"}) rounds at random:
    where its plan asks, where it covers a half-precision port, or where its device does not sum in the plan's order
    (`order_set`: session._summation_order_set; plans written before "rounding" always rounded)."""
    return bool(plan.get("rounding", True) or plan.get("half") or not order_set)


@contextlib.contextmanager
def perturbed(plan: dict[str, Any], order_set: bool) -> Iterator[None]:
    """The calibration run's random rounding where it `rounds`; nothing for any other run."""
    if not plan or not rounds(plan, order_set):
        yield
        return
    with RandomRounding(int(plan["seed"]), _HALF.get(plan.get("half", ""))):
        yield
