"""FSDP2 (torch.distributed.fsdp.fully_shard): its mixed precision, a MixedPrecisionPolicy.

Source: a script that gives fully_shard a `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=...)` trains
in that dtype: FSDP2 casts the parameters for forward and backward itself and reduces the gradients in reduce_dtype.
The AMP rules add no autocast of their own there, and the checklist reads its param_dtype (bfloat16 needs no loss
scaling). Runtime: each run records the policy of every module fully_shard made, compared as settings. Its device
meshes and collectives on an emulated device are npu_port_emulation/sharding.py's.
"""

from __future__ import annotations

from verify.frameworks._framework import BF16, FP16, AmpSwitch, Framework

FRAMEWORK = Framework(
    name="FSDP2",
    amp=(
        AmpSwitch(builds=("MixedPrecisionPolicy",), keywords=("param_dtype",),
                  mixed={("param_dtype", "torch.bfloat16"): BF16, ("param_dtype", "torch.float16"): FP16},
                  switch_on="MixedPrecisionPolicy(param_dtype=torch.bfloat16) given to fully_shard"),
    ),
    own_amp_signs=("MixedPrecisionPolicy",),
)
# Runtime: the class of the modules fully_shard made (torch.distributed.fsdp since torch 2.6, its _composable home
# before), whose state keeps the policy; the policy's dtypes a run records of each such module, at every step (a
# port that reduces its gradients in bfloat16 where the original reduced them in float32 trains otherwise, within
# bfloat16's noise), as settings named so
MODULE_CLASSES = (("torch.distributed.fsdp", "FSDPModule"), ("torch.distributed._composable.fsdp", "FSDPModule"))
POLICY_DTYPES = ("param_dtype", "reduce_dtype", "output_dtype")
POLICY_SETTINGS = tuple(f"mp_policy.{name}" for name in POLICY_DTYPES)
