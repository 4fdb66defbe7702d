"""The hyperparameters a script states in its source (checklist C9), with file:line, for a side-by-side table.

Read statically, without running anything: argparse defaults, config dicts, module-level constants with
hyperparameter names, and the literal arguments of optimizers, schedulers, DataLoaders and gradient clipping.
Values are kept as source text (`0.1`, `(0.9, 0.95)`), so `1e-3` and `0.001` count as different: a person reviews.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, PositionProvider

_NAME_HINTS = re.compile(
    r"^(lr|learning_rate|base_lr|max_lr|min_lr|batch_size|micro_batch_size|eval_batch_size|epochs|num_epochs|"
    r"max_iters|max_steps|train_steps|warmup\w*|lr_decay\w*|decay_lr|momentum|weight_decay|wd|beta\d?|betas|eps|"
    r"adam_\w+|grad_clip|clip\w*|max_grad_norm|gradient_accumulation_steps|grad_accum\w*|accum\w*|seed|dropout|"
    r"step_size|gamma|label_smoothing|optimizer|optim|scheduler|lr_scheduler|block_size|n_layer|n_head|n_embd|"
    r"arch|model|image_size|img_size|seq_len|max_len|num_classes)$",
    re.IGNORECASE,
)
_OPTIMIZERS = {
    "SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "RMSprop", "Rprop", "LBFGS",
    "SparseAdam", "ASGD", "FusedAdam", "FusedLAMB", "FusedSGD", "NpuFusedAdam", "NpuFusedAdamW", "NpuFusedSGD",
}  # fmt: skip
_SCHEDULER_MODULE = "lr_scheduler"
_CALL_SOURCES = {"DataLoader": "dataloader", "clip_grad_norm_": "clip", "clip_grad_value_": "clip"}


@dataclass(frozen=True)
class Hyperparameter:
    source: str  # argparse | config | constant | optimizer | scheduler | dataloader | clip
    name: str  # "lr", "SGD.momentum", "DataLoader.batch_size"
    value: str  # source text of the value
    line: int

    @property
    def key(self) -> tuple[str, str]:
        return self.source, self.name


def extract(module: cst.Module) -> list[Hyperparameter]:
    """Every hyperparameter stated in `module`, in source order."""
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    found = [*_module_constants(module, positions), *_calls(module, positions)]
    return sorted(found, key=lambda h: (h.line, h.source, h.name))


def _code(node: cst.CSTNode) -> str:
    return " ".join(cst.Module([]).code_for_node(node).split())


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return ""


def _module_constants(module: cst.Module, positions) -> Iterator[Hyperparameter]:
    """`learning_rate = 6e-4` and `config = {"lr": 0.1}` / `dict(lr=0.1)` at module level."""
    for statement in module.body:
        if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])):
            continue
        assign = statement.body[0]  # type: ignore[attr-defined]
        name = assign.targets[0].target.value
        line = positions[statement].start.line
        if isinstance(assign.value, cst.Dict):
            yield from _dict_entries(assign.value, positions)
        elif _NAME_HINTS.match(name) and _is_literal(assign.value):
            yield Hyperparameter("constant", name, _code(assign.value), line)


def _dict_entries(node: cst.Dict, positions) -> Iterator[Hyperparameter]:
    for element in node.elements:
        if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
            key = element.key.evaluated_value
            if isinstance(key, str) and _NAME_HINTS.match(key) and _is_literal(element.value):
                yield Hyperparameter("config", key, _code(element.value), positions[element].start.line)


def _is_literal(node: cst.BaseExpression) -> bool:
    literal = m.Integer() | m.Float() | m.SimpleString() | m.Name("True") | m.Name("False") | m.Name("None")
    if m.matches(node, literal | m.UnaryOperation(expression=m.Integer() | m.Float())):
        return True
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(_is_literal(element.value) for element in node.elements)
    return False


def _calls(module: cst.Module, positions) -> Iterator[Hyperparameter]:
    for call in m.findall(module, m.Call()):
        assert isinstance(call, cst.Call)
        name = _dotted(call.func)
        last = name.rsplit(".", 1)[-1]
        line = positions[call].start.line
        if last == "add_argument":
            yield from _argparse_default(call, line)
        elif last in _OPTIMIZERS:
            yield from _literal_arguments(call, "optimizer", last, line, positional={1: "lr"})
        elif _SCHEDULER_MODULE in name or last.endswith("LR") or last == "ReduceLROnPlateau":
            yield from _literal_arguments(call, "scheduler", last, line)
        elif last in _CALL_SOURCES:
            second = "batch_size" if last == "DataLoader" else "max_norm"
            yield from _literal_arguments(call, _CALL_SOURCES[last], last, line, positional={1: second})
        elif last == "dict" and name == "dict":
            yield from (
                Hyperparameter("config", arg.keyword.value, _code(arg.value), line)
                for arg in call.args
                if arg.keyword is not None and _NAME_HINTS.match(arg.keyword.value) and _is_literal(arg.value)
            )


def _argparse_default(call: cst.Call, line: int) -> Iterator[Hyperparameter]:
    strings = [arg.value for arg in call.args if arg.keyword is None and isinstance(arg.value, cst.SimpleString)]
    flags = [flag for flag in (string.evaluated_value for string in strings) if isinstance(flag, str)]
    default = next((arg.value for arg in call.args if arg.keyword and arg.keyword.value == "default"), None)
    if default is None or not flags or not _is_literal(default):
        return
    long = max(flags, key=len).lstrip("-").replace("-", "_")
    if _NAME_HINTS.match(long):
        yield Hyperparameter("argparse", long, _code(default), line)


def _literal_arguments(
    call: cst.Call, source: str, owner: str, line: int, positional: dict[int, str] | None = None
) -> Iterator[Hyperparameter]:
    if source in ("optimizer", "scheduler"):
        yield Hyperparameter(source, f"{source}.class", owner, line)
    for index, arg in enumerate(call.args):
        name = arg.keyword.value if arg.keyword is not None else (positional or {}).get(index)
        if name and _is_literal(arg.value):
            yield Hyperparameter(source, f"{owner}.{name}", _code(arg.value), line)
