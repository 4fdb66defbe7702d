"""torch.npu.amp of the emulated NPU: autocast and the NPU's GradScaler, on the emulation target."""

from __future__ import annotations

from typing import Any

import torch

from npu_port_emulation.target import EMULATION, TARGET

__all__ = ["autocast", "GradScaler", "custom_fwd", "custom_bwd"]


class autocast(torch.amp.autocast_mode.autocast):
    """`torch.npu.amp.autocast(...)` is `torch.autocast("npu", ...)`, float16 by default as on the NPU."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16, cache_enabled: bool = True):
        super().__init__("npu", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """torch_npu's GradScaler: torch's, plus `dynamic=False` for a static loss scale.

    Like the real one, state_dict() carries "dynamic" and load_state_dict() requires it, so resuming from a CUDA
    GradScaler checkpoint fails here as it would on the NPU.
    """

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        dynamic: bool = True,
    ):
        super().__init__(TARGET, init_scale, growth_factor, backoff_factor, growth_interval, enabled)
        self._dynamic = dynamic

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if not self._dynamic and new_scale is None and self._enabled:
            new_scale = self.get_scale()  # a static scale: never grows or backs off
        super().update(new_scale)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state:
            state["dynamic"] = self._dynamic
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._enabled and "dynamic" not in state_dict:
            raise KeyError(
                "torch_npu's GradScaler.load_state_dict needs the 'dynamic' key: this state comes from a CUDA "
                f"GradScaler ({EMULATION}, reproducing the real torch_npu)"
            )
        self._dynamic = state_dict.get("dynamic", self._dynamic)
        super().load_state_dict(state_dict)


def custom_fwd(fwd=None, *, cast_inputs: torch.dtype | None = None):
    """`torch.amp.custom_fwd(device_type="npu")`, looked up when called so that the npu device_type is translated."""
    return torch.amp.custom_fwd(fwd, device_type="npu", cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    return torch.amp.custom_bwd(bwd, device_type="npu")
