"""What a training step looks like to the loss-scaling rules (no rule lives here).

A *scope* is a function body, or a module's top-level code. In each scope this module finds the backward calls, the
optimizer steps and the gradient clipping, and for each backward the statements that compute its loss (a backward
slice over the names the loss reads, within one loop iteration). The AMP1xx rules build their rewrites from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import libcst as cst
import libcst.matchers as m

from rules import (
    Body, dotted_name, findall, is_innermost_training_loop, is_optimizer, matches, method, names_read, names_written,
    training_step,
)
from rules.amp._statement_roles import DEVICE_MOVES, Role, forward_pieces, kept_out, role, runs_model

Resolver = Callable[[cst.CSTNode], "set[str]"]

CLIP_FUNCTIONS = frozenset(
    f"torch.nn.utils{module}.{name}"
    for module in ("", ".clip_grad")
    for name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")
)
_CUSTOM_BACKWARD = frozenset({"torch.autograd.backward", "torch.autograd.grad"})
# Ops that CUDA autocast, and torch_npu's after it, refuse outright: their autocast kernel raises "unsafe to
# autocast" whatever the dtypes it gets (torch 2.13 aten/src/ATen/autocast_mode.cpp; torch_npu 2.13 has the same
# kernel). Only leaving autocast avoids the error; the loss modules that call them count too.
AUTOCAST_BANNED = frozenset({"torch.nn.functional.binary_cross_entropy"})
_BANNED_LOSS_MODULES = frozenset({"torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss"})


@dataclass(frozen=True)
class Place:
    """Where a statement sits: its block, its index there, and the compound statement owning the block."""

    block: Body
    index: int
    owner: cst.BaseCompoundStatement | None


@dataclass(frozen=True)
class Site:
    """A call of interest and the statement line holding it."""

    call: cst.Call
    line: cst.SimpleStatementLine
    subject: cst.BaseExpression  # the loss of a backward, the optimizer of a step


@dataclass(frozen=True)
class Problem:
    """Why a step cannot be rewritten with confidence, and what a person should do instead."""

    node: cst.CSTNode
    message: str
    suggestion: str
    scaling_only: bool = False  # blocks loss scaling but not bf16 autocast


@dataclass
class Step:
    """The training step(s) of one scope."""

    scope: cst.Module | cst.FunctionDef
    places: dict[cst.BaseStatement, Place]
    backwards: list[Site] = field(default_factory=list)
    steps: list[Site] = field(default_factory=list)
    clips: list[cst.SimpleStatementLine] = field(default_factory=list)
    # Per block, the (first, last) statement indexes to run under autocast.
    regions: dict[Body, list[tuple[int, int]]] = field(default_factory=dict)
    # Calls of an op autocast bans, left after the autocast region: they must get float32 inputs.
    float32_losses: list[cst.Call] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def trains(self) -> bool:
        return bool(self.backwards and self.steps)

    def optimizer_before(self, line: cst.SimpleStatementLine) -> cst.BaseExpression | None:
        """The optimizer a clip at `line` prepares: the only one in the scope, else the next one stepped in its
        block."""
        if len({code(site.subject) for site in self.steps}) == 1:
            return self.steps[0].subject
        place = self.places[line]
        for site in self.steps:
            step_place = self.places[site.line]
            if step_place.block is place.block and step_place.index > place.index:
                return site.subject
        return None


@dataclass(frozen=True)
class AutocastBans:
    """What in one module runs an op that autocast bans (AUTOCAST_BANNED)."""

    refers_to: Callable[..., bool]  # the rule's refers_to(node, *names)
    losses: frozenset[str]  # names bound to a loss module that runs one: `criterion` for `criterion = nn.BCELoss()`
    helpers: frozenset[str]  # the module's functions that call one of those, whose inputs a step cannot see

    def runs_banned_op(self, call: cst.Call) -> bool:
        """Whether `call` itself runs a banned op on its arguments: `F.binary_cross_entropy(...)`, `criterion(...)`."""
        func = call.func
        if isinstance(func, cst.Call):  # nn.BCELoss()(output, target)
            return self.refers_to(func.func, *_BANNED_LOSS_MODULES)
        return self.refers_to(func, *AUTOCAST_BANNED) or dotted_name(func) in self.losses

    def reaches_banned_op(self, call: cst.Call) -> bool:
        name = dotted_name(call.func)
        return self.runs_banned_op(call) or name.removeprefix("self.") in self.helpers


def autocast_bans(module: cst.Module, refers_to: Callable[..., bool]) -> AutocastBans:
    losses = frozenset(
        dotted_name(target.target)
        for assign in findall(module, m.Assign(value=m.Call()))
        if refers_to(_without_moves(assign.value).func, *_BANNED_LOSS_MODULES)  # type: ignore[attr-defined]
        for target in assign.targets  # type: ignore[attr-defined]
    )
    direct = AutocastBans(refers_to, losses, frozenset())
    helpers = frozenset(
        function.name.value  # type: ignore[attr-defined]
        for function in findall(module, m.FunctionDef())
        if any(direct.runs_banned_op(call) for call in findall(function, m.Call()))  # type: ignore[arg-type]
    )
    return AutocastBans(refers_to, losses, helpers)


def _without_moves(call: cst.Call) -> cst.Call:
    """`nn.BCELoss()` for `nn.BCELoss().to(device)`."""
    while method(call) in DEVICE_MOVES and isinstance(call.func.value, cst.Call):  # type: ignore[attr-defined]
        call = call.func.value  # type: ignore[attr-defined]
    return call


def code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def scopes(module: cst.Module) -> Iterator[cst.Module | cst.FunctionDef]:
    yield module
    yield from findall(module, m.FunctionDef())  # type: ignore[misc]


def analyse(scope: cst.Module | cst.FunctionDef, resolve: Resolver, scaler: str | None = None,
            clears_gradients: bool = False) -> Step:
    """Find the step sites of `scope`. With `scaler`, steps are `scaler.step(opt)`; without, `opt.step()`.
    `clears_gradients`: the port clears them in every training loop (TRN001's fix, applied with --unsafe-fixes)."""
    places: dict[cst.BaseStatement, Place] = {}
    body = scope if isinstance(scope, cst.Module) else scope.body
    if isinstance(body, (cst.Module, cst.IndentedBlock)):
        _index(body, None, places)
    step = Step(scope, places)
    closures = {name.value for name in _local_function_names(places)}
    for line in places:
        if isinstance(line, cst.SimpleStatementLine):
            _collect(line, step, resolve, scaler, closures)
    branched = any(problem.message == _BRANCHED_STEP[0] for problem in step.problems)
    if scaler is None and step.backwards and not step.steps and not branched:
        step.problems.append(Problem(step.backwards[0].call, *_NO_STEP, scaling_only=True))
    if scaler is None and not clears_gradients:
        step.problems.extend(Problem(loop, *_NEVER_CLEARED, scaling_only=True) for loop in _never_cleared(step))
    return step


def _never_cleared(step: Step) -> list[cst.For | cst.While]:
    """The innermost training loops of the step's backward calls that never clear their gradients (TRN001's)."""
    loops = []
    for site in step.backwards:
        owner = step.places[site.line].owner  # up past loops of micro-batches that backpropagate but never step
        while owner is not None and not (isinstance(owner, (cst.For, cst.While)) and training_step(owner)):
            owner = step.places[owner].owner
        if owner is not None and owner not in loops and is_innermost_training_loop(owner):
            if not training_step(owner).zero_grad:  # type: ignore[union-attr]
                loops.append(owner)
    return loops


_NO_STEP = (
    "backward() here but no optimizer step in the same function: loss scaling not inserted",
    "scale this backward with `scaler.scale(loss).backward()` and step with `scaler.step(optimizer)` followed by "
    "`scaler.update()` where the optimizer steps, using one GradScaler reachable from both places",
)

# A GradScaler unscales the gradients by the scale of the step that made them: summed over steps made at other
# scales they cannot be unscaled, and an overflow (inf) stays in them for good, so that every later step is skipped.
_NEVER_CLEARED = (
    "this training loop never clears its gradients (TRN001): loss scaling not inserted, since gradients summed "
    "over steps at different loss scales cannot be unscaled, and one overflow would stay in them and skip every "
    "later update",
    "clear the gradients once per optimizer step (`optimizer.zero_grad()` in the original, or TRN001's fix: "
    "--unsafe-fixes), or use bf16 autocast, which needs no scaler (--amp bf16)",
)


def plan_autocast(step: Step, bans: AutocastBans) -> None:
    """Fill `step.regions`: for each backward, the statements of its iteration that run its forward and its loss
    (`_statement_roles`: data loading, device moves, logging and control flow stay outside), less those that
    compute a loss autocast bans (they follow the region in float32: `step.float32_losses`)."""
    barriers = _ancestors(step, [site.line for site in step.backwards + step.steps])
    sliced: dict[Body, set[int]] = {}
    needed: set[cst.BaseStatement] = set()
    for site in step.backwards:
        found = _slice(step, site, barriers)
        for statement in found:
            place = step.places[statement]
            sliced.setdefault(place.block, set()).add(place.index)
        if not any(runs_model(statement) for statement in found):
            step.problems.append(
                Problem(
                    site.call,
                    f"the loss `{code(site.subject)}` is computed outside this function: autocast not inserted",
                    "run the forward and the loss under `torch.autocast(device_type=\"npu\", dtype=torch.float16)` "
                    "where they are computed, and scale this backward with `scaler.scale(loss).backward()`",
                )
            )
        needed.update(found)
    for block, indexes in sliced.items():
        spans = _without_banned_ops(step, block, _spans(block, sorted(indexes), barriers), bans)
        step.regions[block] = [piece for span in spans for piece in _forward_pieces(step, block, span, needed)]


def _forward_pieces(step: Step, block: Body, span: tuple[int, int], needed: set) -> list[tuple[int, int]]:
    """The pieces of `span` to run under autocast; none, and a problem, where the forward shares a compound
    statement with what must stay outside."""
    first, last = span
    statements = [block.body[index] for index in range(first, last + 1)]
    mixed = next((statement for statement in statements if role(statement, statement in needed) is Role.MIXED), None)
    if mixed is not None:
        keyword = type(mixed).__name__.lower()  # for, while, if, try, with
        step.problems.append(
            Problem(
                mixed,
                f"the forward runs inside a `{keyword}` that also {kept_out(mixed)}: autocast not inserted (the "
                "block would wrap that too, and splitting it out would move code)",
                "move the data loading, device moves and logging out of that block, then wrap only the forward "
                "and the loss in `with torch.autocast(device_type=\"npu\", dtype=torch.float16):`",
            )
        )
        return []
    return list(forward_pieces(block, first, last, needed))


def _without_banned_ops(
    step: Step, block: Body, spans: Iterator[tuple[int, int]], bans: AutocastBans
) -> Iterator[tuple[int, int]]:
    """`spans` split around each statement that computes a banned loss from outputs already computed, which then
    runs after autocast on float32 inputs; a banned op reached any other way is a problem."""
    for first, last in spans:
        start = first
        for index in range(first, last + 1):
            statement = block.body[index]
            banned = [call for call in findall(statement, m.Call()) if bans.reaches_banned_op(call)]  # type: ignore
            if not banned:
                continue
            if not _loss_of_outputs(statement, banned, bans):  # type: ignore[arg-type]
                step.problems.append(Problem(banned[0], *_BANNED))
                continue
            step.float32_losses.extend(banned)  # type: ignore[arg-type]
            if start < index:
                yield start, index - 1
            start = index + 1
        if start <= last:
            yield start, last


_BANNED = (
    "binary_cross_entropy (nn.BCELoss) raises under autocast and its inputs are computed in the same expression "
    "(or in a function called here): autocast not inserted",
    "compute the loss on the logits with `nn.BCEWithLogitsLoss()` / `F.binary_cross_entropy_with_logits` (drop "
    "the final sigmoid): it is safe under autocast; or run the forward under autocast and the loss after it on "
    "float32 inputs, `criterion(output.float(), target.float())`",
)


def _loss_of_outputs(statement: cst.BaseStatement, banned: list[cst.Call], bans: AutocastBans) -> bool:
    """Whether `statement` is one line whose banned calls take only computed values (no forward of their own)."""
    return isinstance(statement, cst.SimpleStatementLine) and all(
        bans.runs_banned_op(call) and not any(runs_model(arg.value) for arg in call.args) for call in banned
    )


def _spans(block: Body, indexes: list[int], barriers: set) -> Iterator[tuple[int, int]]:
    """(first, last) of each run of `indexes` that no barrier (a backward, a step, a block holding one) cuts."""
    group: list[int] = []
    for index in indexes + [None]:  # type: ignore[list-item]
        if group and (index is None or any(block.body[i] in barriers for i in range(group[-1] + 1, index))):
            yield group[0], group[-1]
            group = []
        if index is not None:
            group.append(index)


def _slice(step: Step, site: Site, barriers: set) -> list[cst.BaseStatement]:
    """Statements of the current iteration (up to the loop body or function body) that the loss depends on."""
    needed = names_read(site.subject)
    found: list[cst.BaseStatement] = []
    statement: cst.BaseStatement = site.line
    while True:
        place = step.places[statement]
        for earlier in reversed(place.block.body[: place.index]):
            if earlier in barriers or isinstance(earlier, (cst.FunctionDef, cst.ClassDef)):
                continue
            written = names_written(earlier)
            if not any(_covers(name, needed) for name in written):
                continue
            found.append(earlier)
            if _rebinds_only(earlier):
                needed = {name for name in needed if not any(_rebinds(w, name) for w in written)}
            needed |= names_read(earlier)
        if place.owner is None or isinstance(place.owner, (cst.For, cst.While)):
            return found
        statement = place.owner


def _rebinds_only(statement: cst.BaseStatement) -> bool:
    """`a = ...` / `a, b = ...`: the names' old values no longer matter (unlike `a += ...` or `a[i] = ...`)."""
    targets = m.Name() | m.Tuple() | m.List()
    assignment = m.Assign(targets=[m.ZeroOrMore(m.AssignTarget(target=targets))])
    return matches(statement, m.SimpleStatementLine(body=[m.AtLeastN(assignment, n=1)]))


def _covers(written: str, needed: set[str]) -> bool:
    return any(_rebinds(written, name) for name in needed)


def _rebinds(written: str, name: str) -> bool:
    return name == written or name.startswith(written + ".")


def _ancestors(step: Step, lines: Sequence[cst.BaseStatement]) -> set[cst.BaseStatement]:
    found: set[cst.BaseStatement] = set()
    for statement in lines:
        current: cst.BaseStatement | None = statement
        while current is not None and current not in found:
            found.add(current)
            current = step.places[current].owner
    return found


def _index(block: Body, owner: cst.BaseCompoundStatement | None, places: dict) -> None:
    for position, statement in enumerate(block.body):
        places[statement] = Place(block, position, owner)
        if isinstance(statement, cst.BaseCompoundStatement) and not isinstance(
            statement, (cst.FunctionDef, cst.ClassDef)
        ):
            for inner in _child_blocks(statement):
                _index(inner, statement, places)


# The clauses of a compound statement that hold blocks of their own (`else:`, `except:`, `case ...:` ...).
_BLOCK_OWNERS = (cst.If, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase)


def _child_blocks(node: cst.CSTNode) -> Iterator[cst.IndentedBlock]:
    for child in node.children:
        if isinstance(child, cst.IndentedBlock):
            yield child
        elif isinstance(child, _BLOCK_OWNERS):
            yield from _child_blocks(child)


def _local_function_names(places: dict) -> Iterator[cst.Name]:
    for statement in places:
        if isinstance(statement, cst.FunctionDef):
            yield statement.name


def _collect(line: cst.SimpleStatementLine, step: Step, resolve: Resolver, scaler: str | None, closures: set) -> None:
    for small in line.body:
        plain = small.value if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call) else None
        for call in findall(small, m.Call()):
            assert isinstance(call, cst.Call)
            names = resolve(call.func)
            if not names.isdisjoint(CLIP_FUNCTIONS):
                step.clips.append(line)
            elif not names.isdisjoint(_CUSTOM_BACKWARD):
                step.problems.append(Problem(call, *_CUSTOM, scaling_only=True))
            elif method(call) == "backward":
                _add_backward(call, line, step, scaler, plain is call)
            elif method(call) == "step" and plain is call:
                _add_step(call, line, step, scaler, closures)


