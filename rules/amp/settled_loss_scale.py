from __future__ import annotations

import libcst as cst

from rules import Case, PortRule, Settings, Unchanged, argument, keyword, replace_argument_value, with_args

_SCALERS = (
    "torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.GradScaler",
    "torch.npu.amp.GradScaler", "torch_npu.npu.amp.GradScaler",
)


def _literal(scale: float) -> str:
    """A power of two as `2.0**k` (what torch's own default reads like), anything else as a float."""
    exponent = scale.hex().split("p")[-1] if scale > 0 else ""
    if exponent and scale == 2.0 ** int(exponent):
        return f"2.0**{int(exponent)}"
    return repr(float(scale))


class SettledLossScale(PortRule):
    """Start the GradScaler at the loss scale that a verify run's overflow record settled.

    ## What it does
    Only under `migrate PORT --fix-from PAIR` (`Settings.init_scale`, from the pair's loss-scale trace: every step of
    the short run overflowed and was skipped under the scales it tried), every GradScaler the port creates gets
    `init_scale=` that scale (a power of two below the smallest scale tried), replacing the one it gave. A scaler
    that already starts there is left alone.

    ## Why
    A dynamic GradScaler starts at 2**16 and halves its scale at each overflow, skipping that step's update: where
    the gradients need a scale far below it, the first steps of every run (all of a short one) update nothing, and
    the port trains fewer steps than the original (checklist C4). Starting at a scale that fits keeps every update;
    growth (`growth_interval`) still raises it while the gradients allow.

    ## Safety
    Safe where it runs: only a scale verify measured overflowing is lowered, by a power of two, which scales the
    gradients exactly.

    ## References
    torch/amp/grad_scaler.py (`init_scale=2.0**16`, `backoff_factor=0.5`).
    """

    CODE = "AMP202"
    CHECKLIST = ("C4",)
    TRIGGERS = ("GradScaler",)
    EXAMPLES = (
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            other = torch.amp.GradScaler("npu", init_scale=65536.0, growth_interval=100)
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu", init_scale=2.0**9)
            other = torch.amp.GradScaler("npu", init_scale=2.0**9, growth_interval=100)
            """,
            lines=[2, 3],
            init_scale=512.0,
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu", init_scale=2.0**9)
            """,
            init_scale=512.0,
        ),
        Unchanged(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            """
        ),
    )

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.init_scale is not None and super().wants(source, settings)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        if not self.refers_to(original_node.func, *_SCALERS) or any(arg.star for arg in updated_node.args):
            return updated_node
        scale = _literal(self.settings.init_scale)  # type: ignore[arg-type]
        value = cst.parse_expression(scale)
        given = argument(updated_node, None, "init_scale")
        if given is None:
            new = with_args(updated_node, [*updated_node.args, keyword("init_scale", value)])
        elif given.value.deep_equals(value):
            return updated_node
        else:
            new = replace_argument_value(updated_node, given, value)
        return self.replace(original_node, updated_node, new,
                            f"GradScaler starts at init_scale={scale}: verify measured every step overflow under "
                            "the scales it tried")
