from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, PortRule, Settings, Unchanged, findall, statement
from rules.determinism._entry_points import Entry, at_start, process_entry, spawn_target

# Each setting with the cost it names.
_OPERATORS = "torch.use_deterministic_algorithms(True)  # cost: slower kernels; ops lacking one raise"
_VARIABLES = {
    "CLOSE_MATMUL_K_SHIFT": 'os.environ.setdefault("CLOSE_MATMUL_K_SHIFT", "1")  # cost: matmuls without K-axis shift, '
                            "slower",
    "HCCL_DETERMINISTIC": 'os.environ.setdefault("HCCL_DETERMINISTIC", "true")  # cost: fixed-order all-reduce, slower',
}
_INIT = frozenset({"torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group"})


class NondeterministicAlgorithms(PortRule):
    """Switch on the Ascend determinism bundle: deterministic operators, matmuls and HCCL collectives.

    ## What it does
    With `--deterministic`, in a file that does not call `torch.use_deterministic_algorithms` yet:
    at the start of the training process (the function `mp.spawn` starts, else the function that calls
    `init_process_group`, else `main()`, else the `if __name__ == "__main__":` block, else the script after its
    imports), so before the process group and the first operator exist:
    - sets `CLOSE_MATMUL_K_SHIFT=1` and, in a distributed script, `HCCL_DETERMINISTIC=true`, with
      `os.environ.setdefault` so that a launcher's own value wins;
    - inserts `torch.use_deterministic_algorithms(True)`.
    Each line's comment names its cost.

    ## Why
    `torch.use_deterministic_algorithms(True)` is the NPU's operator determinism switch (torch_npu passes it to CANN
    as ACL_OP_DETERMINISTIC; the cudnn flags do nothing there); it must run in the process that trains. Matmul
    kernels shift their K-axis split by default, so a matmul's reduction order can vary: CLOSE_MATMUL_K_SHIFT=1 fixes
    it. HCCL reduces (all-reduce, reduce-scatter) in a fixed order only with HCCL_DETERMINISTIC set before the
    communicator is created ("strict" also fixes the order across machines, on A2 symmetric clusters only). Spawned
    workers inherit the variables. Together they make C1's run-twice check meaningful.

    ## Safety
    Safe: asked for with `--deterministic`. Operators without a deterministic kernel then raise an error that names
    them; use `warn_only=True` to train anyway.

    ## References
    Ascend's notes on `torch.use_deterministic_algorithms`
    (<https://www.hiascend.com/document/detail/zh/Pytorch/720/apiref/PyTorchNativeapi/ptaoplist_000292.html>);
    HCCL_DETERMINISTIC: MindSpeed-LLM's environment variables
    (<https://gitcode.com/Ascend/MindSpeed-LLM/blob/2.2.0/docs/pytorch/features/environment_variable.md>) and
    <https://github.com/vllm-project/vllm-ascend/pull/11824>; torch_npu `npu/__init__.py` (set_deterministic_level
    note).
    """

    CODE = "DET003"
    CHECKLIST = ("C1",)
    TRIGGERS = ("torch",)
    EXAMPLES = (
        Case(
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp

            def worker(rank, world):
                dist.init_process_group("nccl", rank=rank, world_size=world)

            if __name__ == "__main__":
                mp.spawn(worker, args=(2,), nprocs=2)
            """,
            """
            import torch
            import torch.distributed as dist
            import torch.multiprocessing as mp
            import os

            def worker(rank, world):
                os.environ.setdefault("CLOSE_MATMUL_K_SHIFT", "1")  # cost: matmuls without K-axis shift, slower
                os.environ.setdefault("HCCL_DETERMINISTIC", "true")  # cost: fixed-order all-reduce, slower
                torch.use_deterministic_algorithms(True)  # cost: slower kernels; ops lacking one raise
                dist.init_process_group("nccl", rank=rank, world_size=world)

            if __name__ == "__main__":
                mp.spawn(worker, args=(2,), nprocs=2)
            """,
            lines=[5],
            deterministic=True,
        ),
        Case(
            """
            import torch
            model = Net()
            """,
            """
            import torch
            import os

            os.environ.setdefault("CLOSE_MATMUL_K_SHIFT", "1")  # cost: matmuls without K-axis shift, slower
            torch.use_deterministic_algorithms(True)  # cost: slower kernels; ops lacking one raise
            model = Net()
            """,
            lines=[1],
            deterministic=True,
        ),
        Unchanged("import torch\ntorch.use_deterministic_algorithms(True)\n", deterministic=True),
        Unchanged("import torch\nmodel = Net()\n"),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._entry: Entry | None = None
        self._distributed = False

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.deterministic and "use_deterministic_algorithms" not in source and super().wants(source, settings)

    def visit_Module(self, node: cst.Module) -> None:
        worker = spawn_target(node, self.qualified_names)
        inits = [call for call in findall(node, m.Call()) if not self.qualified_names(call.func).isdisjoint(_INIT)]  # type: ignore
        self._distributed = worker is not None or bool(inits)
        initialising = _function_holding(node, inits[0]) if inits else None
        self._entry = worker or initialising or process_entry(node, self.qualified_names)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self._switch_on(original_node, updated_node)

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        return self._switch_on(original_node, updated_node)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self._switch_on(original_node, updated_node)

    def _switch_on(self, original: Entry, updated: Entry):
        if original is not self._entry:
            return updated
        variables = [line for name, line in _VARIABLES.items()
                     if name not in self.file.source and (self._distributed or name != "HCCL_DETERMINISTIC")]
        new = at_start(updated, [statement(line) for line in [*variables, _OPERATORS]])
        imports = [("torch", None)] + ([("os", None)] if variables else [])
        anchor = original.body[0] if isinstance(original, cst.Module) and original.body else original
        message = "Ascend determinism switched on: deterministic algorithms" + "".join(
            f", {name}" for name in _VARIABLES if any(name in line for line in variables))
        return self.replace(original, updated, new, message, imports=imports, at=anchor)


def _function_holding(module: cst.Module, call: cst.Call) -> cst.FunctionDef | None:
    """The innermost function whose body holds `call`."""
    holders = [f for f in findall(module, m.FunctionDef()) if any(c is call for c in findall(f, m.Call()))]
    return holders[-1] if holders else None  # type: ignore[return-value]
