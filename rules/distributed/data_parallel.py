from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged

_NAMES = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.data_parallel",
    "torch.nn.parallel.data_parallel.data_parallel",
)


class DataParallel(PortRule):
    """Report `nn.DataParallel`, which Ascend does not support: use DistributedDataParallel.

    ## What it does
    Reports each call of `torch.nn.DataParallel(...)` and of the functional `torch.nn.parallel.data_parallel(...)`.
    `isinstance(model, nn.DataParallel)` checks are left alone.

    ## Why
    Huawei lists `torch.nn.DataParallel` as unsupported on NPU; single-process multi-device training must become one
    process per device with `DistributedDataParallel` (launched with `torchrun`), which changes the script's
    structure: process-group init, a `DistributedSampler`, the per-device batch size and the learning rate.

    ## Safety
    Report-only: the conversion restructures the script.

    ## References
    Huawei's migration tool README, training configuration:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>; its op_list_2_8.json
    (<https://github.com/xiaobingling93-pixel/Ascend-mstt/tree/99c2e0f/msfmktransplt>, src/ms_fmk_transplt/resource/).
    """

    CODE = "DIST007"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3", "C9")
    TRIGGERS = ("DataParallel", "data_parallel")
    EXAMPLES = (
        Flag(
            """
            import torch.nn as nn
            from torch.nn.parallel import data_parallel
            model = nn.DataParallel(model, device_ids=[0, 1])  # all GPUs
            out = data_parallel(model, batch)
            if isinstance(model, nn.DataParallel):
                model = model.module
            """,
            lines=[3, 4],
        ),
        Unchanged(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[local_rank])
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_NAMES):
            self.report(
                node,
                "nn.DataParallel is not supported on Ascend NPUs",
                "run one process per device with torch.nn.parallel.DistributedDataParallel and torchrun "
                "(backend hccl, a DistributedSampler, per-device batch size)",
                severity=Severity.ERROR,
            )
