from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Flag, PortRule, Safety, Severity, Unchanged, findall, string_value

_SHELL = ("subprocess", "os.system", "os.popen", "os.popen2", "os.execvp", "os.spawnlp")


class NvidiaSmi(PortRule):
    """Report `nvidia-smi` run from the script: on Ascend the tool is `npu-smi`.

    ## What it does
    Reports each `subprocess.*(...)`, `os.system(...)` or `os.popen(...)` call whose command mentions `nvidia-smi`.

    ## Why
    `nvidia-smi` does not exist on an NPU host: the call fails, or the script parses an empty output and picks the
    wrong device or memory budget. `npu-smi info` reports the NPUs, with a different output format; in Python,
    `torch.npu.mem_get_info()` and `torch.npu.utilization()` often replace the parsing altogether.

    ## Safety
    Report-only: the output format differs, so the parsing code changes too.

    ## References
    torch_npu/npu/__init__.py `__all__` (mem_get_info, utilization).
    """

    CODE = "UNS003"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("nvidia-smi",)
    EXAMPLES = (
        Flag(
            """
            import os, subprocess
            out = subprocess.check_output(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"]).decode()
            os.system("nvidia-smi -L")  # list GPUs
            """,
            lines=[2, 3],
        ),
        Unchanged(
            """
            import subprocess
            print("run nvidia-smi to check")
            subprocess.run(["npu-smi", "info"])
            """
        ),
    )

    def visit_Call(self, node: cst.Call) -> None:
        if self.name_under(node.func, *_SHELL) is None:
            return
        if any("nvidia-smi" in (string_value(text) or "") for text in findall(node, m.SimpleString())):
            self.report(
                node,
                "nvidia-smi does not exist on an Ascend host",
                "use `npu-smi info` (different output format) or torch.npu.mem_get_info() / torch.npu.utilization()",
                severity=Severity.WARNING,
            )
