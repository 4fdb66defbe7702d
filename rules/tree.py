"""Cheap searches of a syntax tree for the rules (no rule lives here).

libcst's `m.findall` and `CSTNode.visit` rebuild every node they pass, whitespace included, and `m.findall` runs the
full matcher on each one: one search of a module costs about as much as parsing it again, and the rules search
hundreds of times per file. Here a module is walked once into a flat index of its nodes in visit order (whitespace
and punctuation left out); every later search of it or of a subtree of it is a slice of that index, and a matcher
runs only on the nodes of its own type.
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, bisect_right
from collections import OrderedDict, defaultdict
from typing import Iterator

import libcst as cst
import libcst.matchers as m

from rules.walk import TRIVIA, walk_children

_DO_NOT_CARE = m.DoNotCare()
_NO_PRUNING: tuple[type[cst.CSTNode], ...] = ()


class _Index:
    """The non-trivia nodes of one tree in visit order; the subtree of `nodes[i]` is `nodes[i:ends[i]]`, and
    `by_type[t]` lists the indexes of the nodes of type `t`, ascending."""

    def __init__(self, tree: cst.CSTNode):
        self.nodes: list[cst.CSTNode] = []
        self.ends: list[int] = []
        self.position: dict[cst.CSTNode, int] = {}
        self.by_type: defaultdict[type[cst.CSTNode], list[int]] = defaultdict(list)
        self._child_starts: dict[int, list[int]] = {}
        pending: list[tuple[cst.CSTNode, int]] = [(tree, -1)]  # (node, -1) to enter, (node, i) to close
        while pending:
            node, index = pending.pop()
            if index >= 0:
                self.ends[index] = len(self.nodes)
                continue
            index = len(self.nodes)
            self.nodes.append(node)
            self.ends.append(index + 1)
            self.position[node] = index
            self.by_type[type(node)].append(index)
            pending.append((node, index))
            pending.extend((child, -1) for child in reversed(walk_children(node)))

    def subtree(self, root: cst.CSTNode, prune: tuple[type[cst.CSTNode], ...]) -> Iterator[cst.CSTNode]:
        start = self.position[root]
        if not prune:
            yield from self.nodes[start : self.ends[start]]
            return
        yield root
        index, end = start + 1, self.ends[start]
        while index < end:
            node = self.nodes[index]
            yield node
            index = self.ends[index] if isinstance(node, prune) else index + 1

    def child_starts(self, parent: int) -> list[int]:
        """The indexes of the children of `nodes[parent]`: each child's subtree ends where the next child starts."""
        starts = self._child_starts.get(parent)
        if starts is None:
            starts, child = [], parent + 1
            while child < self.ends[parent]:
                starts.append(child)
                child = self.ends[child]
            self._child_starts[parent] = starts
        return starts

    def of_types(self, root: cst.CSTNode, types: frozenset[type[cst.CSTNode]]) -> list[cst.CSTNode]:
        """The nodes of `types` in the subtree of `root`, in visit order: a search costs what it finds, not the
        size of the subtree (rules search each statement and block of a module)."""
        start = self.position[root]
        end = self.ends[start]
        found: list[int] = []
        for kind in types:
            indexes = self.by_type.get(kind)
            if indexes:
                found.extend(indexes[bisect_left(indexes, start) : bisect_left(indexes, end)])
        if len(types) > 1:
            found.sort()
        return [self.nodes[i] for i in found]


# The indexes of the last few modules searched: the rules of one file search the same module over and over.
_INDEXES: OrderedDict[int, _Index] = OrderedDict()
_KEPT = 4


def _index_holding(tree: cst.CSTNode) -> _Index:
    for index in reversed(_INDEXES.values()):
        if tree in index.position:
            return index
    index = _Index(tree)
    if isinstance(tree, cst.Module):  # a subtree not in any module seen is a rule's own new node: not kept
        _INDEXES[id(tree)] = index
        while len(_INDEXES) > _KEPT:
            _INDEXES.popitem(last=False)
    return index


