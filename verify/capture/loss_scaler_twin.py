"""The port's GradScaler played on a reference that has none (verify ORIGINAL PORTED): the twin, and what a script's
own GradScaler is. Runs in verify's child process (bootstrap), inside the step recorder.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from verify.record.schema import LossScalerPlan


class LossScalerTwin:
    """The port's GradScaler, played on a reference that has none (verify ORIGINAL PORTED, schema.LossScalerPlan).

    Each backward() runs on the loss times the scale the port's backward() used at that step and micro-step (a GAN's
    scaler updates between its optimizers, so inside a step), and the fresh gradients are unscaled right after with
    GradScaler's own kernel (torch._amp_foreach_non_finite_check_and_unscale_), so the script's clipping and optimizer
    see true gradients, as after the port's unscale_(). An optimizer's update is skipped where the port's GradScaler
    skipped that optimizer's, and wherever the gradients it is about to apply hold inf/NaN (what GradScaler.step
    checks): an overflow must never reach the weights, or verify itself would make the NaN it reports. A reference in
    fp32 is scaled too: a power of two scales every gradient exactly there, and both sides' backward records then carry
    one scale, which the comparison divides out (a mask or a quotient that a backward op computes from forward values
    alone carries none: divided by one side's scale only, it would read as a difference). Skip-only (a plan without
    scales, from runs recorded before): nothing is scaled, and the port's skipped updates are skipped. Skipping is done
    by clearing the gradients before optimizer.step(): torch's optimizers leave a parameter without a gradient, and its
    state, untouched.
    """

    def __init__(self, plan: LossScalerPlan) -> None:
        self.plan = plan
        self.scaling = bool(plan.scales)
        self.scale = plan.scales[min(plan.scales)] if self.scaling else 1.0
        self.overflowed: list[int] = []
        self._last_recorded_step: float = _last_step(plan)
        self._steps_without_overflow = 0

    def follow(self, plan: LossScalerPlan, port_running: bool) -> None:
        """The port's GradScaler as recorded so far (followed_port): while the port runs, more steps are coming, so
        the scale moves by itself only past the steps of a port that ended, as after a finished port."""
        self.plan = plan
        self._last_recorded_step = math.inf if port_running else _last_step(plan)

    def scale_at(self, step: int, micro_step: int) -> float:
        if self.plan.scales and (step, micro_step) in self.plan.scales:
            self.scale = self.plan.scales[step, micro_step]
        return self.scale

    def unscale_(self, gradients: list[torch.Tensor]) -> None:
        for group in _by_device_and_dtype(gradients):
            found = torch.zeros(1, device=group[0].device)
            inverse = torch.full((1,), 1.0 / self.scale, device=group[0].device)
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, inverse)

    def overflow_at(self, step: int) -> None:
        """This side's gradients overflowed at `step`: its own check, or its own loss scaler's, found inf/NaN."""
        if step not in self.overflowed:
            self.overflowed.append(step)

    def skips(self, step: int, optimizer: int, gradients: list[torch.Tensor]) -> bool:
        """Whether this optimizer's update at this step is skipped: the port's was, or its gradients overflowed."""
        overflow = _any_non_finite(gradients)
        if overflow:
            self.overflow_at(step)
        if optimizer == 0:
            self._update_dynamically(step, overflow)
        return overflow or [step, optimizer] in self.plan.skipped

    def _update_dynamically(self, step: int, overflow: bool) -> None:
        """Past the port's recorded steps, the scale moves as a GradScaler's would (once per lead optimizer step)."""
        if not self.scaling or step < self._last_recorded_step:
            return
        self._steps_without_overflow = 0 if overflow else self._steps_without_overflow + 1
        if overflow:
            self.scale *= self.plan.backoff_factor
        elif self._steps_without_overflow == self.plan.growth_interval:
            self.scale *= self.plan.growth_factor
            self._steps_without_overflow = 0

    def record(self) -> dict[str, Any]:
        return {"twin": "scale" if self.scaling else "skip-only",
                "followed": sorted({step for step, _ in self.plan.skipped}),
                "overflowed": self.overflowed, "growth_factor": self.plan.growth_factor,
                "backoff_factor": self.plan.backoff_factor, "growth_interval": self.plan.growth_interval}


def _last_step(plan: LossScalerPlan) -> int:
    return max((step for step, _ in plan.scales or {}), default=-1)


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The groups a foreach kernel takes in one call."""
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    return list(groups.values())


def _any_non_finite(tensors: list[torch.Tensor]) -> bool:
    """GradScaler's own check (the unscale kernel with a factor of one), one sync for all groups."""
    flags = []
    for group in _by_device_and_dtype(tensors):
        found = torch.zeros(1, device=group[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(group, found, torch.ones(1, device=group[0].device))
        flags.append(found.cpu())
    return bool(flags) and bool(torch.cat(flags).any())


def script_scaler(scaler: Any) -> dict[str, Any]:
    """What a script's GradScaler is (manifest.loss_scaler): GradScaler's constructor arguments, as it keeps them."""
    return {"init_scale": float(getattr(scaler, "_init_scale", 0.0)),
            "growth_factor": float(getattr(scaler, "_growth_factor", 2.0)),
            "backoff_factor": float(getattr(scaler, "_backoff_factor", 0.5)),
            "growth_interval": int(getattr(scaler, "_growth_interval", 2000)),
            "dynamic": bool(getattr(scaler, "_dynamic", True))}
