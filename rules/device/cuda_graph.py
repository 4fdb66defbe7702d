from __future__ import annotations

from typing import Mapping

from rules import Case, Mode, Safety, Unchanged
from rules.device._api_rename import ApiRename
from rules.device._cuda_api import GRAPHS

_RENAMES = {f"torch.cuda.{name}": f"torch.npu.{target}" for name, target in GRAPHS.items()}


class CudaGraph(ApiRename):
    """Capture NPU graphs where the script captures CUDA graphs.

    ## What it does
    In explicit mode, rewrites `torch.cuda.CUDAGraph` to `torch.npu.NPUGraph`, and `torch.cuda.graph`,
    `graph_pool_handle`, `make_graphed_callables`, `is_current_stream_capturing` to their `torch.npu` namesakes;
    `from torch.cuda import CUDAGraph` becomes `from torch.npu import NPUGraph as CUDAGraph`.

    ## Why
    torch_npu implements graph capture with the same API under `torch.npu`.

    ## Safety
    Unsafe: what can be captured differs (operators that sync with the host, dynamic shapes, memory pools), so a
    captured region that replays on a GPU may fail or replay differently on an NPU. Run `verify` on the result.

    ## References
    torch_npu/npu/graphs.py; torch_npu/contrib/transfer_to_npu.py (CUDAGraph).
    """

    CODE = "DEV014"
    SAFETY = Safety.UNSAFE
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("graph", "Graph")
    MODULES = {"torch.cuda": "torch.npu"}
    EXAMPLES = (
        Case(
            """
            import torch
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):  # capture once
                out = model(static_in)
            """,
            """
            import torch
            g = torch.npu.NPUGraph()
            with torch.npu.graph(g, pool=torch.npu.graph_pool_handle()):  # capture once
                out = model(static_in)
            """,
            lines=[2, 3],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch.cuda import CUDAGraph, make_graphed_callables
            g = CUDAGraph()
            """,
            """
            from torch.npu import NPUGraph as CUDAGraph, make_graphed_callables
            g = CUDAGraph()
            """,
            lines=[1],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            g = torch.cuda.CUDAGraph()
            """
        ),
        Unchanged(
            """
            import networkx
            graph = networkx.Graph()
            torch.fx.Graph()
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    @classmethod
    def renames(cls) -> Mapping[str, str]:
        return _RENAMES