_CUSTOM = (
    "gradients are computed with torch.autograd directly: loss scaling not inserted",
    "scale the outputs passed to torch.autograd with `scaler.scale(...)` and unscale the gradients by hand "
    "(see 'Automatic Mixed Precision examples: gradient penalty' in the PyTorch docs)",
)


def _add_backward(call: cst.Call, line: cst.SimpleStatementLine, step: Step, scaler: str | None, plain: bool) -> None:
    receiver = call.func.value  # type: ignore[attr-defined]
    if scaler is not None:  # an existing scaler: only `scaler.scale(loss).backward()` counts
        if matches(receiver, m.Call(func=m.Attribute(value=m.Name(scaler), attr=m.Name("scale")))):
            step.backwards.append(Site(call, line, receiver.args[0].value))
        return
    positional = [arg for arg in call.args if arg.keyword is None]
    keywords = {arg.keyword.value for arg in call.args if arg.keyword is not None}
    if not plain or positional or keywords & {"gradient", "create_graph"}:
        step.problems.append(
            Problem(
                call,
                "a non-scalar, double or nested backward call: loss scaling not inserted",
                "scale the tensor before backward with `scaler.scale(...)`; for gradient penalties follow "
                "'Automatic Mixed Precision examples: gradient penalty' in the PyTorch docs",
                scaling_only=True,
            )
        )
        return
    step.backwards.append(Site(call, line, receiver))


