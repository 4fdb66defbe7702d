"""Where a training process starts, and how to put statements there (no rule lives here).

Seeds and determinism switches must run in every process that trains: inside the function `mp.spawn` starts, else
at the start of `main()`, else in the `if __name__ == "__main__":` block, else after the imports of a script.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import libcst as cst
import libcst.matchers as m

from rules import dotted_name, findall, matches

Entry = Union[cst.FunctionDef, cst.If, cst.Module]
Resolver = Callable[[cst.CSTNode], "set[str]"]

_SPAWN = frozenset({"torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn", "torch.multiprocessing.start_processes"})
_MAIN_GUARD = m.If(
    test=m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(comparator=m.SimpleString())])
)


def process_entry(module: cst.Module, resolve: Resolver) -> Entry:
    """The node whose body each training process runs first."""
    target = spawn_target(module, resolve)
    if target is not None:
        return target
    main = _functions(module).get("main")
    if main is not None:
        return main
    guard = next((node for node in module.body if matches(node, _MAIN_GUARD)), None)
    return guard if guard is not None else module


def spawn_target(module: cst.Module, resolve: Resolver) -> cst.FunctionDef | None:
    """The module-level function that `mp.spawn(fn, ...)` runs in each worker process, if any."""
    functions = _functions(module)
    for call in findall(module, m.Call(args=[m.AtLeastN(n=1)])):
        if not resolve(call.func).isdisjoint(_SPAWN):  # type: ignore[attr-defined]
            target = functions.get(dotted_name(call.args[0].value))  # type: ignore[attr-defined]
            if target is not None:
                return target
    return None


def _functions(module: cst.Module) -> dict[str, cst.FunctionDef]:
    return {node.name.value: node for node in module.body if isinstance(node, cst.FunctionDef)}


def numpy_alias(module: cst.Module) -> str | None:
    """How the module names numpy (`np`, `numpy`), or None when it does not import it at the top."""
    for line in module.body:
        for alias in findall(line, m.ImportAlias(name=m.Name("numpy"))):
            asname = alias.asname  # type: ignore[attr-defined]
            return asname.name.value if asname is not None else "numpy"  # type: ignore[union-attr]
    return None


def seeds_python_generator(module: cst.Module, inference: bool) -> bool:
    """Whether a port seeds python's `random`: a training script always (its data pipeline may draw from it in
    another module), an inference script only where it imports random itself."""
    return imports_random(module) or not inference


def imports_random(module: cst.Module) -> bool:
    """Whether the module imports python's `random` at the top (`import random`, `from random import shuffle`)."""
    random = m.ImportAlias(name=m.Name("random"))
    return any(
        findall(line, m.Import(names=[m.ZeroOrMore(), random, m.ZeroOrMore()]))
        or findall(line, m.ImportFrom(module=m.Name("random")))
        for line in module.body
    )


def at_start(entry: Entry, statements: Sequence[cst.BaseStatement]) -> Entry:
    """`entry` with `statements` first in its body: after a docstring, or after a script's imports."""
    if isinstance(entry, cst.Module):
        body = list(entry.body)
        index = _after_preamble(body, imports=True)
        body[index:index] = statements
        return entry.with_changes(body=body)
    block = entry.body
    if not isinstance(block, cst.IndentedBlock):
        return entry
    body = list(block.body)
    index = _after_preamble(body, imports=False)
    body[index:index] = statements
    return entry.with_changes(body=block.with_changes(body=body))


def _after_preamble(body: list[cst.BaseStatement], imports: bool) -> int:
    preamble = m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])
    if imports:
        preamble = preamble | m.SimpleStatementLine(body=[m.AtLeastN(m.Import() | m.ImportFrom(), n=1)])
    index = 0
    while index < len(body) and matches(body[index], preamble):
        index += 1
    return index
