from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import (
    Case, Edit, Mode, PortRule, Severity, StatementEdits, Unchanged, argument, findall, frameworks, statement,
    string_value,
)
from rules.device._rewrite import capability_statement, statement_holding

_TRAINERS = frameworks.lightning.TRAINERS
_CLIS = frameworks.lightning.CLIS
_CAPABILITY = capability_statement("read by the CUDA accelerator")
_TRANSFER = (("torch_npu.contrib", "transfer_to_npu"),)


class LightningAccelerator(StatementEdits, PortRule):
    """Run Lightning's CUDA accelerator on the NPU: a device capability to unpack, and transfer_to_npu in both modes.

    ## What it does
    In a file that builds a Lightning `Trainer` or `Fabric` (`lightning`, `lightning.pytorch`, `pytorch_lightning`)
    whose accelerator may be CUDA's (`"gpu"`, `"cuda"`, `"auto"`, none given, or a value computed at run time), or a
    `LightningCLI` (its Trainer's accelerator comes from the command line or a config file):
    - sets `TORCH_NPU_DEVICE_CAPABILITY=8.0` with `os.environ.setdefault` (a launcher's own value wins) right before
      the statement that builds the first such Trainer (the accelerator reads it when `fit` sets the device up);
    - in explicit mode, also imports `transfer_to_npu`, and says so: it is the only way Lightning runs on an NPU.
    The accelerator argument, the precision (`"16-mixed"`, `"bf16-mixed"`) and the devices stay as written.

    ## Why
    Lightning has no NPU accelerator (Lightning-AI/pytorch-lightning#19498; its PR #19308 was closed unmerged):
    `"gpu"` and `"auto"` choose its CUDA accelerator, which on an NPU works only through transfer_to_npu
    (`torch.cuda` answering as `torch.npu`; without it: "No supported gpu backend found!"). When the device is set
    up, that accelerator unpacks `major, _ = torch.cuda.get_device_capability(device)`
    (lightning/fabric/accelerators/cuda.py `_is_ampere_or_later`), which torch_npu answers with None unless
    `TORCH_NPU_DEVICE_CAPABILITY` is set: "cannot unpack non-iterable NoneType object" before the first step. 8.0 is
    what the NPU supports (bfloat16); Lightning reads it only to advise on float32 matmul precision. Lightning's
    mixed precision (`torch.autocast("cuda")`, `torch.amp.GradScaler("cuda")`) reaches the NPU through
    transfer_to_npu too.

    ## Safety
    Safe: without it the port cannot start. Every library in the process that asks `get_device_capability()` is
    answered 8.0; DEV008 rewrites the script's own gates. The variable is read by torch_npu releases that document
    it (`torch_npu.npu.get_device_capability`); an older one answers None whatever is set: upgrade torch_npu.

    ## References
    lightning/fabric/accelerators/cuda.py (`_is_ampere_or_later`, `_check_cuda_matmul_precision`),
    lightning/pytorch/trainer/connectors/accelerator_connector.py (`_choose_gpu_accelerator_backend`,
    `MixedPrecision(..., "cuda")`) of lightning 2.6; torch_npu/npu/utils.py (`get_device_capability`,
    TORCH_NPU_DEVICE_CAPABILITY); <https://github.com/Lightning-AI/pytorch-lightning/issues/19498>.
    """

    CODE = "DEV021"
    CHECKLIST = ("C3",)
    TRIGGERS = tuple(sorted({name.rsplit(".", 1)[-1] for name in (*_TRAINERS, *_CLIS)}))
    EXAMPLES = (
        Case(
            """
            import torch
            import lightning as L

            def main():
                trainer = L.Trainer(accelerator="gpu", devices=1, precision="16-mixed")
                trainer.fit(Model())
            """,
            """
            import torch
            import lightning as L
            import os

            def main():
                os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by the CUDA accelerator
                trainer = L.Trainer(accelerator="gpu", devices=1, precision="16-mixed")
                trainer.fit(Model())
            """,
            lines=[5],
        ),
        Case(
            """
            import torch
            from pytorch_lightning import Trainer
            trainer = Trainer(max_epochs=1)
            """,
            """
            import torch
            from pytorch_lightning import Trainer
            import os
            from torch_npu.contrib import transfer_to_npu

            os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by the CUDA accelerator
            trainer = Trainer(max_epochs=1)
            """,
            lines=[3],
            mode=Mode.EXPLICIT,
        ),
        Case(  # `--trainer.accelerator gpu` on the command line, or "auto"
            """
            from lightning.pytorch.cli import LightningCLI

            def cli_main():
                cli = LightningCLI(MyModel, MyDataModule)
            """,
            """
            from lightning.pytorch.cli import LightningCLI
            import os

            def cli_main():
                os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by the CUDA accelerator
                cli = LightningCLI(MyModel, MyDataModule)
            """,
            lines=[4],
        ),
        Unchanged(
            """
            import torch
            import lightning as L
            trainer = L.Trainer(accelerator="cpu")
            """
        ),
        Unchanged(  # a transformers Trainer is not Lightning's
            """
            import torch
            from transformers import Trainer
            trainer = Trainer(model=model)
            """
        ),
        Unchanged(
            """
            import os
            import torch
            import lightning as L
            os.environ["TORCH_NPU_DEVICE_CAPABILITY"] = "9.0"
            trainer = L.Trainer(accelerator="gpu")
            """
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        if "TORCH_NPU_DEVICE_CAPABILITY" in self.file.source:
            return  # the script sets it already
        calls = (call for call in findall(node, m.Call())  # type: ignore[union-attr]
                 if self.refers_to(call.func, *_TRAINERS, *_CLIS))
        trainer = next((call for call in calls if self.refers_to(call.func, *_CLIS) or _may_be_cuda(call)), None)
        place = trainer and statement_holding(node, trainer)
        if not place:
            return
        explicit = self.settings.mode is Mode.EXPLICIT
        message = "Lightning's CUDA accelerator unpacks the device capability: TORCH_NPU_DEVICE_CAPABILITY=8.0"
        if explicit:
            message += "; transfer_to_npu imported, as Lightning has no NPU accelerator"
        block, index = place
        self.edit(block, Edit(
            index, message, insert_before=(statement(_CAPABILITY),),
            imports=(("os", None), *(_TRANSFER if explicit else ())),
            severity=Severity.WARNING if explicit else Severity.INFO,  # explicit mode, yet patched at run time
        ))


def _may_be_cuda(call: cst.Call) -> bool:
    """Whether a Trainer/Fabric call may choose CUDA's accelerator: none given, or not a known other one."""
    given = argument(call, None, "accelerator")  # keyword-only in both
    if given is None:
        return True
    name = string_value(given.value)
    return name is None or name.lower() not in frameworks.lightning.NOT_CUDA_ACCELERATORS
