from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from migrate.types import AmpPolicy, Settings
from rules.amp.loss_scaling import (
    TORCH,
    Edit,
    StatementEdits,
    autocast,
    checkpoint_with_scaler,
    free_name,
    manages_precision,
    scaled,
    scaler_step,
    statement,
    unscale_edits,
    update_edits,
)
from rules.amp.step_analysis import Body, Step, analyse, code, plan_autocast, scopes
from rules.base import Case, PortRule, Unchanged


class Fp32TrainingStep(StatementEdits, PortRule):
    """Train an fp32 training step under autocast, with a GradScaler around backward and the optimizer step.

    ## What it does
    For each function (or top-level script) that calls `<loss>.backward()` and `<optimizer>.step()`, in a file with
    no mixed precision yet:
    - the statements of the iteration that compute the model output and the loss (the backward slice of the loss,
      starting at its first real computation, never the backward or the step) run under
      `with torch.autocast(device_type="npu", dtype=torch.float16)` (`bfloat16` with `--amp bf16`);
    - with fp16, one `torch.amp.GradScaler("npu")` is created: right after the optimizer when the same function
      creates the optimizer before training, otherwise at module level after the imports, so that every training
      function reaches it without a change of signature; `loss.backward()` becomes `scaler.scale(loss).backward()`,
      `optimizer.step()` becomes `scaler.step(optimizer)` followed by `scaler.update()` (after the last step of a
      block, so once per iteration for several optimizers), `scaler.unscale_(optimizer)` goes before gradient
      clipping, and a checkpoint dictionary holding `optimizer.state_dict()` gets `"scaler": scaler.state_dict()`.
    Gradient accumulation stays correct: every micro-step's backward is scaled, and step/update happen only where
    the optimizer steps. Steps it cannot rewrite with confidence are left alone and reported by AMP105.

    ## Why
    The NPU is built for mixed precision: without it training may be slow, fail on Atlas training series, or miss
    accuracy (checklist C2). fp16 gradients underflow without loss scaling (checklist C4), and clipping scaled
    gradients clips at the wrong threshold.

    ## Safety
    Safe: applied by default (`--amp off` disables it). It rewrites only steps whose backward, optimizer step and
    loss computation are all in view, never changes a function signature, and leaves a file that already uses
    autocast, a GradScaler, apex or half precision to AMP0xx/AMP102-104. Numerics change by design: compare the
    port with `verify`.

    ## References
    rules-catalogue AMP-06, AMP-07, AMP-08; PyTorch "Automatic Mixed Precision examples" (typical use, gradient
    clipping, accumulation, multiple models/losses/optimizers); torch/amp/grad_scaler.py.
    """

    CODE = "AMP101"
    CHECKLIST = ("C2", "C4")
    TRIGGERS = (".backward(",)
    EXAMPLES = (
        Case(
            """
            import torch

            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:
                x = x.to(device)
                optimizer.zero_grad()
                # forward
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            """
            import torch

            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:
                x = x.to(device)
                optimizer.zero_grad()
                # forward
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    out = model(x)
                    loss = criterion(out, y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            lines=[4, 9, 11, 12],
        ),
        Case(
            """
            import torch
            from torch import nn

            def train(model, loader, optimizer, accum):
                for i, (x, y) in enumerate(loader):
                    loss = nn.functional.mse_loss(model(x), y) / accum
                    loss.backward()
                    if (i + 1) % accum == 0:
                        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        optimizer.step()
                        optimizer.zero_grad()

            def main():
                model = Net()
                optimizer = torch.optim.AdamW(model.parameters())
                for epoch in range(3):
                    train(model, loader, optimizer, 4)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
            """,
            """
            import torch
            from torch import nn
            scaler = torch.amp.GradScaler("npu")

            def train(model, loader, optimizer, accum):
                for i, (x, y) in enumerate(loader):
                    with torch.autocast(device_type="npu", dtype=torch.float16):
                        loss = nn.functional.mse_loss(model(x), y) / accum
                    scaler.scale(loss).backward()
                    if (i + 1) % accum == 0:
                        scaler.unscale_(optimizer)
                        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        scaler.step(optimizer)
                        scaler.update()
                        optimizer.zero_grad()

            def main():
                model = Net()
                optimizer = torch.optim.AdamW(model.parameters())
                for epoch in range(3):
                    train(model, loader, optimizer, 4)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            lines=[2, 6, 7, 9, 10, 18],
        ),
        Case(
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            """
            import torch

            for x, y in loader:
                with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                    loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            lines=[2],
            amp=AmpPolicy.BF16,
        ),
        Unchanged(
            """
            for x, y in loader:
                with torch.autocast("cuda"):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """
        ),
        Unchanged(
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            amp=AmpPolicy.OFF,
        ),
        Unchanged(
            """
            def closure():
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scaler = ""
        self._dtype = "float16" if self.settings.amp is AmpPolicy.FP16 else "bfloat16"
        self._calls: dict[cst.Call, tuple[str, str]] = {}  # original call -> (message, kind)
        self._checkpoints: set[cst.Dict] = set()

    @classmethod
    def wants(cls, source: str, settings: Settings) -> bool:
        return settings.amp is not AmpPolicy.OFF and super().wants(source, settings) and not manages_precision(source)

    def _autocast(self, statements):
        return autocast(statements, self._dtype)

    @property
    def _scales(self) -> bool:
        return self.settings.amp is AmpPolicy.FP16

    # ----- planning, on the original tree -------------------------------------------------------------------

    def visit_Module(self, node: cst.Module) -> None:
        analysed = (self._accepted(analyse(scope, self.qualified_names)) for scope in scopes(node))
        steps = [step for step in analysed if step is not None]
        if not steps:
            return
        message = f"forward and loss run under {self._dtype} autocast"
        for step in steps:
            for block, spans in step.regions.items():
                for first, last in spans:
                    wrap = Edit(first, message, wrap_until=last, wrapper=self._autocast, imports=TORCH)
                    self.edit(block, wrap)
        if self._scales:
            self._scaler = free_name(node, "scaler", "grad_scaler", "amp_scaler")
            self._plan_scaler(node, steps)

    def _accepted(self, step: Step) -> Step | None:
        """`step` when every site of it can be rewritten under the policy, else None (AMP105 says why)."""
        wanted = step.trains if self._scales else bool(step.backwards)
        if not wanted or any(self._blocks(problem) for problem in step.problems):
            return None
        plan_autocast(step)
        if any(self._blocks(problem) for problem in step.problems) or not step.regions:
            return None
        return None if self._suppressed(step) else step

    def _suppressed(self, step: Step) -> bool:
        """Whether `# npu-port: ignore` silences this rule on one of the step's sites: then none is rewritten."""
        if "npu-port" not in self.file.source:
            return False
        sites = [site.call for site in step.backwards + step.steps] + list(step.clips)
        return any(self.file.is_suppressed(self.CODE, self.file.position(site)) for site in sites)

    def _blocks(self, problem) -> bool:
        return self._scales or not problem.scaling_only

    def _plan_scaler(self, module: cst.Module, steps: list[Step]) -> None:
        scaler = self._scaler
        for step in steps:
            for site in step.backwards:
                self._calls[site.call] = (f"backward of the scaled loss: {scaler}.scale(...).backward()", "scale")
            for site in step.steps:
                self._calls[site.call] = (f"optimizer step through the scaler: {scaler}.step(...)", "step")
            for block, edit in unscale_edits(step, scaler) + update_edits(step, scaler):
                self.edit(block, edit)
        home = _scaler_home(steps)
        create = statement(f'{scaler} = torch.amp.GradScaler("npu")')
        message = f'created one loss scaler, {scaler} = torch.amp.GradScaler("npu")'
        if home is not None:
            block, index = home
            self.edit(block, Edit(index, message, insert_after=(create,), imports=TORCH))
            reach: cst.CSTNode = steps[0].scope
        else:
            self.edit(module, _after_imports(module, create, message + " at module level"))
            reach = module
        self._checkpoints = {entries for entries in m.findall(reach, m.Dict())}  # type: ignore[misc]

    # ----- rewriting, on the way back up ---------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        planned = self._calls.get(original_node)
        if planned is None:
            return updated_node
        message, kind = planned
        new = scaled(updated_node, self._scaler) if kind == "scale" else scaler_step(updated_node, self._scaler)
        return self.replace(original_node, updated_node, new, message)

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.BaseExpression:
        if original_node not in self._checkpoints:
            return updated_node
        new = checkpoint_with_scaler(updated_node, self._scaler)
        if new is None:
            return updated_node
        return self.replace(original_node, updated_node, new, "the scaler's state saved next to the optimizer's")


def _scaler_home(steps: list[Step]) -> tuple[Body, int] | None:
    """Where to create the scaler next to the optimizer: (block, index of the statement to follow), else None.

    Only when one function both creates every optimizer it steps and then trains: the scaler goes right after the
    last creation, in the innermost block holding the creations and the steps, provided they come before the steps.
    """
    if len({id(step.scope) for step in steps}) != 1:
        return None
    step = steps[0]
    optimizers = {code(site.subject) for site in step.steps}
    creations = [
        line
        for line in step.places
        if isinstance(line, cst.SimpleStatementLine)
        and any(m.matches(small, m.Assign()) and _assigns(small, optimizers) for small in line.body)
    ]
    if not creations:
        return None
    uses = [site.line for site in step.steps + step.backwards]
    body = step.scope if isinstance(step.scope, cst.Module) else step.scope.body
    while isinstance(body, (cst.Module, cst.IndentedBlock)):
        created = {_child_index(step, line, body) for line in creations}
        used = {_child_index(step, line, body) for line in uses}
        if None in created or None in used:
            return None
        last = max(created)  # type: ignore[type-var]
        if last < min(used):  # type: ignore[type-var]
            return body, last
        holder = body.body[last]
        if created | used != {last} or isinstance(holder, (cst.For, cst.While)):
            return None  # created inside the loop, or in another branch than the training
        inner = [block for block in _blocks_of(holder) if _child_index(step, creations[-1], block) is not None]
        body = inner[0] if len(inner) == 1 else None  # type: ignore[assignment]
    return None


def _assigns(assign: cst.Assign, names: set[str]) -> bool:
    return any(code(target.target) in names for target in assign.targets)


def _child_index(step: Step, statement: cst.BaseStatement, block: Body) -> int | None:
    """Index in `block` of the statement that is or holds `statement`."""
    current: cst.BaseStatement | None = statement
    while current is not None:
        place = step.places[current]
        if place.block is block:
            return place.index
        current = place.owner
    return None


def _blocks_of(statement: cst.BaseStatement) -> list[cst.IndentedBlock]:
    return [node for node in statement.children if isinstance(node, cst.IndentedBlock)]


def _after_imports(module: cst.Module, create: cst.BaseStatement, message: str) -> Edit:
    """Put `create` after the imports at the top of `module` (before the first definition or other code)."""
    last = None
    for index, line in enumerate(module.body):
        if m.matches(line, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])):
            last = index
        elif not m.matches(line, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
            break
    if last is None:
        return Edit(0, message, insert_before=(create,), imports=TORCH)
    return Edit(last, message, insert_after=(create,), imports=TORCH)
