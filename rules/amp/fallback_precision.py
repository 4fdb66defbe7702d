from __future__ import annotations

import libcst as cst

from rules import AmpPolicy, Case, PortRule, Settings, Unchanged, argument, keyword, replace_argument_value, with_args
from rules.amp._loss_scaling import AUTOCASTS, GRAD_SCALERS, switched_off

_BF16 = "torch.bfloat16"
# said in the port beside each autocast made bf16: the rung only holds on the chips that compute bf16
BF16_NOTE = "# bf16: Ascend 910B (Atlas A2/A3) and later; the 910A has no bf16"


def _given(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value`: the argument it gives replaced, or added last."""
    given = argument(call, None, name)
    if given is None:
        return with_args(call, [*call.args, keyword(name, value)])
    return replace_argument_value(call, given, value)


class FallbackPrecision(PortRule):
    """Compute the port's mixed precision in bf16, or switch it off, as the fix's last rungs choose.

    ## What it does
    Only under `migrate PORT --fix-from PAIR`, at the rung the fix climbed to (`Settings.fix_precision`) when keeping
    the overflowing call, then its module's forward, in fp32 and searching the loss scale did not PASS:
    - `bf16`: each autocast of the port that is on gets `dtype=torch.bfloat16`, and a `with` that enters it says
      so in a comment (the chips that compute bf16);
    - `off`: every autocast and GradScaler of the port gets `enabled=False`, so the training step computes in fp32.
    An autocast already switched off (a region AMP201 keeps in fp32) is left alone, and so is one already in bf16.

    ## Why
    bf16 has float32's exponent range: a value that overflows float16 (65504), in the forward pass or in the scaled
    gradients, fits it, with fewer digits than float16 keeps. It computes on Atlas A2/A3 (910B and newer), not on
    the Atlas training series (910A). Where bf16 does not keep the accuracy either, fp32 does, at its cost in step
    time and memory (fix.md gives the step time).

    ## Safety
    Safe where it runs: only after verify measured each lower rung FAIL. A GradScaler left on under bf16 still
    skips a step whose gradients overflow, which bf16's range makes rare.

    ## References
    torch.autocast (`dtype`, `enabled`); torch.amp.GradScaler (`enabled=False`: scale() and step() pass through);
    torch_npu's `torch.npu.is_bf16_supported()`.
    """

    CODE = "AMP204"
    CHECKLIST = ("C2",)
    TRIGGERS = ("autocast",)
    EXAMPLES = (
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            with torch.autocast(device_type="npu", dtype=torch.float16):
                with torch.autocast(device_type="npu", enabled=False):
                    z = h.float() * 4000
                loss = model(x).mean()
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu")
            # bf16: Ascend 910B (Atlas A2/A3) and later; the 910A has no bf16
            with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                with torch.autocast(device_type="npu", enabled=False):
                    z = h.float() * 4000
                loss = model(x).mean()
            """,
            lines=[3],
            fix_precision=AmpPolicy.BF16,
        ),
        Case(
            """
            import torch
            scaler = torch.amp.GradScaler("npu", init_scale=2.0**7)
            with torch.npu.amp.autocast(enabled=args.amp):  # mixed precision
                loss = model(x).mean()
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu", init_scale=2.0**7, enabled=False)
            with torch.npu.amp.autocast(enabled=False):  # mixed precision
                loss = model(x).mean()
            """,
            lines=[2, 3],
            fix_precision=AmpPolicy.OFF,
        ),
        Unchanged(
            """
            import torch
            with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                loss = model(x).mean()
            """,
            fix_precision=AmpPolicy.BF16,
        ),
        Unchanged(
            """
            import torch
            with torch.autocast(device_type="npu", dtype=torch.float16):
                loss = model(x).mean()
            """
        ),
    )

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.fix_precision in (AmpPolicy.BF16, AmpPolicy.OFF) and super().wants(source, settings)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        autocast = self.refers_to(original_node.func, *AUTOCASTS)
        off = self.settings.fix_precision is AmpPolicy.OFF
        if switched_off(original_node) or any(arg.star for arg in original_node.args) or not (
                autocast or (off and self.refers_to(original_node.func, *GRAD_SCALERS))):
            return updated_node
        if off:
            new = _given(updated_node, "enabled", cst.Name("False"))
            what = "autocast" if autocast else "GradScaler"
            return self.replace(original_node, updated_node, new,
                                f"{what} switched off: the training step computes in fp32 (the fix's lower rungs kept "
                                "no accuracy in half precision, or had nothing to act on)")
        dtype = argument(original_node, None, "dtype")
        if dtype is not None and self.refers_to(dtype.value, _BF16):
            return updated_node
        return self.replace(original_node, updated_node, _given(updated_node, "dtype", cst.parse_expression(_BF16)),
                            "autocast computes in bf16, which float16's overflow does not reach (the fix's lower rungs "
                            "kept no accuracy in float16, or had nothing to act on); bf16 computes on Ascend 910B "
                            "(Atlas A2/A3) and later, not on the 910A")

    def leave_With(self, original_node: cst.With, updated_node: cst.With) -> cst.With:
        """The note above a `with` whose autocast this rule made bf16 (once: a second fix finds it there)."""
        made_bf16 = self.settings.fix_precision is AmpPolicy.BF16 and any(
            not before.item.deep_equals(after.item) for before, after in zip(original_node.items, updated_node.items))
        noted = any(line.comment is not None and line.comment.value == BF16_NOTE for line in updated_node.leading_lines)
        if not made_bf16 or noted:
            return updated_node
        note = cst.EmptyLine(comment=cst.Comment(BF16_NOTE))
        return updated_node.with_changes(leading_lines=[*updated_node.leading_lines, note])
