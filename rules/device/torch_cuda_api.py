from __future__ import annotations

from typing import Mapping

from rules import Case, Mode, Unchanged
from rules.device._api_rename import ApiRename
from rules.device._cuda_api import MEMORY, SHARED


_RENAMES = {f"torch.cuda.{name}": f"torch.npu.{name}" for name in SHARED} | {
    f"torch.cuda.memory.{name}": f"torch.npu.memory.{name}" for name in MEMORY
}


class TorchCudaApi(ApiRename):
    """Call `torch.npu.X` where the script calls `torch.cuda.X` and torch_npu provides X.

    ## What it does
    In explicit mode, rewrites references to `torch.cuda` names that `torch_npu.npu` also exports
    (`is_available`, `device_count`, `set_device`, `synchronize`, `empty_cache`, `memory_*`, `Stream`, `Event`,
    `manual_seed_all`, rng state, typed tensors ...), the memory-history tools of `torch.cuda.memory`, and
    `torch.cuda.default_generators`. The source's spelling of the package is kept (`th.cuda.X` -> `th.npu.X`);
    `from torch.cuda import a, b` becomes `from torch.npu import a, b` when torch.npu has every name in it;
    otherwise each use of a name torch.npu has is written out (`torch.npu.a`).

    ## Why
    Without `transfer_to_npu`, `torch.cuda` is the CUDA runtime, which an NPU host does not have. torch_npu
    registers the same API under `torch.npu`.

    ## Safety
    Safe: the names are the same functions on the other device. `torch.cuda.amp` is left to the AMP rules, graphs to
    DEV014, `get_device_capability` to DEV008, names without an NPU counterpart to DEV002.

    ## References
    torch_npu/npu/__init__.py `__all__`; torch_npu/contrib/transfer_to_npu.py (the memory-history tools).
    """

    CODE = "DEV001"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("cuda",)
    MODULES = {"torch.cuda": "torch.npu", "torch.cuda.memory": "torch.npu.memory"}
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
        Case(
            """
            from torch.cuda import synchronize, nvtx
            synchronize()
            """,
            """
            from torch.cuda import synchronize, nvtx
            import torch

            torch.npu.synchronize()
            """,
            lines=[2],
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

    @classmethod
    def renames(cls) -> Mapping[str, str]:
        return _RENAMES
