from __future__ import annotations

import libcst as cst

from rules import Case, Flag, Mode, PortRule, Severity, Unchanged, replace_argument_value
from rules.device._device_option import DeviceOptions, cuda_default, option_name
from rules.device._rewrite import retarget


class DeviceOptionDefault(PortRule):
    """Name the option that runs the script on the NPU; default it to "npu" where the script handles the NPU.

    ## What it does
    In transfer mode, for each argparse option whose default is a cuda device (`add_argument("--device",
    default="cuda")`), reports which option and value run the port on the NPU. Where the script handles the NPU
    itself (it names an "npu" device, uses `torch.npu`, or lists "npu" among the option's choices), the default
    becomes "npu", so the script's own NPU code runs with no option given. Elsewhere the default stays "cuda", which
    transfer_to_npu maps to the NPU, and the finding says so.

    ## Why
    A multi-device script (`--device cuda` by default, `elif device.type == "npu": torch.npu.synchronize()`) ran
    on the GPU by default; its port should run on the NPU by default, and its report should say how to choose.

    ## Safety
    Safe: the default changes only where the script handles "npu" itself. It stays, and is reported, where the
    option's `choices` lack "npu", and where the script compares the option's value with "cuda" but never with
    "npu": those branches would silently flip. Explicit mode rewrites the default through DEV004.

    ## References
    torch_npu/contrib/transfer_to_npu.py (`_wrapper_cuda` translates device strings in call arguments, never in
    comparisons).
    """

    CODE = "DEV020"
    CHECKLIST = ("C3",)
    MODES = frozenset({Mode.TRANSFER})
    TRIGGERS = ("add_argument",)
    METADATA_DEPENDENCIES = ()
    EXAMPLES = (
        Case(
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="cuda", help="cuda, npu or cpu")
            args = parser.parse_args()
            if args.device == "npu":
                torch.npu.set_compile_mode(jit_compile=False)
            """,
            """
            import argparse
            import torch
            parser = argparse.ArgumentParser()
            parser.add_argument("--device", default="npu", help="cuda, npu or cpu")
            args = parser.parse_args()
            if args.device == "npu":
                torch.npu.set_compile_mode(jit_compile=False)
            """,
            lines=[4],
        ),
        Case(
            """
            parser.add_argument("--accelerator", default='cuda:0', choices=['cuda:0', 'npu:0', 'cpu'])
            """,
            """
            parser.add_argument("--accelerator", default='npu:0', choices=['cuda:0', 'npu:0', 'cpu'])
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            model.to(args.device)
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("-d", "--train-device", default="cuda", choices=("cuda", "cpu"))
            synchronize = {"npu": torch.npu.synchronize, "cuda": torch.cuda.synchronize}
            """,
            lines=[1],
        ),
        Flag(
            """
            parser.add_argument("--device", default="cuda")
            args = parser.parse_args()
            use_amp = args.device == "cuda"  # no npu branch: the default must stay
            backend = "hccl" if torch.device(args.device).type == "npu" else "nccl"
            """,
            lines=[1],
        ),
        Unchanged(
            """
            parser.add_argument("--device", default="cuda")
            """,
            mode=Mode.EXPLICIT,
        ),
        Unchanged('parser.add_argument("--device", default="cpu")\nparser.add_argument("--name", default="cuda run")\n'),
    )

    def visit_Module(self, node: cst.Module) -> None:
        self._options = DeviceOptions(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        default = cuda_default(original_node)
        if default is None:
            return updated_node
        option = option_name(original_node)
        npu_value = cst.Module([]).code_for_node(retarget(default.value))  # type: ignore[arg-type]
        keep = self._options.why_default_stays(original_node)
        if keep:
            self.report(
                default,
                f"{option} picks the device; its default {self.file.code_for(default.value)} runs on the NPU through "
                f"transfer_to_npu, and `{option} npu` names it; the default stays: {keep}",
                f"run the port with `{option} npu` once the script handles that value",
                severity=Severity.INFO,
            )
            return updated_node
        new = replace_argument_value(updated_node, default, retarget(default.value))  # type: ignore[arg-type]
        return self.replace(
            original_node,
            updated_node,
            new,
            f"{option} default -> {npu_value}: the script's own NPU code runs by default (`{option} cuda` still maps "
            "to the NPU through transfer_to_npu)",
            at=default,
        )
