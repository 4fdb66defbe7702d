"""Port one source text: parse it once, run every wanted rule in a single walk, add the imports they asked for.

Pure: no file system, no printing. `migrate.files` does the I/O around it.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from functools import lru_cache
from typing import Sequence

import libcst as cst
import libcst.matchers as m
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, ImportItem, RemoveImportsVisitor
from libcst.helpers import get_full_name_for_node
from libcst.metadata import MetadataWrapper

from migrate import collector
from migrate.parsing import parse
from migrate.types import MigrationResult
from rules import CheapMatcherScan, FileState, PortRule, RuleSet, Settings, all_rules, forget, line_limit, reflow


def migrate_source(
    code: str,
    path: str = "<string>",
    settings: Settings = Settings(),
    rules: Sequence[type[PortRule]] | None = None,
) -> MigrationResult:
    """Port `code` with `rules` (all registered rules by default) under `settings`."""
    with collector.paused():
        module = parse(code, path)
        wanted = [rule for rule in (all_rules() if rules is None else rules) if rule.wants(code, settings)]
        if not wanted:
            return MigrationResult(original=code, code=code)
        try:
            return _port(module, code, path, settings, wanted)
        finally:
            forget(module)


def _port(
    module: cst.Module, code: str, path: str, settings: Settings, wanted: list[type[PortRule]]
) -> MigrationResult:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    context = CodemodContext(filename=path, wrapper=wrapper)
    file = FileState(path, code, settings, wrapper)
    instances = [rule(context, file) for rule in wanted]
    try:
        return _run_rules(context, file, instances)
    finally:  # the trees go as soon as the result is made, not at the next collection
        file.release()
        for instance in instances:
            instance.release()


def _run_rules(context: CodemodContext, file: FileState, instances: list[PortRule]) -> MigrationResult:
    wrapper, module, code = file.wrapper, file.wrapper.module, file.source
    with ExitStack() as stack:
        for instance in instances:
            stack.enter_context(instance.resolve(wrapper))
        ported = RuleSet(instances).transform(wrapper.module)
    if ported is not module:  # the lines the rules made keep to the file's line length
        ported = reflow(module, code, ported, line_limit(code, file.settings.line_length))
    if _missing_imports(context, ported):
        ported = _add_imports(context, ported)
    if context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY):  # imports a rewrite left unused (apex.parallel, say)
        ported = RemoveImportsVisitor(context).transform_module(ported)
    findings = sorted(file.findings, key=lambda f: (f.line, f.column, f.code))
    return MigrationResult(
        code,
        file.positions.code(ported),
        tuple(findings),
        inference=file.inference,
        rules_run=tuple(rule.CODE for rule in instances),
    )


def _add_imports(context: CodemodContext, module: cst.Module) -> cst.Module:
    """AddImportsVisitor's result, from running it on the module's head only.

    It reads and changes only the statements up to the first that is not an import (a docstring, the top imports,
    and the statement after them, which may get an empty line before it), but it copies and walks the whole module.
    Here it sees the top imports and, in place of the statement after them, a `pass` with that statement's leading
    lines; the statements after the head are kept as they are, so their code is not generated again.
    """
    head = 0
    while head < len(module.body) and m.matches(module.body[head], _IMPORT_OR_DOCSTRING):
        head += 1
    if head == len(module.body):
        return _AddImports(context).transform_module(module)
    after = module.body[head]
    stand_in = cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=after.leading_lines)
    added = _AddImports(context).transform_module(module.with_changes(body=(*module.body[:head], stand_in)))
    *imports, moved = added.body
    if not _same_lines(moved.leading_lines, after.leading_lines):
        after = after.with_changes(leading_lines=moved.leading_lines)
    return added.with_changes(body=(*imports, after, *module.body[head + 1 :]))


class _AddImports(CheapMatcherScan, AddImportsVisitor):
    """AddImportsVisitor, made and run without libcst's scan of every method name (twice: it makes a gatherer)."""

    def visit_Module(self, node: cst.Module) -> None:
        # AddImportsVisitor.visit_Module makes its gatherer by a module-level name: have it make the cheap kind.
        module = sys.modules[AddImportsVisitor.__module__]
        gatherer = getattr(module, "_GatherTopImportsBeforeStatements", None)
        if gatherer is None:  # another libcst: its own, at its own cost
            return super().visit_Module(node)
        module._GatherTopImportsBeforeStatements = _cheaply_scanned(gatherer)
        try:
            return super().visit_Module(node)
        finally:
            module._GatherTopImportsBeforeStatements = gatherer


@lru_cache(maxsize=None)
def _cheaply_scanned(visitor: type) -> type:
    return type(visitor.__name__, (CheapMatcherScan, visitor), {})


def _same_lines(lines: Sequence[cst.EmptyLine], others: Sequence[cst.EmptyLine]) -> bool:
    return len(lines) == len(others) and all(line.deep_equals(other) for line, other in zip(lines, others))


# What AddImportsVisitor may step over to find where the imports go: `__strict__ = ...`, a docstring, imports.
_IMPORT_OR_DOCSTRING = m.SimpleStatementLine(
    body=[
        m.Import()
        | m.ImportFrom()
        | m.Expr(value=m.SimpleString())
        | m.Assign(targets=[m.AssignTarget(target=m.Name("__strict__"))])
    ]
)


def _missing_imports(context: CodemodContext, module: cst.Module) -> list[ImportItem]:
    """The scheduled imports that the module's top-level imports do not already make. Most requests (`import torch`,
    `import os`) are already there, and AddImportsVisitor costs a deep copy and a full walk to find that out."""
    present: set[tuple[str, str | None]] = set()
    for statement in module.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Import):
                present.update((get_full_name_for_node(a.name) or "", None) for a in small.names if a.asname is None)
            elif isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                if isinstance(small.names, cst.ImportStar):
                    continue
                source = get_full_name_for_node(small.module) or ""
                present.update((source, get_full_name_for_node(a.name)) for a in small.names if a.asname is None)
    requested = context.scratch.get(AddImportsVisitor.CONTEXT_KEY, [])
    return [item for item in requested if item.alias or item.relative or (item.module, item.obj_name) not in present]
