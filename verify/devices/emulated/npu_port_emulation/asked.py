"""What a run asked of its emulated device beyond torch's device API, each a row of EMULATED that its manifest names
when the run used it (extra["emulated_calls"]): torch.distributed's sharding (sharding.py) and DeepSpeed's runtime
(deepspeed_runtime.py). Their patches apply when the script imports the module they patch (verify.frameworks
when_imported): importing FSDP or DeepSpeed costs seconds a process, which a run that never uses them must not pay.
"""

from __future__ import annotations

from verify.frameworks import when_imported  # noqa: F401  (the emulation's patches are applied so)

EMULATED = {
    "mesh_device": "fully_shard's mesh device: the emulation target",
    "rng_tracker": "DTensor's RNG tracker: a Philox seed and offset of the emulated generator",
    "capability": "torch.distributed's question of the device capability: (8, 0), where torch_npu tells a script None",
    "fresh_memory": "Module.to_empty: fresh device memory reads zeros",
    "attention_by_shard": "scaled_dot_product_attention of DTensors: each rank's heads (or batch) on their own, as "
                          "the device's fused kernel's sharding rule has it (the CPU's kernel has no rule)",
    "cann_home": "ASCEND_HOME_PATH, which a CANN install sets, for DeepSpeed's NPU accelerator: a folder with no CANN",
    "cuda_ops": "DeepSpeed's CUDA-built optimizer ops (FusedAdam, FusedLamb, FusedLion), which a GPU host compiles "
                "with the CUDA toolkit: DeepSpeed's own torch implementations of them (those its NPU accelerator runs)",
}
USED: list[str] = []


def note(emulation: str) -> None:
    """The run used `emulation` (a key of EMULATED)."""
    if EMULATED[emulation] not in USED:
        USED.append(EMULATED[emulation])
