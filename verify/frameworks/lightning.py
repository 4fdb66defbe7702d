"""Lightning: its Trainer and LightningModule, Fabric, and LightningCLI, under each of its package names
(`lightning`, `lightning.pytorch`, `pytorch_lightning`, `lightning.fabric`, `lightning_fabric`).

Source: `Trainer(precision="16-mixed"|"bf16-mixed")` and Fabric's switch on its mixed precision (torch.autocast, and a
torch.amp.GradScaler for 16-mixed); LightningCLI reads the Trainer's from the command line or a config file
(`--trainer.precision`); Fabric built without it takes `fabric run --precision`'s, LT_PRECISION. `trainer.fit(model)`
trains, `self.manual_backward(loss)` is a LightningModule's backward, `seed_everything` seeds every generator.
"gpu", "cuda" and "auto" choose its CUDA accelerator, which unpacks the device's capability when it sets the device
up (DEV021).

Runtime: the loss scaler of 16-mixed is torch.amp.GradScaler, which verify's step recorder follows
(tests/test_framework_scripts.py: a 16-mixed pair whose scalers skip their first updates). Lightning rebuilds a
DataLoader from its constructor's signature, which verify's environment record keeps (functools.wraps). Its
examples read their data three folders above the script, which a run's working folder mirrors.
"""

from __future__ import annotations

from verify.frameworks._framework import BF16, FP16, AmpSwitch, Framework

_MIXED = {("precision", "16-mixed"): FP16, ("precision", "16"): FP16, ("precision", 16): FP16,
          ("precision", "bf16-mixed"): BF16, ("precision", "bf16"): BF16}  # "16-true" is half weights, no autocast
_FULL = frozenset(("precision", value) for value in ("32-true", "32", 32, "64-true", "64", 64))  # fp32 (or fp64)
FRAMEWORK = Framework(
    name="Lightning",
    amp=(
        AmpSwitch(builds=("Trainer",), keywords=("precision",), mixed=_MIXED, full_precision=_FULL,
                  options=("--precision",),
                  parsers={"LightningCLI": ""},
                  fp32_when_built_as=("L.", "pl.", "lightning.", "pytorch_lightning."),
                  switch_on='precision="16-mixed" (through LightningCLI: --trainer.precision 16-mixed, or '
                            'trainer.precision in its config file)'),
        AmpSwitch(builds=("Fabric",), keywords=("precision",), mixed=_MIXED, full_precision=_FULL,
                  launcher_chooses=True,
                  switch_on="fabric run --precision 16-mixed (or LT_PRECISION=16-mixed)"),
    ),
    own_amp_signs=("Fabric(", "self.manual_backward"),
    seed_everything=("lightning.seed_everything", "pytorch_lightning.seed_everything",
                     "lightning.pytorch.seed_everything"),
    trainer_methods=("fit",),
    environment=("LT_PRECISION",),
    reads_above=("../../../Datasets",),  # its examples' data folder, beside the repository
)
# Its trainers under each package name; each picks its CUDA accelerator for "auto", "gpu" or "cuda".
TRAINERS = tuple(
    f"{package}.{name}"
    for package in ("lightning", "lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric")
    for name in ("Trainer", "Fabric")
)
# LightningCLI builds a Trainer whose accelerator comes from the command line or a config file (`--trainer.accelerator
# gpu`, default "auto"): CUDA's, for all the script's text says.
CLIS = tuple(f"{package}.cli.LightningCLI" for package in ("lightning.pytorch", "pytorch_lightning"))
# Its accelerators that are not CUDA's: none asks for a compute capability.
NOT_CUDA_ACCELERATORS = frozenset({"cpu", "mps", "tpu", "xla", "hpu"})
