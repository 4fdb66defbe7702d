from __future__ import annotations

from typing import Mapping

import libcst as cst

from rules import Case, Mode, Unchanged, argument, keyword
from rules.device._api_rename import ApiRename

_RENAMES = {
    **{
        f"torch.profiler.{name}": f"torch_npu.profiler.{name}"
        for name in ("profile", "schedule", "tensorboard_trace_handler", "ProfilerAction")
    },
    "torch.profiler.ProfilerActivity.CPU": "torch_npu.profiler.ProfilerActivity.CPU",
    "torch.profiler.ProfilerActivity.CUDA": "torch_npu.profiler.ProfilerActivity.NPU",
}
_LEGACY_PROFILE = ("torch.autograd.profiler.profile", "torch.autograd.profile")


class CudaProfiler(ApiRename):
    """Profile with `torch_npu.profiler` where the script profiles CUDA activity with `torch.profiler`.

    ## What it does
    In explicit mode, rewrites `torch.profiler.profile`, `schedule`, `tensorboard_trace_handler` and
    `ProfilerAction` to their `torch_npu.profiler` counterparts, `ProfilerActivity.CUDA` to
    `torch_npu.profiler.ProfilerActivity.NPU` (and `.CPU` along with it: the NPU profiler takes its own enum), and
    `torch.autograd.profiler.profile(use_cuda=True)` to `use_device="npu"`. Reports an `experimental_config=`, which
    is CUDA's.

    ## Why
    The CUDA activity does not exist on an NPU; torch_npu's profiler records NPU kernels. `transfer_to_npu` makes the
    same substitution at run time, so transfer mode needs nothing.

    ## Safety
    Safe: profiling does not change the computation.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`_patch_profiler`).
    """

    CODE = "DEV013"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("profile",)
    MODULES = {"torch.profiler": "torch_npu.profiler"}
    EXAMPLES = (
        Case(
            """
            import torch
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),  # three steps
            ) as prof:
                train_step()
            """,
            """
            import torch
            import torch_npu

            with torch_npu.profiler.profile(
                activities=[torch_npu.profiler.ProfilerActivity.CPU,
                            torch_npu.profiler.ProfilerActivity.NPU],
                schedule=torch_npu.profiler.schedule(wait=1, warmup=1, active=3),  # three steps
            ) as prof:
                train_step()
            """,
            lines=[2, 3, 4],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch.profiler import profile, ProfilerActivity, record_function
            with profile(activities=[ProfilerActivity.CUDA], experimental_config=cfg):
                with record_function("fwd"):
                    pass
            """,
            """
            from torch.profiler import profile, ProfilerActivity, record_function
            import torch_npu

            with torch_npu.profiler.profile(activities=[torch_npu.profiler.ProfilerActivity.NPU], experimental_config=cfg):
                with record_function("fwd"):
                    pass
            """,
            lines=[2],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch.profiler import profile, tensorboard_trace_handler
            import torch.autograd.profiler as legacy
            p = profile(on_trace_ready=tensorboard_trace_handler("./log"))
            with legacy.profile(use_cuda=True) as prof:
                pass
            """,
            """
            from torch_npu.profiler import profile, tensorboard_trace_handler
            import torch.autograd.profiler as legacy
            p = profile(on_trace_ready=tensorboard_trace_handler("./log"))
            with legacy.profile(use_device="npu") as prof:
                pass
            """,
            lines=[1, 4],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                pass
            """
        ),
        Unchanged(
            """
            import cProfile
            cProfile.run("main()")
            profile = load_profile()
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    @classmethod
    def renames(cls) -> Mapping[str, str]:
        return _RENAMES

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if self.refers_to(original_node.func, *_LEGACY_PROFILE):
            return self._legacy_device(original_node, updated_node)
        config = argument(original_node, None, "experimental_config")
        if config is not None and self.refers_to(original_node.func, "torch.profiler.profile"):
            self.report(
                config,
                "`experimental_config` is CUDA's: torch_npu's profiler takes its own",
                "use `torch_npu.profiler._ExperimentalConfig(...)` or drop the argument",
            )
        return updated_node

    def _legacy_device(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        use_cuda = argument(updated_node, None, "use_cuda")
        if use_cuda is None or not (isinstance(use_cuda.value, cst.Name) and use_cuda.value.value == "True"):
            return updated_node
        npu = keyword("use_device", cst.SimpleString('"npu"')).with_changes(comma=use_cuda.comma)
        args = [npu if arg is use_cuda else arg for arg in updated_node.args]
        return self.replace(original_node, updated_node, updated_node.with_changes(args=args), '`use_cuda=True` -> `use_device="npu"`')
