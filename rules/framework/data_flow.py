"""Which names a statement writes and which it reads: enough data flow for a backward slice over plain names and
attribute chains (what the loss-scaling rules need to find the statements that compute a loss)."""

from __future__ import annotations

import libcst as cst

from rules.framework.calls import dotted_name
from rules.framework.loops import method
from rules.framework.tree import visit

# Method calls that fill a container in place: `losses.append(l)` writes `losses` as far as a slice is concerned.
_FILLS = frozenset({"append", "extend", "insert", "update", "add", "setdefault"})


def names_written(statement: cst.BaseStatement) -> set[str]:
    """Names (dotted for attributes) `statement` binds or fills: `a = ...`, `a.b += ...`, `a[i] = ...` and
    `a.append(...)` write `a`, `a.b`, `a` and `a`; nested function and class bodies are not looked into."""
    collector = _Writes()
    visit(statement, collector)
    return collector.names


def names_read(node: cst.CSTNode) -> set[str]:
    """Names (dotted for attribute chains) `node` reads; plain assignment targets, function bodies and lambdas are
    not reads."""
    collector = _Reads()
    visit(node, collector)
    return collector.names


class _Writes(cst.CSTVisitor):
    """names_written's visitor; subscript targets count as their container."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def _target(self, target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._target(element.value)
        elif isinstance(target, cst.Subscript):
            self._target(target.value)
        elif isinstance(target, cst.StarredElement):
            self._target(target.value)
        elif dotted_name(target):
            self.names.add(dotted_name(target))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._target(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._target(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._target(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._target(node.asname.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._target(node.target)

    def visit_Call(self, node: cst.Call) -> None:
        if method(node) in _FILLS:
            self._target(node.func.value)  # type: ignore[attr-defined]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return False


class _Reads(cst.CSTVisitor):
    """names_read's visitor."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        dotted = dotted_name(node)
        if dotted:
            self.names.add(dotted)
            return False
        return True

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Arg(self, node: cst.Arg) -> bool:
        visit(node.value, self)
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        return not isinstance(node.target, (cst.Name, cst.Tuple, cst.List))

    def visit_For(self, node: cst.For) -> bool:
        visit(node.iter, self)
        visit(node.body, self)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        return False
