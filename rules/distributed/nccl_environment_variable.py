from __future__ import annotations

import re

import libcst as cst

from rules import Flag, PortRule, Safety, Severity, Unchanged, string_value

_NCCL_VARIABLE = re.compile(r"^(TORCH_)?NCCL_[A-Z0-9_]+$")
# HCCL (CANN) or torch_npu environment variables that play the same part; the rest have no documented analogue.
_ANALOGUES = {
    "NCCL_DEBUG": "ASCEND_GLOBAL_LOG_LEVEL (CANN log level; 1 = INFO)",
    "NCCL_SOCKET_IFNAME": "HCCL_SOCKET_IFNAME (or HCCL_IF_IP)",
    "NCCL_BUFFSIZE": "HCCL_BUFFSIZE (in MB, not bytes)",
    "NCCL_ASYNC_ERROR_HANDLING": "HCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "HCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_HCCL_BLOCKING_WAIT",
    "TORCH_NCCL_BLOCKING_WAIT": "TORCH_HCCL_BLOCKING_WAIT",
    "TORCH_NCCL_DESYNC_DEBUG": "HCCL_DESYNC_DEBUG",
    "NCCL_DESYNC_DEBUG": "HCCL_DESYNC_DEBUG",
}


class NcclEnvironmentVariable(PortRule):
    """Report NCCL environment variables, with their HCCL analogue where one exists.

    ## What it does
    Reports each string literal that names an NCCL variable (`NCCL_*`, `TORCH_NCCL_*`): in `os.environ[...]`,
    `os.getenv(...)`, `os.environ.setdefault(...)`, an env dict for a subprocess... and names the HCCL or torch_npu
    variable that does the same job, when there is one (`NCCL_SOCKET_IFNAME` -> `HCCL_SOCKET_IFNAME`,
    `NCCL_DEBUG` -> `ASCEND_GLOBAL_LOG_LEVEL`...).

    ## Why
    HCCL ignores NCCL variables, so the tuning or debugging they did silently stops. The analogues are not exact
    (units and values differ), so nothing is renamed automatically. MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and
    LOCAL_RANK work unchanged.

    ## Safety
    Report-only.

    ## References
    torch_npu's environment variables (HCCL_*, TORCH_HCCL_*):
    <https://www.hiascend.com/document/detail/zh/Pytorch/720/comref/Envvariables>; MindSpeed-LLM's:
    <https://gitcode.com/Ascend/MindSpeed-LLM/blob/2.2.0/docs/pytorch/features/environment_variable.md>.
    """

    CODE = "DIST009"
    SAFETY = Safety.REPORT
    CHECKLIST = ("C3",)
    TRIGGERS = ("NCCL_",)
    EXAMPLES = (
        Flag(
            """
            import os
            os.environ["NCCL_DEBUG"] = "INFO"
            os.environ.setdefault('TORCH_NCCL_ASYNC_ERROR_HANDLING', "1")
            if os.getenv("NCCL_P2P_DISABLE"):
                pass
            """,
            lines=[2, 3, 4],
        ),
        Unchanged(
            """
            import os
            os.environ["MASTER_PORT"] = "29500"
            print("set NCCL_DEBUG=INFO to debug")
            """
        ),
    )

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        name = string_value(node)
        if name is None or not _NCCL_VARIABLE.match(name):
            return
        analogue = _ANALOGUES.get(name)
        self.report(
            node,
            f"{name} has no effect with HCCL",
            f"use {analogue}" if analogue else "no documented HCCL analogue: check the CANN environment variables",
            severity=Severity.INFO,
        )
