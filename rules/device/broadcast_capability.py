from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from rules import Case, Edit, Mode, PortRule, StatementEdits, Unchanged, findall, frameworks, statement
from rules.device._rewrite import capability_statement, statement_holding

# What broadcasts a tensor of the current device through torch.distributed.broadcast: the call itself, the object
# collectives built on it, and what of accelerate's does (verify/frameworks/accelerate.py).
_BROADCASTERS = (
    "torch.distributed.broadcast", "torch.distributed.broadcast_object_list", *frameworks.accelerate.BROADCASTERS,
)
_CAPABILITY = capability_statement("read by torch.distributed.broadcast")


class BroadcastCapability(StatementEdits, PortRule):
    """Give torch.distributed.broadcast a device capability to read on the NPU (transfer mode).

    ## What it does
    In a file that calls `torch.distributed.broadcast` or `broadcast_object_list`, or builds accelerate's
    `Accelerator`, sets `TORCH_NPU_DEVICE_CAPABILITY=8.0` with `os.environ.setdefault` (a launcher's own value wins)
    right before the first statement that does. Transfer mode only.

    ## Why
    torch 2.12 and newer check the GPU generation in `broadcast()` before every call:
    `tensor.is_cuda and torch.cuda.get_device_capability(tensor.device)[0] >= 9` (FP8 over NCCL). transfer_to_npu
    makes `is_cuda` true for an NPU tensor and answers `torch.cuda.get_device_capability` with torch_npu's, which is
    None unless `TORCH_NPU_DEVICE_CAPABILITY` is set: "'NoneType' object is not subscriptable" at the first broadcast
    on several ranks. accelerate's DataLoaders broadcast rank 0's RNG states when each epoch starts on several
    processes (accelerate/utils/random.py `synchronize_rng_state`), so an accelerate script on 2 NPUs stops before
    its first step. 8.0 is below 9: broadcast takes the path it takes for every non-FP8 tensor. Explicit mode keeps
    NPU tensors' `is_cuda` false, and torch never asks.

    ## Safety
    Safe: without it the port cannot broadcast. Every library in the process that asks `get_device_capability()` is
    answered 8.0 (as DEV021 answers for Lightning); DEV008 rewrites the script's own gates.

    ## References
    torch/distributed/distributed_c10d.py (`broadcast`, torch 2.12 and newer); accelerate/utils/random.py
    (`synchronize_rng_state`), accelerate/data_loader.py (`DataLoaderShard.__iter__`) of accelerate 1.15;
    torch_npu/npu/utils.py (`get_device_capability`, TORCH_NPU_DEVICE_CAPABILITY).
    """

    CODE = "DEV022"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.TRANSFER})
    TRIGGERS = ("broadcast", *(name.rsplit(".", 1)[-1] for name in frameworks.accelerate.BROADCASTERS))
    EXAMPLES = (
        Case(
            """
            import torch
            from accelerate import Accelerator

            def main():
                accelerator = Accelerator(mixed_precision="fp16")
                model = accelerator.prepare(model)
            """,
            """
            import torch
            from accelerate import Accelerator
            import os

            def main():
                os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by torch.distributed.broadcast
                accelerator = Accelerator(mixed_precision="fp16")
                model = accelerator.prepare(model)
            """,
            lines=[5],
        ),
        Case(
            """
            import torch
            import torch.distributed as dist
            dist.init_process_group("nccl")
            dist.broadcast(weights, src=0)
            """,
            """
            import torch
            import torch.distributed as dist
            import os

            dist.init_process_group("nccl")
            os.environ.setdefault("TORCH_NPU_DEVICE_CAPABILITY", "8.0")  # read by torch.distributed.broadcast
            dist.broadcast(weights, src=0)
            """,
            lines=[4],
        ),
        Unchanged(
            """
            import os
            import torch
            from accelerate import Accelerator
            os.environ["TORCH_NPU_DEVICE_CAPABILITY"] = "9.0"
            accelerator = Accelerator()
            """
        ),
        Unchanged(  # a broadcast of another library
            """
            import torch
            numpy_result = np.broadcast(a, b)
            """
        ),
    )

    def visit_Module(self, node: cst.Module) -> None:
        if "TORCH_NPU_DEVICE_CAPABILITY" in self.file.source:
            return  # the script sets it already
        calls = (call for call in findall(node, m.Call()) if self.refers_to(call.func, *_BROADCASTERS))  # type: ignore
        first = next(calls, None)
        place = first and statement_holding(node, first)  # type: ignore[arg-type]
        if not place:
            return
        block, index = place
        self.edit(block, Edit(
            index, "torch.distributed.broadcast reads the device capability: TORCH_NPU_DEVICE_CAPABILITY=8.0",
            insert_before=(statement(_CAPABILITY),), imports=(("os", None),),
        ))
