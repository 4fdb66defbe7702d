from __future__ import annotations

from functools import partial
from typing import Callable

import libcst as cst
import libcst.matchers as m

from rules.amp._loss_scaling import (
    TORCH,
    SavesScalerState,
    autocast,
    float32_inputs,
    free_name,
    manages_precision,
    resume_edits,
    scaled,
    scaler_step,
    unscale_edits,
    update_edits,
)
from rules.amp._step_analysis import AutocastBans, Step, analyse, autocast_bans, code, plan_autocast, scopes
from rules import (
    AmpPolicy, Body, Case, Edit, PortRule, Settings, StatementEdits, Unchanged, findall, matches, statement,
)

Rewrite = Callable[[cst.Call], cst.Call]
_FLOAT32_LOSS = (
    "binary_cross_entropy raises under autocast: this loss runs after it, on float32 inputs (or use BCEWithLogitsLoss)"
)
# Above a scaler created at module level, so that a reader sees why it is there.
_MODULE_SCALER_COMMENT = (
    "# AMP101 mixed precision: one loss scaler, shared by every training function"
)


class Fp32TrainingStep(SavesScalerState, StatementEdits, PortRule):
    """Train an fp32 training step under autocast, with a GradScaler around backward and the optimizer step.

    ## What it does
    For each function (or top-level script) that calls `<loss>.backward()` and `<optimizer>.step()`, in a file with
    no mixed precision yet:
    - the statements of the iteration that compute the model output and the loss (the backward slice of the loss,
      from the first statement that runs the model or the loss, never the backward or the step) run under
      `with torch.autocast(device_type="npu", dtype=torch.float16)` (`bfloat16` with `--amp bf16`); data loading
      (`next(batches)` and its StopIteration handling), device moves, logging and control flow stay outside: the
      block is split around them, and where a `for`/`if`/`try` runs the forward and one of them at once, the step
      is left to AMP105;
    - a loss through `binary_cross_entropy` (`F.binary_cross_entropy`, `nn.BCELoss`), which CUDA and NPU autocast
      refuse to run at all, stays after the autocast block on float32 inputs: `criterion(output.float(),
      target.float())`; when its statement also computes its inputs (`criterion(model(x), y)`), the step is left
      to AMP105, which suggests `BCEWithLogitsLoss`;
    - with fp16, one `torch.amp.GradScaler("npu")` is created, in one of two places, always the same way: right
      after the last optimizer creation when the function that creates the optimizers also runs the training
      loop; otherwise (the loop is in a function of its own, as in `train(model, loader, optimizer)`) at module
      level, after the imports and the UPPER_CASE constants that follow them, under a comment saying why, so that
      every training function reaches it without a change of signature;
    - `loss.backward()` becomes `scaler.scale(loss).backward()`, `optimizer.step()` becomes
      `scaler.step(optimizer)` followed by `scaler.update()` (after the last step of a block, so once per iteration
      for several optimizers), and `scaler.unscale_(optimizer)` goes before gradient clipping;
    - a checkpoint dictionary holding `optimizer.state_dict()` gets `"scaler": scaler.state_dict()`, and where the
      scaler is reachable, `optimizer.load_state_dict(checkpoint["optimizer"])` is followed by
      `if "scaler" in checkpoint: scaler.load_state_dict(checkpoint["scaler"])` (older checkpoints lack the key).
    Gradient accumulation stays correct: every micro-step's backward is scaled, and step/update happen only where
    the optimizer steps. A training loop that never clears its gradients gets no loss scaler (unless --unsafe-fixes,
    where TRN001 clears them): a GradScaler unscales the gradients by the scale of the step that made them, so
    gradients summed over steps at other scales come out wrong, and the inf of one overflow stays in them and skips
    every later update (bf16 autocast, which needs no scaler, is added). Steps it cannot rewrite with confidence are
    left alone and reported by AMP105.

    ## Why
    The NPU is built for mixed precision: without it training may be slow, fail on Atlas training series, or miss
    accuracy (checklist C2). fp16 gradients underflow without loss scaling (checklist C4), and clipping scaled
    gradients clips at the wrong threshold. A binary_cross_entropy left under autocast raises at the first step.

    ## Safety
    Safe: applied by default (`--amp off` disables it). It rewrites only steps whose backward, optimizer step and
    loss computation are all in view, never changes a function signature, and leaves a file that already uses
    autocast, a GradScaler, apex or half precision to AMP0xx/AMP102-104. Numerics change by design: compare the
    port with `verify`.

    ## References
    Ascend's mixed-precision guide:
    <https://www.hiascend.com/doc_center/source/zh/Pytorch/700/ptmoddevg/trainingmigrguide/PT_LMTMOG_0026.html>; PyTorch
    "Automatic Mixed Precision examples" (typical use, gradient clipping, accumulation, multiple
    models/losses/optimizers, saving/resuming): <https://docs.pytorch.org/docs/stable/notes/amp_examples.html>;
    torch/amp/grad_scaler.py; the banned binary_cross_entropy kernel of torch's aten/src/ATen/autocast_mode.cpp
    (torch_npu registers the same).
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

            ACCUM = 4

            def train(model, loader, optimizer):
                for i, (x, y) in enumerate(loader):
                    loss = nn.functional.mse_loss(model(x), y) / ACCUM
                    loss.backward()
                    if (i + 1) % ACCUM == 0:
                        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        optimizer.step()
                        optimizer.zero_grad()

            def main(resume):
                model = Net()
                optimizer = torch.optim.AdamW(model.parameters())
                if resume:
                    checkpoint = torch.load(resume)
                    optimizer.load_state_dict(checkpoint["optimizer"])
                for epoch in range(3):
                    train(model, loader, optimizer)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
            """,
            """
            import torch
            from torch import nn

            ACCUM = 4

            # AMP101 mixed precision: one loss scaler, shared by every training function
            scaler = torch.amp.GradScaler("npu")

            def train(model, loader, optimizer):
                for i, (x, y) in enumerate(loader):
                    with torch.autocast(device_type="npu", dtype=torch.float16):
                        loss = nn.functional.mse_loss(model(x), y) / ACCUM
                    scaler.scale(loss).backward()
                    if (i + 1) % ACCUM == 0:
                        scaler.unscale_(optimizer)
                        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        scaler.step(optimizer)
                        scaler.update()
                        optimizer.zero_grad()

            def main(resume):
                model = Net()
                optimizer = torch.optim.AdamW(model.parameters())
                if resume:
                    checkpoint = torch.load(resume)
                    optimizer.load_state_dict(checkpoint["optimizer"])
                    if "scaler" in checkpoint:  # older checkpoints have no scaler state
                        scaler.load_state_dict(checkpoint["scaler"])
                for epoch in range(3):
                    train(model, loader, optimizer)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scaler": scaler.state_dict()}, "ckpt.pt")
            """,
            lines=[4, 8, 9, 11, 12, 20, 23],
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
        Case(
            """
            import torch.nn.functional as F

            for x, y in loader:
                output = model(x)
                loss = F.binary_cross_entropy(output, y)
                loss.backward()
                optimizer.step()
            """,
            """
            import torch.nn.functional as F
            import torch

            for x, y in loader:
                with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                    output = model(x)
                loss = F.binary_cross_entropy(output.float(), y.float())
                loss.backward()
                optimizer.step()
            """,
            lines=[4, 5],
            amp=AmpPolicy.BF16,
        ),
        Unchanged(
            """
            import torch
            criterion = torch.nn.BCELoss().to("cuda")
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """
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
        Case(  # a trainer class: fetching the batch, its StopIteration handling and the device moves stay outside
            """
            import torch


            class Runner:
                def fit(self):
                    self.opt = self.net.make_optimizer(self.settings)
                    batches = iter(self.loader)
                    while self.iteration < self.max_steps:
                        # the loader starts again when it runs out
                        try:
                            inputs, labels = next(batches)
                        except StopIteration:
                            batches = iter(self.loader)
                            inputs, labels = next(batches)
                        inputs, labels = inputs.to(self.device), labels.to(self.device)
                        _, self.loss = self.net(inputs, labels)
                        self.net.zero_grad(set_to_none=True)
                        self.loss.backward()
                        self.opt.step()
                        self.iteration += 1
            """,
            """
            import torch


            class Runner:
                def fit(self):
                    self.opt = self.net.make_optimizer(self.settings)
                    scaler = torch.amp.GradScaler("npu")
                    batches = iter(self.loader)
                    while self.iteration < self.max_steps:
                        # the loader starts again when it runs out
                        try:
                            inputs, labels = next(batches)
                        except StopIteration:
                            batches = iter(self.loader)
                            inputs, labels = next(batches)
                        inputs, labels = inputs.to(self.device), labels.to(self.device)
                        with torch.autocast(device_type="npu", dtype=torch.float16):
                            _, self.loss = self.net(inputs, labels)
                        self.net.zero_grad(set_to_none=True)
                        scaler.scale(self.loss).backward()
                        scaler.step(self.opt)
                        scaler.update()
                        self.iteration += 1
            """,
            lines=[6, 16, 18, 19],
        ),
        Case(  # logging between the forward and the loss: two blocks around it
            """
            for step, (x, y) in enumerate(loader):
                out = model(x)
                if step % 100 == 0:
                    print("output mean", out.mean().item())
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            """
            import torch

            for step, (x, y) in enumerate(loader):
                with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                    out = model(x)
                if step % 100 == 0:
                    print("output mean", out.mean().item())
                with torch.autocast(device_type="npu", dtype=torch.bfloat16):
                    loss = criterion(out, y)
                loss.backward()
                optimizer.step()
            """,
            lines=[2, 5],
            amp=AmpPolicy.BF16,
        ),
        Case(  # words in a docstring or a comment are not the script choosing its precision
            """
            \"\"\"Trains in float32 (float16 and autocast come later).\"\"\"
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for x, y in loader:  # no GradScaler yet
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            """
            \"\"\"Trains in float32 (float16 and autocast come later).\"\"\"
            import torch

            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("npu")
            for x, y in loader:  # no GradScaler yet
                optimizer.zero_grad()
                with torch.autocast(device_type="npu", dtype=torch.float16):
                    loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
        ),
        Unchanged(  # gradients never cleared, summed over steps (pytorch/examples' tensor-parallel toys): AMP105
            """
            for i in range(num_iters):
                output = model(torch.rand(20, 10))
                output.sum().backward()
                optimizer.step()
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scaler = ""
        self._dtype = "float16" if self.settings.amp is AmpPolicy.FP16 else "bfloat16"
        self._calls: dict[cst.Call, tuple[str, Rewrite]] = {}  # original call -> (message, its rewrite)
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
        bans = autocast_bans(node, self.refers_to)
        cleared = self.settings.unsafe_fixes  # TRN001 clears the gradients of every training loop
        analysed = (self._accepted(analyse(scope, self.qualified_names, clears_gradients=cleared), bans)
                    for scope in scopes(node))
        steps = [step for step in analysed if step is not None]
        if not steps:
            return
        message = f"forward and loss run under {self._dtype} autocast"
        for step in steps:
            for block, spans in step.regions.items():
                for first, last in spans:
                    wrap = Edit(first, message, wrap_until=last, wrapper=self._autocast, imports=TORCH)
                    self.edit(block, wrap)
            for call in step.float32_losses:
                self._calls[call] = (_FLOAT32_LOSS, float32_inputs)
        if self._scales:
            self._scaler = free_name(node, "scaler", "grad_scaler", "amp_scaler")
            self._plan_scaler(node, steps)

    def _accepted(self, step: Step, bans: AutocastBans) -> Step | None:
        """`step` when every site of it can be rewritten under the policy, else None (AMP105 says why)."""
        wanted = step.trains if self._scales else bool(step.backwards)
        if not wanted or any(self._blocks(problem) for problem in step.problems):
            return None
        plan_autocast(step, bans)
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
                message = f"backward of the scaled loss: {scaler}.scale(...).backward()"
                self._calls[site.call] = (message, partial(scaled, scaler=scaler))
            for site in step.steps:
                message = f"optimizer step through the scaler: {scaler}.step(...)"
                self._calls[site.call] = (message, partial(scaler_step, scaler=scaler))
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
            self.edit(module, _after_imports_and_constants(module, create, message + " at module level"))
            reach = module
        self._checkpoints = {entries for entries in findall(reach, m.Dict())}  # type: ignore[misc]
        for block, edit in resume_edits(reach, scaler):
            self.edit(block, edit)

    # ----- rewriting, on the way back up ---------------------------------------------------------------------

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        planned = self._calls.get(original_node)
        if planned is None:
            return updated_node
        message, rewrite = planned
        return self.replace(original_node, updated_node, rewrite(updated_node), message)



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
        and any(matches(small, m.Assign()) and _assigns(small, optimizers) for small in line.body)
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


def _after_imports_and_constants(module: cst.Module, create: cst.BaseStatement, message: str) -> Edit:
    """Put `create` after the imports at the top of `module` and the constants that follow them, under a comment."""
    last = None
    for index, line in enumerate(module.body):
        if matches(line, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) or (
            last is not None and _defines_constants(line)
        ):
            last = index
        elif not matches(line, m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])):
            break
    comment = cst.EmptyLine(comment=cst.Comment(_MODULE_SCALER_COMMENT))
    if last is None:
        return Edit(0, message, insert_before=(create.with_changes(leading_lines=(comment,)),), imports=TORCH)
    commented = create.with_changes(leading_lines=(cst.EmptyLine(), comment))
    return Edit(last, message, insert_after=(commented,), imports=TORCH)


_CONSTANT = m.Name(value=m.MatchIfTrue(str.isupper))
# `MEAN, STD = 0.1307, 0.3081`, `EPOCHS: int = 10`: a line that only binds UPPER_CASE names.
_CONSTANTS = m.SimpleStatementLine(
    body=[
        m.AtLeastN(
            m.Assign(
                targets=[
                    m.AtLeastN(
                        m.AssignTarget(_CONSTANT | m.Tuple(elements=[m.AtLeastN(m.Element(_CONSTANT), n=1)])), n=1
                    )
                ]
            )
            | m.AnnAssign(target=_CONSTANT),
            n=1,
        )
    ]
)


def _defines_constants(line: cst.BaseStatement) -> bool:
    return matches(line, _CONSTANTS)
