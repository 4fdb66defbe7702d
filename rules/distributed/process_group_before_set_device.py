from __future__ import annotations

from typing import Sequence, TypeVar

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Safety, Severity, Unchanged, findall, matches

_INIT = ("torch.distributed.init_process_group", "torch.distributed.distributed_c10d.init_process_group")
_SET_DEVICE = (
    "torch.cuda.set_device",
    "torch.npu.set_device",
    "torch_npu.npu.set_device",
    "torch.accelerator.set_device_index",
)
_Body = TypeVar("_Body", cst.Module, cst.IndentedBlock)
_CALL = m.Call()


class ProcessGroupBeforeSetDevice(PortRule):
    """Select the process's device before `init_process_group`, not after it or never.

    ## What it does
    For an `init_process_group(...)` statement with no device selected earlier in the file (`torch.cuda.set_device`,
    `torch.npu.set_device`, `torch.accelerator.set_device_index`, or `device_id=` in the call):
    - a `set_device(...)` statement later in the same block is moved to just before it;
    - with no `set_device` anywhere, and a variable read from `LOCAL_RANK` earlier in the block,
      `torch.npu.set_device(<that variable>)` is inserted before it;
    - otherwise the call is reported.

    ## Why
    HCCL binds the communicator to the device that is current when the process group is created; without
    `set_device` first, every rank of a node may initialise on device 0 and hang or run out of memory. NCCL tolerates
    the late call because it creates communicators lazily. Huawei's migration tool orders them the same way.

    ## Safety
    Unsafe: it moves or adds a statement, and whether HCCL strictly needs the order depends on the torch_npu version.

    ## References
    Huawei's migration tool README, distributed mode (it sets the device before init_process_group):
    <https://github.com/xiaobingling93-pixel/Ascend-mstt/blob/99c2e0f/msfmktransplt/README.md>.
    """

    CODE = "DIST004"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3",)
    TRIGGERS = ("init_process_group",)
    EXAMPLES = (
        Case(
            """
            import torch
            import torch.distributed as dist

            def setup(local_rank):
                dist.init_process_group("nccl")
                # one device per process
                torch.cuda.set_device(local_rank)
            """,
            """
            import torch
            import torch.distributed as dist

            def setup(local_rank):
                # one device per process
                torch.cuda.set_device(local_rank)
                dist.init_process_group("nccl")
            """,
            lines=[5],
        ),
        Case(
            """
            import os
            import torch.distributed as dist

            local_rank = int(os.environ["LOCAL_RANK"])
            dist.init_process_group(backend="nccl")
            model = build().cuda()
            """,
            """
            import os
            import torch.distributed as dist
            import torch

            local_rank = int(os.environ["LOCAL_RANK"])
            torch.npu.set_device(local_rank)
            dist.init_process_group(backend="nccl")
            model = build().cuda()
            """,
            lines=[5],
        ),
        Flag(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl", rank=args.rank, world_size=args.world_size)
            """,
            lines=[2],
        ),
        Flag(
            """
            import torch, torch.distributed as dist
            def setup():
                dist.init_process_group("nccl")
            def main():
                setup()
                torch.cuda.set_device(0)
            """,
            lines=[3],
        ),
        Unchanged(
            """
            import torch, torch.distributed as dist
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl")
            """
        ),
        Unchanged(
            """
            import torch.distributed as dist
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
            """
        ),
        Flag(
            """
            import torch.distributed as dist
            def setup(local_rank):
                dist.init_process_group("nccl")
                local_rank = remap(local_rank)
                torch.cuda.set_device(local_rank)
            """,
            lines=[3],
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._set_device_lines: list[int] = []

    def visit_Module(self, node: cst.Module) -> None:
        calls = findall(node, m.Call(func=m.Name() | m.Attribute()))
        self._set_device_lines = [
            self.file.position(call).start.line
            for call in calls
            if self.refers_to(call.func, *_SET_DEVICE)  # type: ignore[attr-defined]
        ]

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self._reorder(original_node, updated_node)

    def leave_IndentedBlock(
        self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
    ) -> cst.IndentedBlock:
        return self._reorder(original_node, updated_node)

    def _reorder(self, original: _Body, updated: _Body) -> _Body:
        index = next((i for i, statement in enumerate(original.body) if self._init_call(statement)), None)
        if index is None:
            return updated
        init = self._init_call(original.body[index])
        assert init is not None
        line = self.file.position(init).start.line
        if any(matches(arg.keyword, m.Name("device_id")) for arg in init.args) or any(
            set_line <= line for set_line in self._set_device_lines
        ):
            return updated
        later = self._movable_set_device(original.body, index)
        body = list(updated.body)
        if later is not None:
            moved = body.pop(later)
            body.insert(index, moved)
            message = "set_device(...) moved before init_process_group(...)"
            return self.replace(original, updated, updated.with_changes(body=body), message, at=init)
        rank = _local_rank_variable(original.body[:index])
        if rank is None or self._set_device_lines:
            self.report(
                init,
                "init_process_group(...) runs before any set_device(...): HCCL may bind every rank to device 0",
                "call torch.npu.set_device(local_rank) (torch.cuda.set_device in transfer mode) before it",
                severity=Severity.WARNING,
            )
            return updated
        body.insert(index, cst.parse_statement(f"torch.npu.set_device({rank})\n"))
        message = f"inserted torch.npu.set_device({rank}) before init_process_group(...)"
        return self.replace(
            original, updated, updated.with_changes(body=body), message, imports=[("torch", None)], at=init
        )

    def _init_call(self, statement: cst.CSTNode) -> cst.Call | None:
        if not isinstance(statement, cst.SimpleStatementLine):
            return None
        for call in findall(statement, _CALL):
            if self.refers_to(call.func, *_INIT):  # type: ignore[attr-defined]
                return call  # type: ignore[return-value]
        return None

    def _movable_set_device(self, body: Sequence[cst.BaseStatement], index: int) -> int | None:
        """Index of a lone `set_device(x)` statement after `body[index]` whose arguments nothing in between assigns."""
        for later in range(index + 1, len(body)):
            statement = body[later]
            if matches(statement, m.SimpleStatementLine(body=[m.Expr(value=m.Call())])):
                call = statement.body[0].value  # type: ignore[attr-defined]
                if self.refers_to(call.func, *_SET_DEVICE):
                    used = {name.value for name in findall(call, m.Name())}  # type: ignore[attr-defined]
                    assigned = {
                        name.value  # type: ignore[attr-defined]
                        for between in body[index + 1 : later]
                        for target in findall(between, m.AssignTarget() | m.AugAssign() | m.AnnAssign())
                        for name in findall(target.target, m.Name())  # type: ignore[attr-defined]
                    }
                    return later if used.isdisjoint(assigned) else None
        return None


def _local_rank_variable(body: Sequence[cst.BaseStatement]) -> str | None:
    """The name assigned from the LOCAL_RANK environment variable in `body`, if one is."""
    for statement in reversed(body):
        for assign in findall(statement, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
            mentions_local_rank = m.SimpleString(value=m.MatchIfTrue(lambda value: "LOCAL_RANK" in value))
            if findall(assign.value, mentions_local_rank):  # type: ignore[attr-defined]
                return assign.targets[0].target.value  # type: ignore[attr-defined]
    return None
