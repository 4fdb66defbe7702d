from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, dotted_name, findall

# Calls whose value depends on the machine the script runs on.
_RESOURCE_CALLS = (
    "os.cpu_count",
    "os.sched_getaffinity",
    "multiprocessing.cpu_count",
    "torch.cuda.device_count",
    "torch.npu.device_count",
    "torch.accelerator.device_count",
    "psutil.cpu_count",
)
_LOADER = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
# batch_size is left out on purpose: dividing a global batch by the device count is how DDP keeps the global batch
# the same on any machine.
_WATCHED = ("num_workers", "shuffle", "prefetch_factor")
_READS = m.Call() | m.Name() | m.Attribute()  # what an expression computes from


class ResourceDependentLoading(PortRule):
    """Report DataLoader worker counts or shuffling derived from the machine (CPU or device count).

    ## What it does
    Reports a `DataLoader` whose `num_workers`, `shuffle` or `prefetch_factor` is computed from
    `os.cpu_count()`, `multiprocessing.cpu_count()`, `len(os.sched_getaffinity(0))` or a device count — directly or
    through a variable assigned from such an expression in the same file.

    ## Why
    The GPU and NPU machines have different CPU and device counts. Worker count changes which worker, and so which
    random-augmentation stream, handles each sample. The two trainings then differ for reasons that have nothing to
    do with the port (checklist C6). A per-device batch size (global batch / device count) is not reported: it keeps
    the global batch equal across machines.

    ## Safety
    Report-only: the right fixed value is the user's choice. Fix it to the same literal on both sides.

    ## References
    checklist C6.
    """

    CODE = "DATA003"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C6",)
    TRIGGERS = ("cpu_count", "device_count", "sched_getaffinity")
    EXAMPLES = (
        Flag(
            """
            import os
            import multiprocessing as mp
            from torch.utils.data import DataLoader
            workers = min(8, os.cpu_count())
            train = DataLoader(ds, batch_size=64, num_workers=workers)
            val = DataLoader(ds, num_workers=mp.cpu_count() // 2)
            """,
            lines=[5, 6],
        ),
        Flag(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, shuffle=torch.cuda.device_count() < 2)
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import os
            from torch.utils.data import DataLoader
            print(os.cpu_count())
            loader = DataLoader(ds, batch_size=64, num_workers=4)
            per_device = DataLoader(ds, batch_size=256 // torch.cuda.device_count())
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._derived: set[str] = set()  # names assigned from a machine-dependent expression

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._depends_on_machine(node.value):
            self._derived.update(dotted_name(target.target) for target in node.targets)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.refers_to(node.func, *_LOADER):
            return
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in _WATCHED and self._depends_on_machine(arg.value):
                self.report(
                    arg,
                    f"DataLoader {arg.keyword.value} depends on the machine's CPU or device count",
                    f"Set {arg.keyword.value} to the same fixed value in the original and the port.",
                    Severity.WARNING,
                )

    def _depends_on_machine(self, expression: cst.BaseExpression) -> bool:
        for node in findall(expression, _READS):
            if isinstance(node, cst.Call) and self.refers_to(node.func, *_RESOURCE_CALLS):
                return True
            if not isinstance(node, cst.Call) and dotted_name(node) in self._derived:
                return True
        return False
