"""The hyperparameters a script states in its source (checklist C9), with file:line, for a side-by-side table.

Read statically, without running anything: argparse defaults, config dicts, module-level constants with
hyperparameter names, and the literal arguments of optimizers, schedulers, DataLoaders and gradient clipping.
Values are kept as source text (`0.1`, `(0.9, 0.95)`), so `1e-3` and `0.001` count as different: a person reviews.
This is a read-only look, so it uses Python's own `ast` (fast, with line numbers) rather than libcst.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Iterable, Iterator

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
_SCHEDULER_MODULE = "lr_scheduler"  # torch.optim.lr_scheduler.*, and a name like self.lr_scheduler
_SCHEDULER_SUFFIX = "LR"  # StepLR, OneCycleLR, ...
_SCHEDULERS = {"ReduceLROnPlateau"}
_CALL_SOURCES = {"DataLoader": "dataloader", "clip_grad_norm_": "clip", "clip_grad_value_": "clip"}
_ARGPARSE = "add_argument"
_CONFIG = "dict"
# The dotted callee name (`dotted`) of every call _calls reads holds one of these: a reader that walks only the code
# naming one of them (migrate/facts.py) passes extract every call that matters.
CALL_NAMES = (_ARGPARSE, _CONFIG, _SCHEDULER_MODULE, _SCHEDULER_SUFFIX, *_OPTIMIZERS, *_SCHEDULERS, *_CALL_SOURCES)


@dataclass(frozen=True)
class Hyperparameter:
    source: SourceText  # argparse | config | constant | optimizer | scheduler | dataloader | clip
    name: str  # "lr", "SGD.momentum", "DataLoader.batch_size"
    value: str  # source text of the value
    line: int

    @property
    def key(self) -> tuple[str, str]:
        return self.source, self.name


def extract(tree: ast.Module, source: SourceText, calls: Iterable[ast.Call] | None = None) -> list[Hyperparameter]:
    """Every hyperparameter stated in the source (parsed as `tree`), in source order. `calls` are the tree's calls in
    ast.walk's order, where the caller has walked it already (a walk of a real script costs half as much as parsing it);
    it may leave out those whose dotted name holds none of CALL_NAMES, which state nothing here."""
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call)) if calls is None else calls
    found = [*_module_constants(tree, source), *_calls(calls, source)]
    return sorted(found, key=lambda h: (h.line, h.source, h.name))


def dotted(node: ast.expr) -> str:
    """`a.b.c` for a Name/Attribute chain (through calls: `a.b().c` is `a.b.c`), "" otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func)
    return ""


class SourceText:
    """The source text of `ast` nodes. ast.get_source_segment splits the whole file on every call (quadratic over a
    file); this splits it once."""

    def __init__(self, source: str):
        self.lines = [line.encode() for line in source.splitlines(keepends=True)]  # ast offsets count utf-8 bytes

    def __call__(self, node: ast.AST) -> str:
        first, last = node.lineno - 1, node.end_lineno - 1  # type: ignore[attr-defined]
        start, end = node.col_offset, node.end_col_offset  # type: ignore[attr-defined]
        if first == last:
            return self.lines[first][start:end].decode()
        return (self.lines[first][start:] + b"".join(self.lines[first + 1 : last]) + self.lines[last][:end]).decode()


def _text(node: ast.expr, source: SourceText) -> str:
    return " ".join(source(node).split())


def _is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return True
    return isinstance(node, (ast.Tuple, ast.List)) and all(_is_literal(element) for element in node.elts)


def _module_constants(tree: ast.Module, source: SourceText) -> Iterator[Hyperparameter]:
    """`learning_rate = 6e-4` and `config = {"lr": 0.1}` at module level."""
    for statement in tree.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            continue
        target = statement.targets[0]
        if isinstance(statement.value, ast.Dict):
            yield from _dict_entries(statement.value, source)
        elif isinstance(target, ast.Name) and _NAME_HINTS.match(target.id) and _is_literal(statement.value):
            yield Hyperparameter("constant", target.id, _text(statement.value, source), statement.lineno)


def _dict_entries(node: ast.Dict, source: SourceText) -> Iterator[Hyperparameter]:
    for key, value in zip(node.keys, node.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and _NAME_HINTS.match(key.value):
            if _is_literal(value):
                yield Hyperparameter("config", key.value, _text(value, source), key.lineno)


def _calls(calls: Iterable[ast.Call], source: SourceText) -> Iterator[Hyperparameter]:
    for call in calls:
        name = dotted(call.func)
        last = name.rsplit(".", 1)[-1]
        if last == _ARGPARSE:
            yield from _argparse_default(call, source)
        elif last in _OPTIMIZERS:
            yield from _literal_arguments(call, source, "optimizer", last, positional={1: "lr"})
        elif _SCHEDULER_MODULE in name or last.endswith(_SCHEDULER_SUFFIX) or last in _SCHEDULERS:
            yield from _literal_arguments(call, source, "scheduler", last)
        elif last in _CALL_SOURCES:
            second = "batch_size" if last == "DataLoader" else "max_norm"
            yield from _literal_arguments(call, source, _CALL_SOURCES[last], last, positional={1: second})
        elif name == _CONFIG:
            yield from (
                Hyperparameter("config", keyword.arg, _text(keyword.value, source), call.lineno)
                for keyword in call.keywords
                if keyword.arg and _NAME_HINTS.match(keyword.arg) and _is_literal(keyword.value)
            )


def _argparse_default(call: ast.Call, source: SourceText) -> Iterator[Hyperparameter]:
    flags = [arg.value for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    default = next((keyword.value for keyword in call.keywords if keyword.arg == "default"), None)
    if default is None or not flags or not _is_literal(default):
        return
    long = max(flags, key=len).lstrip("-").replace("-", "_")
    if _NAME_HINTS.match(long):
        yield Hyperparameter("argparse", long, _text(default, source), call.lineno)


def _literal_arguments(
    call: ast.Call, source: SourceText, kind: str, owner: str, positional: dict[int, str] | None = None
) -> Iterator[Hyperparameter]:
    if kind in ("optimizer", "scheduler"):
        yield Hyperparameter(kind, f"{kind}.class", owner, call.lineno)
    named = [((positional or {}).get(index), arg) for index, arg in enumerate(call.args)]
    named += [(keyword.arg, keyword.value) for keyword in call.keywords]
    for name, value in named:
        if name and _is_literal(value):
            yield Hyperparameter(kind, f"{owner}.{name}", _text(value, source), call.lineno)