def _add_step(call: cst.Call, line: cst.SimpleStatementLine, step: Step, scaler: str | None, closures: set) -> None:
    receiver = call.func.value  # type: ignore[attr-defined]
    if scaler is not None:
        if matches(receiver, m.Name(scaler)) and call.args:
            step.steps.append(Site(call, line, call.args[0].value))
        elif not call.args and is_optimizer(receiver):
            step.steps.append(Site(call, line, receiver))  # bypasses the scaler; the rules tell them apart
        return
    if not is_optimizer(receiver):
        return
    if call.args and (isinstance(call.args[0].value, cst.Lambda) or code(call.args[0].value) in closures):
        step.problems.append(
            Problem(
                call,
                f"`{code(receiver)}.step(closure)`: GradScaler does not support closures, loss scaling not inserted",
                "use bf16 autocast without a scaler (--amp bf16), or restructure the step without a closure",
                scaling_only=True,
            )
        )
    elif not call.args and _has_other_branch(step.places[line].owner):
        step.problems.append(Problem(call, *_BRANCHED_STEP, scaling_only=True))
    elif not call.args:
        step.steps.append(Site(call, line, receiver))


_BRANCHED_STEP = (
    "the optimizer step is one branch of an if/else whose other branch updates the parameters another way: "
    "loss scaling not inserted (scaled gradients would reach that update)",
    "scale and step only on the optimizer branch (`scaler.scale(loss).backward()`, `scaler.step(optimizer)`, "
    "`scaler.update()`), and divide the gradients by `scaler.get_scale()` before a hand-written update",
)


def _has_other_branch(owner: cst.BaseCompoundStatement | None) -> bool:
    """`if use_optimizer: opt.step() else: <manual update>` (a gradient-accumulation `if` has no else)."""
    return isinstance(owner, cst.If) and owner.orelse is not None
