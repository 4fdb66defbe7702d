from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from rules import Action, Case, Mode, PortRule, Unchanged, findall, matches

_TRANSFER_LINES = "import torch_npu\nfrom torch_npu.contrib import transfer_to_npu\n"
# Packages that train on torch: a script importing one of them alone (a Lightning Trainer on accelerator="gpu") runs
# torch's cuda code through it, and needs torch_npu as much as one that imports torch
_TORCH_PACKAGES = frozenset({"torch", "lightning", "pytorch_lightning", "transformers", "accelerate", "deepspeed"})
_EXPLICIT_LINES = "import torch_npu\n"


class MissingTorchNpuImport(PortRule):
    """Import torch_npu (and, in transfer mode, transfer_to_npu) right after the first torch import.

    A package that trains on torch counts as one: a script that imports Lightning, transformers, accelerate or
    DeepSpeed alone runs torch's cuda code through it (a Lightning Trainer on accelerator="gpu" found no GPU backend
    on the NPU without it).

    ## What it does
    Transfer mode: inserts `import torch_npu` and `from torch_npu.contrib import transfer_to_npu` after the first
    module-level `import torch...` of an entry file (named on the command line, or with a `__main__` guard), or at
    the top when torch is imported elsewhere. Explicit mode: inserts `import torch_npu` alone, in entry files and in
    every file another rule rewrote.

    ## Why
    `torch_npu` registers the `npu` device and the `torch.npu` namespace; `transfer_to_npu` patches the cuda APIs at
    run time and must run before any of them is used, so it goes at the top of the process's entry file.

    ## Safety
    Safe. A file that already imports `torch_npu` (or `transfer_to_npu`), anywhere in it, is already ported and left
    alone, so a second run adds nothing. Naming the NPU is not enough: code that uses `torch.npu` in a device branch,
    maps "npu" to "hccl" in a table, or imports device modules named on the command line (`--device-modules`) runs
    on the NPU only once `torch_npu` is imported, so it gets the import like any other script.

    ## References
    torch_npu/contrib/transfer_to_npu.py; Huawei's migration tool README, automatic migration:
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "IMP001"
    CHECKLIST = ("C3",)
    TRIGGERS = tuple(sorted(_TORCH_PACKAGES - {"pytorch_lightning"}))  # "torch" finds pytorch_lightning
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            '''
            """Train a model."""
            import os
            import torch  # the framework
            import torch.nn as nn
            ''',
            '''
            """Train a model."""
            import os
            import torch  # the framework
            import torch_npu
            from torch_npu.contrib import transfer_to_npu
            import torch.nn as nn
            ''',
            lines=[3],
        ),
        Case(
            """
            from __future__ import annotations
            from torch import nn
            """,
            """
            from __future__ import annotations
            from torch import nn
            import torch_npu
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import sys

            def main():
                import torch
            """,
            """
            import torch_npu
            from torch_npu.contrib import transfer_to_npu
            import sys

            def main():
                import torch
            """,
            lines=[1],
        ),
        Case(
            """
            import importlib
            import torch
            BACKENDS = {"cuda": "nccl", "npu": "hccl"}  # device type -> collective backend

            def synchronize(device, modules=()):
                for name in modules:  # --device-modules: the backends to import
                    importlib.import_module(name)
                if device.type == "npu":
                    torch.npu.synchronize()
            """,
            """
            import importlib
            import torch
            import torch_npu
            from torch_npu.contrib import transfer_to_npu
            BACKENDS = {"cuda": "nccl", "npu": "hccl"}  # device type -> collective backend

            def synchronize(device, modules=()):
                for name in modules:  # --device-modules: the backends to import
                    importlib.import_module(name)
                if device.type == "npu":
                    torch.npu.synchronize()
            """,
            lines=[2],
        ),
        Unchanged(
            """
            import torch

            def load_backend(device):
                if device == "npu":
                    import torch_npu  # only where the NPU is asked for
            """
        ),
        Case(
            """
            import torch
            HELP = "run on the NPU with torch_npu installed"
            """,
            """
            import torch
            import torch_npu
            from torch_npu.contrib import transfer_to_npu
            HELP = "run on the NPU with torch_npu installed"
            """,
            lines=[1],
        ),
        Unchanged(
            """
            import torch
            try:
                import torch_npu
            except ImportError:
                torch_npu = None
            """
        ),
        Case(
            """
            import lightning as L
            trainer = L.Trainer(accelerator="gpu")
            """,
            """
            import lightning as L
            import torch_npu
            from torch_npu.contrib import transfer_to_npu
            trainer = L.Trainer(accelerator="gpu")
            """,
            lines=[1],
        ),
        Unchanged("import torch\n", is_entry=False),
        Unchanged("import numpy\n"),
    )

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if _is_ported(original_node, self.file.source) or not _imports_torch(original_node):
            return updated_node
        if not self.settings.is_entry and not self._file_was_ported():
            return updated_node
        lines = _TRANSFER_LINES if self.settings.mode is Mode.TRANSFER else _EXPLICIT_LINES
        index = _insertion_index(updated_node.body)
        body = list(updated_node.body)
        body[index:index] = cst.parse_module(lines).body
        anchor = _insertion_index(original_node.body) - 1
        what = " and ".join(f"`{line}`" for line in lines.splitlines())
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(body=body),
            f"added {what}",
            at=original_node.body[anchor] if anchor >= 0 else original_node.body[0],
        )

    def _file_was_ported(self) -> bool:
        return any(finding.action is Action.CHANGED for finding in self.file.findings)


def _is_ported(module: cst.Module, source: str) -> bool:
    """Whether the file imports torch_npu somewhere: the port's own marker (a mention in a string is not)."""
    if "torch_npu" not in source:  # the common case, without a walk
        return False
    return any("torch_npu" in _roots(node) for node in findall(module, m.Import() | m.ImportFrom()))


def _roots(node: cst.Import | cst.ImportFrom) -> set[str]:
    """Top-level package names an import statement imports from."""
    if isinstance(node, cst.Import):
        return {_dotted(alias.name).split(".")[0] for alias in node.names}
    return {_dotted(node.module).split(".")[0]} if node.module is not None and not node.relative else set()


def _dotted(node: cst.BaseExpression) -> str:
    return cst.Module([]).code_for_node(node)


def _imports_torch(module: cst.Module) -> bool:
    return any(_roots(node) & _TORCH_PACKAGES for node in findall(module, m.Import() | m.ImportFrom()))


def _is_torch_import(statement: cst.CSTNode) -> bool:
    return matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) and bool(_roots(
        statement.body[0]  # type: ignore[attr-defined]
    ) & _TORCH_PACKAGES)


_PREAMBLE = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString()) | m.ImportFrom(module=m.Name("__future__"))])


def _insertion_index(body: Sequence[cst.BaseStatement]) -> int:
    """Just after the first module-level import of torch (or of a package that trains on it); else after the docstring
    and __future__ imports."""
    for index, statement in enumerate(body):
        if _is_torch_import(statement):
            return index + 1
    for index, statement in enumerate(body):
        if not matches(statement, _PREAMBLE):
            return index
    return len(body)
