from __future__ import annotations

import libcst as cst

from rules import Case, Mode, PortRule, Unchanged, attribute_chain, keyword, with_args

_NPU = cst.SimpleString('"npu"')
# Parameters of torch.cuda.amp.autocast in positional order: torch.autocast takes them in another order.
_AUTOCAST_PARAMETERS = ("enabled", "dtype", "cache_enabled")
_AUTOCAST = ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast")
_SCALER = ("torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler")
_CUSTOM = {
    f"torch.cuda.amp{module}.{name}": f"torch.amp.{name}"
    for module in ("", ".autocast_mode")
    for name in ("custom_fwd", "custom_bwd")
}


class CudaAmpNamespace(PortRule):
    """Port `torch.cuda.amp` (autocast, GradScaler, custom_fwd/bwd) to the device-generic `torch.amp` on "npu".

    ## What it does
    Explicit mode:
    - `torch.cuda.amp.autocast(args)` (call, `with`, decorator) -> `torch.autocast("npu", args)`, positional
      arguments turned into keywords, since `torch.autocast` orders them differently;
    - `torch.cuda.amp.GradScaler(args)` -> `torch.amp.GradScaler("npu", args)`;
    - `torch.cuda.amp.custom_fwd(cast_inputs=...)` / `custom_bwd`, called or bare decorators ->
      `torch.amp.custom_fwd(device_type="npu", ...)`.
    Any import alias is followed; the old import is left in place (the module still exists).

    ## Why
    `torch.cuda.amp` would run autocast and loss scaling on cuda, which does not exist without `transfer_to_npu`,
    and torch has deprecated it. In transfer mode the runtime patch redirects the whole namespace to `torch_npu`'s
    AMP, so the code is left alone there: rewriting it would add changes without fixing anything.

    ## Safety
    Safe. `torch.amp.GradScaler("npu")` is the upstream scaler; on Atlas training series (910A, no INF/NaN mode)
    consider `torch_npu.npu.amp.GradScaler`, which all-reduces overflow flags across ranks.

    ## References
    torch/cuda/amp/autocast_mode.py and grad_scaler.py (deprecations).
    """

    CODE = "AMP001"
    CHECKLIST = ("C2", "C3", "C4")
    MODES = frozenset({Mode.EXPLICIT})
    TRIGGERS = ("cuda.amp", "cuda import amp")
    EXAMPLES = (
        Case(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler(init_scale=2.0**16)
            with torch.cuda.amp.autocast():  # forward in fp16
                loss = model(x)
            with torch.cuda.amp.autocast(True, torch.bfloat16):
                loss = model(x)
            """,
            """
            import torch
            scaler = torch.amp.GradScaler("npu", init_scale=2.0**16)
            with torch.autocast("npu"):  # forward in fp16
                loss = model(x)
            with torch.autocast("npu", enabled=True, dtype=torch.bfloat16):
                loss = model(x)
            """,
            lines=[2, 3, 5],
            mode=Mode.EXPLICIT,
        ),
        Case(
            """
            from torch.cuda.amp import autocast, GradScaler as Scaler, custom_fwd, custom_bwd

            class Exp(torch.autograd.Function):
                @staticmethod
                @custom_fwd(cast_inputs=torch.float32)
                def forward(ctx, x):
                    return x.exp()

                @staticmethod
                @custom_bwd
                def backward(ctx, grad):
                    return grad

            @autocast(enabled=args.amp)
            def step(batch):
                return model(batch)
            scaler = Scaler()
            """,
            """
            from torch.cuda.amp import autocast, GradScaler as Scaler, custom_fwd, custom_bwd
            import torch

            class Exp(torch.autograd.Function):
                @staticmethod
                @torch.amp.custom_fwd(device_type="npu", cast_inputs=torch.float32)
                def forward(ctx, x):
                    return x.exp()

                @staticmethod
                @torch.amp.custom_bwd(device_type="npu")
                def backward(ctx, grad):
                    return grad

            @torch.autocast("npu", enabled=args.amp)
            def step(batch):
                return model(batch)
            scaler = torch.amp.GradScaler("npu")
            """,
            lines=[5, 10, 14, 17],
            mode=Mode.EXPLICIT,
        ),
        Unchanged(
            """
            import torch
            with torch.cuda.amp.autocast():
                loss = model(x)
            """
        ),
        Unchanged(
            """
            import torch
            with torch.autocast("npu"):
                loss = model(x)
            autocast = make_context()
            with autocast():
                pass
            """,
            mode=Mode.EXPLICIT,
        ),
    )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        names = self.qualified_names(original_node.func)
        if not names.isdisjoint(_AUTOCAST):
            target, first = "torch.autocast", cst.Arg(_NPU)
            args = [
                keyword(_AUTOCAST_PARAMETERS[index], arg.value) if arg.keyword is None and index < 3 else arg
                for index, arg in enumerate(updated_node.args)
            ]
        elif not names.isdisjoint(_SCALER):
            target, first, args = "torch.amp.GradScaler", cst.Arg(_NPU), list(updated_node.args)
        else:
            target = next((_CUSTOM[name] for name in names if name in _CUSTOM), "")
            first, args = keyword("device_type", _NPU), list(updated_node.args)
        if not target:
            return updated_node
        new = with_args(updated_node.with_changes(func=attribute_chain(target)), [first, *args])
        return self._port(original_node, updated_node, new, f'{min(names)} -> {target}("npu")')

    def leave_Decorator(self, original_node: cst.Decorator, updated_node: cst.Decorator) -> cst.Decorator:
        # A bare `@custom_fwd` / `@custom_bwd`: the torch.amp versions need a device_type, so they become calls.
        if not isinstance(original_node.decorator, (cst.Name, cst.Attribute)):
            return updated_node  # a called decorator is a Call, ported by leave_Call
        names = self.qualified_names(original_node.decorator)
        target = next((_CUSTOM[name] for name in names if name in _CUSTOM), None)
        if target is None:
            return updated_node
        call = cst.Call(func=attribute_chain(target), args=[keyword("device_type", _NPU)])
        new = updated_node.with_changes(decorator=call)
        return self._port(original_node, updated_node, new, f'{target}(device_type="npu")')

    def _port(self, original, updated, new, message: str):  # type: ignore[no-untyped-def]
        return self.replace(original, updated, new, message, imports=[("torch", None)])

