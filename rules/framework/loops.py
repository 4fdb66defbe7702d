"""What training looks like in source: the facts the training-process and loss-scaling rules share (no rule lives
here), from one loop's training step to whether a file trains at all. rules/amp/_step_analysis.py builds the AMP
rules' finer analysis (loss slices, autocast regions) on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import libcst as cst
import libcst.matchers as m

from rules.framework.calls import dotted_name
from rules.framework.frameworks import frameworks
from rules.framework.tree import findall, preorder

# What steps but is no optimizer: `scheduler.step()`, `lr_sched.step()`, `warmup.step()`, `scaler.step(opt)`, and
# a reinforcement-learning `env.step(action)`.
_NOT_AN_OPTIMIZER = re.compile(r"sched|lr_|warmup|scaler|env", re.IGNORECASE)
_LOOP = m.For() | m.While()
# A file that trains names one of these (a trainer's methods that train are the frameworks': `trainer.fit(model)`);
# most inference scripts are told apart by their text alone.
_TRAINING_WORDS = ("backward", ".step(", *(f"{name}(" for name in frameworks.TRAINER_METHODS))


@dataclass(frozen=True)
class TrainingStep:
    """The calls that make one loop a training loop."""

    backward: tuple[cst.Call, ...]  # `<loss>.backward()` calls
    optimizers: tuple[str, ...]  # source text of what steps: `optimizer`, `opt_g` (via `scaler.step(opt)` too)
    zero_grad: bool  # gradients are cleared somewhere in the loop, or by an engine's step


def own_calls(loop: cst.For | cst.While) -> list[cst.Call]:
    """Calls in the loop's body, not counting nested function or class definitions."""
    nodes = preorder(loop.body, prune=(cst.FunctionDef, cst.ClassDef))
    return [node for node in nodes if isinstance(node, cst.Call)]


# Several rules ask about the same loops, and about each loop once per loop around it: found once per loop.
@lru_cache(maxsize=256)
def training_step(loop: cst.For | cst.While) -> TrainingStep | None:
    """The training step `loop` runs, or None when it has no backward() and optimizer step of its own."""
    calls = own_calls(loop)
    backward = tuple(call for call in calls if method(call) == "backward")
    optimizers = tuple(dict.fromkeys(name for call in calls for name in _stepped(call)))
    if not backward or not optimizers:
        return None
    # an engine that runs the backward and the step itself, `engine.backward(loss)` then `engine.step()` (DeepSpeed's),
    # clears the gradients in its step
    engines = {dotted_name(call.func.value) for call in backward if call.args}  # type: ignore[attr-defined]
    zero_grad = (any(method(call) == "zero_grad" for call in calls) or _clears_grads_by_assignment(loop)
                 or any(optimizer in engines for optimizer in optimizers))
    return TrainingStep(backward, optimizers, zero_grad)


def is_innermost_training_loop(loop: cst.For | cst.While) -> bool:
    """A training loop none of whose nested loops is one too (an epoch loop around a batch loop is not)."""
    if training_step(loop) is None:
        return False
    return not any(training_step(inner) for inner in findall(loop.body, _LOOP) if inner is not loop)


def trains(module: cst.Module, source: str) -> bool:
    """Whether the file trains: it calls backward() (`loss.backward()`, `accelerator.backward(loss)`,
    `torch.autograd.backward(...)`), steps an optimizer (`optimizer.step()`, `scaler.step(optimizer)`), or hands the
    training to a trainer (`trainer.fit(model)`, `trainer.train()`). `source` is the module's text."""
    if not any(word in source for word in _TRAINING_WORDS):
        return False
    return any(_trains(call) for call in findall(module, m.Call()))  # type: ignore[arg-type]


def _trains(call: cst.Call) -> bool:
    if method(call) in frameworks.TRAINER_METHODS:
        receiver = call.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call):  # Trainer(model=model, args=args).train()
            receiver = receiver.func
        return "trainer" in dotted_name(receiver).lower()
    backward = method(call) == "backward" or (isinstance(call.func, cst.Name) and call.func.value == "backward")
    return backward or bool(_stepped(call))


def backward_receivers(step: TrainingStep) -> set[str]:
    """Names the loss is held in: `loss` of `loss.backward()` and of `scaler.scale(loss).backward()`."""
    names = set()
    for call in step.backward:
        receiver = call.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call) and receiver.args:  # scaler.scale(loss).backward()
            receiver = receiver.args[0].value
        if isinstance(receiver, cst.Name):
            names.add(receiver.value)
    return names


def method(call: cst.Call) -> str:
    """The method name of `x.name(...)`; empty for a plain function call."""
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else ""


def is_optimizer(receiver: cst.BaseExpression) -> bool:
    """Whether the receiver of a `.step()` may be an optimizer: a name that no scheduler, scaler or env has."""
    name = dotted_name(receiver)
    return bool(name) and not _NOT_AN_OPTIMIZER.search(name.rsplit(".", 1)[-1])


def _stepped(call: cst.Call) -> list[str]:
    if method(call) != "step":
        return []
    receiver = dotted_name(call.func.value)  # type: ignore[attr-defined]
    if "scaler" in receiver.lower() and call.args:  # scaler.step(optimizer)
        return [dotted_name(call.args[0].value)] if dotted_name(call.args[0].value) else []
    return [receiver] if is_optimizer(call.func.value) else []  # type: ignore[attr-defined]


def _clears_grads_by_assignment(loop: cst.For | cst.While) -> bool:
    """`p.grad = None` or `param.grad.zero_()`, the hand-written forms of zero_grad."""
    return bool(
        findall(loop.body, m.AssignTarget(target=m.Attribute(attr=m.Name("grad"))))
        or findall(loop.body, m.Call(func=m.Attribute(value=m.Attribute(attr=m.Name("grad")), attr=m.Name("zero_"))))
    )
