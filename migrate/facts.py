"""Checklist facts: what one source states, read cheaply by name from the original and the ported text (where
autocast, a GradScaler, seeds, torch_npu imports, process groups and hyperparameters are). migrate/checklist.py
judges the items from them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from migrate import hyperparams


@dataclass(frozen=True)
class SourceFacts:
    """What one source states, found by name (cheap, no scope analysis): lines of each kind of call. `readable` is
    False when Python's own parser could not read the source, so every fact is unknown rather than absent."""

    readable: bool = True
    torch_import: tuple[int, ...] = ()
    autocast: tuple[int, ...] = ()
    autocast_bf16: tuple[int, ...] = ()
    grad_scaler: tuple[int, ...] = ()
    scaled_backward: tuple[int, ...] = ()
    npu_import: tuple[int, ...] = ()
    process_group: tuple[int, ...] = ()
    seeds: tuple[int, ...] = ()
    hyperparameters: tuple[hyperparams.Hyperparameter, ...] = ()


@dataclass(frozen=True)
class FileFacts:
    """Facts of the original and of the ported text of one file, and the codes of the rules that looked at it."""

    original: SourceFacts
    ported: SourceFacts
    rules_run: tuple[str, ...] = ()

    @property
    def readable(self) -> bool:
        return self.original.readable and self.ported.readable


_CALL_KINDS = {
    "autocast": ("autocast", "initialize"),  # torch.autocast, torch.amp.autocast, apex amp.initialize
    "grad_scaler": ("GradScaler", "scale_loss"),
    "process_group": ("init_process_group",),
    "seeds": ("manual_seed", "manual_seed_all", "seed"),
}


def source_facts(code: str) -> SourceFacts:
    """The facts of one source. Read-only, so Python's `ast` (line numbers for free) rather than libcst."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # newer syntax than this Python reads: libcst parsed it, the facts stay empty
        return SourceFacts(readable=False)
    text = hyperparams.SourceText(code)
    lines: dict[str, set[int]] = {kind: set() for kind in (*_CALL_KINDS, "autocast_bf16", "scaled_backward")}
    npu_imports, torch_imports = set(), set()
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if "torch_npu" in text(node):
                npu_imports.add(node.lineno)
            if "torch" in _import_roots(node):
                torch_imports.add(node.lineno)
        if not isinstance(node, ast.Call):
            continue
        calls.append(node)
        name = hyperparams.dotted(node.func)
        last = name.rsplit(".", 1)[-1]
        for kind, names in _CALL_KINDS.items():
            if last in names and (last != "initialize" or "amp" in name):
                lines[kind].add(node.lineno)
        if last == "autocast" and "bfloat16" in text(node):
            lines["autocast_bf16"].add(node.lineno)
        if last == "backward" and name.endswith("scale.backward"):  # scaler.scale(loss).backward()
            lines["scaled_backward"].add(node.lineno)
    return SourceFacts(
        **{kind: tuple(sorted(found)) for kind, found in lines.items()},
        npu_import=tuple(sorted(npu_imports)),
        torch_import=tuple(sorted(torch_imports)),
        hyperparameters=tuple(hyperparams.extract(tree, text, calls)),
    )


def _import_roots(node: ast.Import | ast.ImportFrom) -> set[str]:
    if isinstance(node, ast.Import):
        return {alias.name.split(".")[0] for alias in node.names}
    return {node.module.split(".")[0]} if node.module and not node.level else set()


def file_facts(original: str, ported: str, rules_run: Iterable[str] = ()) -> FileFacts:
    """The facts of one file; `rules_run` are the codes of the rules that had something to look at in it."""
    facts = source_facts(original)
    return FileFacts(facts, facts if ported == original else source_facts(ported), tuple(rules_run))
