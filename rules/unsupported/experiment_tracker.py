from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged

_TRACKERS = (
    "torch.utils.tensorboard.SummaryWriter",
    "torch.utils.tensorboard.writer.SummaryWriter",
    "tensorboardX.SummaryWriter",
    "wandb.init",
)


class ExperimentTracker(PortRule):
    """Note TensorBoard and wandb writers, a known source of crashes in NPU training processes.

    ## What it does
    Reports, as information, each `SummaryWriter(...)` (torch.utils.tensorboard, tensorboardX) and `wandb.init(...)`.

    ## Why
    Huawei's migration FAQ lists logging writers among the causes of segmentation faults at exit in NPU
    training. If the ported run crashes at the end, disable the writer first; also make sure only rank 0 writes.

    ## Safety
    Report-only.

    ## References
    Huawei's migration tool README, FAQ:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "UNS008"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("SummaryWriter", "wandb")
    EXAMPLES = (
        Flag(
            """
            import wandb
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(log_dir="runs/exp1")
            wandb.init(project="resnet")
            """,
            lines=[3, 4],
        ),
        Unchanged(
            """
            import wandb
            wandb.log({"loss": 1.0})
            writer = make_writer()
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_TRACKERS):
            self.report(
                node,
                "logging writers are a known cause of crashes in NPU training processes",
                "if the ported run crashes, disable the writer first; write from rank 0 only",
                severity=Severity.INFO,
            )
