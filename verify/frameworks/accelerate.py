"""Hugging Face accelerate: its Accelerator and `accelerate launch`.

Source: `Accelerator(mixed_precision="fp16"|"bf16")` switches on its mixed precision (torch.autocast, and a
torch.amp.GradScaler for fp16, behind `accelerator.backward(loss)`); built without the keyword, the launcher chooses
(`accelerate launch --mixed_precision fp16`, its config file, ACCELERATE_MIXED_PRECISION). `accelerate.utils.set_seed`
seeds every generator.

Runtime: the launcher starts the ranks as torchrun does (RANK, LOCAL_RANK, WORLD_SIZE) and hands the precision down in
ACCELERATE_MIXED_PRECISION (tests/verify/scripts/accelerate_ranks_npu.py). On several processes its prepared
DataLoaders broadcast rank 0's RNG states when each epoch starts (accelerate/utils/random.py
`synchronize_rng_state`): torch.distributed.broadcast, which asks the device's capability (DEV022).
"""

from __future__ import annotations

from verify.frameworks._framework import BF16, FP16, AmpSwitch, Framework

FRAMEWORK = Framework(
    name="accelerate",
    amp=(
        AmpSwitch(
            builds=("Accelerator",),
            keywords=("mixed_precision",),
            mixed={("mixed_precision", "fp16"): FP16, ("mixed_precision", "bf16"): BF16},
            full_precision=frozenset({("mixed_precision", "no")}),
            options=("--mixed_precision", "--mixed-precision"),  # accelerate's examples declare the launcher's
            launcher_chooses=True,
            switch_on="accelerate launch --mixed_precision fp16 (or ACCELERATE_MIXED_PRECISION=fp16)",
        ),
    ),
    own_amp_signs=("Accelerator(", "accelerator.backward"),  # whatever the script names its Accelerator
    seed_everything=("accelerate.utils.set_seed",),
    environment=("ACCELERATE_MIXED_PRECISION",),
)
# What of accelerate's broadcasts through torch.distributed.broadcast: its Accelerator's prepared DataLoaders.
BROADCASTERS = ("accelerate.Accelerator",)