def preorder(tree: cst.CSTNode, prune: tuple[type[cst.CSTNode], ...] = _NO_PRUNING) -> Iterator[cst.CSTNode]:
    """`tree` and its non-trivia descendants in visit order; nodes of a `prune` type below `tree` are not entered."""
    return _index_holding(tree).subtree(tree, prune)


def enclosing_statement(module: cst.Module, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement of `module.body` whose subtree holds `node`; None for the module itself and for whitespace,
    punctuation and comments, which the index leaves out."""
    index = _index_holding(module)
    where = index.position.get(node)
    if not where:  # not indexed, or the module (index 0)
        return None
    starts = index.child_starts(0)
    return index.nodes[starts[bisect_right(starts, where) - 1]]


def findall(tree: cst.CSTNode, matcher: m.BaseMatcherNode) -> list[cst.CSTNode]:
    """What `m.findall(tree, matcher)` finds, in the same order: `matcher` is one node matcher or a `|` of them."""
    types = _node_types(matcher)
    if types is None or types & TRIVIA:  # not about non-trivia node types: only libcst's own search knows
        return m.findall(tree, matcher)
    candidates = _index_holding(tree).of_types(tree, types)
    if _matches_any_node_of_its_type(matcher):
        return candidates
    return [node for node in candidates if m.matches(node, matcher)]


def visit(tree: cst.CSTNode, visitor: cst.CSTVisitor) -> None:
    """`tree.visit(visitor)` for a visitor that reads no whitespace or punctuation, without rebuilding the tree."""
    if visitor.on_visit(tree):
        for child in walk_children(tree):
            visit(child, visitor)
    visitor.on_leave(tree)


def _node_types(matcher: m.BaseMatcherNode) -> frozenset[type[cst.CSTNode]] | None:
    options = matcher.options if isinstance(matcher, m.OneOf) else (matcher,)
    types = [getattr(cst, type(option).__name__, None) for option in options]
    if not all(type(option).__module__.startswith("libcst.matchers") and kind for option, kind in zip(options, types)):
        return None
    return frozenset(types)  # type: ignore[arg-type]


def _matches_any_node_of_its_type(matcher: m.BaseMatcherNode) -> bool:
    """`m.Call()`: no field constrained, so the type test alone decides."""
    options = matcher.options if isinstance(matcher, m.OneOf) else (matcher,)
    return all(
        getattr(option, field.name) is _DO_NOT_CARE for option in options for field in dataclasses.fields(option)
    )


# Where libcst's ExpressionContextProvider starts a STORE context: the field of each node that holds a target.
_TARGET_FIELDS = {
    cst.AssignTarget: "target",
    cst.AnnAssign: "target",
    cst.AugAssign: "target",
    cst.NamedExpr: "target",
    cst.For: "target",
    cst.CompFor: "target",
    cst.AsName: "name",
}
_TARGET_HOLDERS = m.AssignTarget() | m.AnnAssign() | m.AugAssign() | m.NamedExpr() | m.For() | m.CompFor() | m.AsName()


def stored_attributes(tree: cst.CSTNode) -> set[cst.Attribute]:
    """The attributes under `tree` that ExpressionContextProvider marks STORE (`a.b = 1`, `for a.b in ...`,
    `a.b, c = ...`), found without resolving that provider for the whole module."""
    stored: set[cst.Attribute] = set()
    for holder in findall(tree, _TARGET_HOLDERS):
        pending = [getattr(holder, _TARGET_FIELDS[type(holder)])]
        while pending:
            node = pending.pop()
            if isinstance(node, cst.Attribute):
                stored.add(node)  # its value is read, not stored
            elif not isinstance(node, cst.Subscript):  # `a.b[i] = 1` stores into an item of `a.b`, which is read
                pending.extend(walk_children(node))
    return stored
