"""torch_npu.optim on the emulated NPU: each fused optimizer is the torch optimizer with the same update rule.

The real ones fuse the parameter updates into few kernels; the arithmetic is the same, the rounding may differ.
Those with no torch counterpart (Lamb, AdamP, BertAdam, RMSpropTF) raise NotImplementedError when created.
"""

from __future__ import annotations

import torch

from npu_port_emulation.target import EMULATION

PLAIN_COUNTERPARTS: dict[str, type[torch.optim.Optimizer]] = {
    "NpuFusedSGD": torch.optim.SGD,
    "NpuFusedAdam": torch.optim.Adam,
    "NpuFusedAdamW": torch.optim.AdamW,
    "NpuFusedRMSprop": torch.optim.RMSprop,
    "NpuFusedAdadelta": torch.optim.Adadelta,
}
NOT_EMULATED = ("NpuFusedLamb", "NpuFusedAdamP", "NpuFusedBertAdam", "NpuFusedRMSpropTF")

__all__ = [*PLAIN_COUNTERPARTS, *NOT_EMULATED]


def _stand_in(name: str, plain: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    doc = f"{name} on {EMULATION}: torch.optim.{plain.__name__}, under the name scripts and reports use."
    return type(name, (plain,), {"__doc__": doc, "__module__": __name__})


def _not_emulated(name: str) -> type[torch.optim.Optimizer]:
    def __init__(self: torch.optim.Optimizer, *args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"torch_npu.optim.{name} has no torch counterpart and is not emulated ({EMULATION})")

    return type(name, (torch.optim.Optimizer,), {"__init__": __init__, "__module__": __name__})


globals().update({name: _stand_in(name, plain) for name, plain in PLAIN_COUNTERPARTS.items()})
globals().update({name: _not_emulated(name) for name in NOT_EMULATED})
