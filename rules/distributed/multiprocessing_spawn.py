from __future__ import annotations

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged

_NAMES = (
    "torch.multiprocessing.spawn",
    "torch.multiprocessing.start_processes",
    "torch.multiprocessing.spawn.spawn",
    "torch.multiprocessing.spawn.start_processes",
)


class MultiprocessingSpawn(PortRule):
    """Note that per-process NPU setup belongs inside the function `mp.spawn` starts.

    ## What it does
    Reports each `torch.multiprocessing.spawn(fn, ...)` / `start_processes(...)` call, as information.

    ## Why
    Each spawned process is a fresh interpreter: `torch.npu.set_device(rank)`, `torch.use_deterministic_algorithms`,
    `torch_npu.npu.set_compile_mode(...)` and seeding only take effect in the process that runs them, so they must be
    called at the start of `fn`, not in the parent under `__main__`. Ascend documents that the deterministic switch
    must run in the same process as the network.

    ## Safety
    Report-only.

    ## References
    Ascend's notes on `torch.use_deterministic_algorithms` (same process, first setting wins):
    <https://www.hiascend.com/document/detail/zh/Pytorch/720/apiref/PyTorchNativeapi/ptaoplist_000292.html>.
    """

    CODE = "DIST010"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C1", "C3")
    TRIGGERS = ("spawn", "start_processes")
    EXAMPLES = (
        Flag(
            """
            import torch.multiprocessing as mp
            if __name__ == "__main__":
                mp.spawn(train, args=(world_size,), nprocs=world_size)
            """,
            lines=[3],
        ),
        Unchanged(
            """
            import multiprocessing
            ctx = multiprocessing.get_context("spawn")
            multiprocessing.set_start_method("spawn")
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_NAMES):
            self.report(
                node,
                "each spawned process must set up its own NPU state",
                "call torch.npu.set_device(rank), seeding and determinism settings at the start of the spawned "
                "function, not in the parent process",
                severity=Severity.INFO,
            )
