from __future__ import annotations

import libcst as cst
from libcst.helpers import get_full_name_for_node

from migrate.types import Mode
from rules.base import Case, Flag, PortRule, Unchanged
from rules.device._cuda_api import MEMORY, SHARED
from rules.device._rewrite import renamed_reference


def _npu_counterpart(qualified: str) -> str | None:
    """`torch.npu...` for a `torch.cuda...` name torch_npu provides, else None."""
    head, _, name = qualified.rpartition(".")
    if (head == "torch.cuda" and name in SHARED) or (head == "torch.cuda.memory" and name in MEMORY):
        return "torch.npu" + qualified[len("torch.cuda") :]
    return None


class TorchCudaApi(PortRule):
    """Call `torch.npu.X` where the script calls `torch.cuda.X` and torch_npu provides X.

    ## What it does
    In explicit mode, rewrites references to `torch.cuda` names that `torch_npu.npu` also exports
    (`is_available`, `device_count`, `set_device`, `synchronize`, `empty_cache`, `memory_*`, `Stream`, `Event`,
    `manual_seed_all`, rng state, typed tensors ...), the memory-history tools of `torch.cuda.memory`, and
    `torch.cuda.default_generators`. The source's spelling of the package is kept (`th.cuda.X` -> `th.npu.X`);
    `from torch.cuda import a, b` becomes `from torch.npu import a, b` when torch.npu has every name in it.

    ## Why
    Without `transfer_to_npu`, `torch.cuda` is the CUDA runtime, which an NPU host does not have. torch_npu
    registers the same API under `torch.npu`.

    ## Safety
    Safe: the names are the same functions on the other device. `torch.cuda.amp` is left to the AMP rules, graphs to
    DEV015, `get_device_capability` to DEV008, names without an NPU counterpart to DEV002. An import mixing both
    kinds of names is reported for a person to split.

    ## References
    rules-catalogue DEV-01, DEV-18, DEV-21; torch_npu/npu/__init__.py `__all__`.
    """

    CODE = "DEV001"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("cuda",)
    EXAMPLES = (
        Case(
            """
            import torch
            if torch.cuda.is_available():  # pick the card
                torch.cuda.set_device(0)
            n = torch.cuda.device_count()
            """,
            """
            import torch
            if torch.npu.is_available():  # pick the card
                torch.npu.set_device(0)
            n = torch.npu.device_count()
            """,
            lines=[2, 3, 4],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch as th
            th.cuda.synchronize()
            peak = th.cuda.max_memory_allocated() / 2**20
            th.cuda.memory._record_memory_history(max_entries=100000)
            g = th.cuda.default_generators[0]
            """,
            """
            import torch as th
            th.npu.synchronize()
            peak = th.npu.max_memory_allocated() / 2**20
            th.npu.memory._record_memory_history(max_entries=100000)
            g = th.npu.default_generators[0]
            """,
            lines=[2, 3, 4, 5],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            import torch.cuda as tc
            from torch.cuda import Stream, Event as Ev

            s = Stream()
            tc.empty_cache()
            """,
            """
            import torch.cuda as tc
            from torch.npu import Stream, Event as Ev
            import torch

            s = Stream()
            torch.npu.empty_cache()
            """,
            lines=[2, 5],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch import cuda
            x = cuda.FloatTensor(3)
            """,
            """
            from torch import cuda
            import torch

            x = torch.npu.FloatTensor(3)
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Flag(
            """
            from torch.cuda import synchronize, nvtx
            """,
            lines=[1],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            torch.cuda.synchronize()
            """
        ),
        Unchanged(
            """
            import torch
            from torch.cuda.amp import GradScaler
            torch.cuda.nvtx.range_push("step")
            with torch.cuda.amp.autocast():
                pass
            torch.npu.synchronize()
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import cupy
            cupy.cuda.Device(0).synchronize()
            print("torch.cuda.synchronize() is slow")
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        return False  # the module path of an import is handled as a whole in leave_ImportFrom

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        for qualified in sorted(self.qualified_names(original_node)):
            target = _npu_counterpart(qualified)
            if target:
                new, imports = renamed_reference(original_node, qualified, target)
                return self.replace(
                    original_node, updated_node, new, f"`{qualified}` -> `{target}`", imports=imports
                )
        return updated_node

    def leave_ImportFrom(self, original_node: cst.ImportFrom, updated_node: cst.ImportFrom) -> cst.ImportFrom:
        module = get_full_name_for_node(original_node.module) if original_node.module else None
        if module not in ("torch.cuda", "torch.cuda.memory") or original_node.relative:
            return updated_node
        if isinstance(original_node.names, cst.ImportStar):
            return updated_node
        names = [get_full_name_for_node(alias.name) or "" for alias in original_node.names]
        portable = [name for name in names if _npu_counterpart(f"{module}.{name}")]
        if not portable:
            return updated_node
        if len(portable) < len(names):
            self.report(
                original_node,
                f"`{', '.join(portable)}` exist in `{module.replace('cuda', 'npu')}`, the other names do not",
                f"import {', '.join(portable)} from `{module.replace('cuda', 'npu')}` in a separate statement",
            )
            return updated_node
        target = module.replace("torch.cuda", "torch.npu")
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(module=cst.parse_expression(target)),
            f"`from {module} import ...` -> `from {target} import ...`",
        )
