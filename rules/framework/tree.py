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
from typing import Callable, Iterator

import libcst as cst
import libcst.matchers as m

from rules.framework.walk import TRIVIA, walk_children

_DO_NOT_CARE = m.DoNotCare()
_NO_PRUNING: tuple[type[cst.CSTNode], ...] = ()


class _Index:
    """The non-trivia nodes of one tree in visit order; the subtree of `nodes[i]` is `nodes[i:ends[i]]`, and
    `by_type[t]` lists the indexes of the nodes of type `t`, ascending."""

    def __init__(self, tree: cst.CSTNode):
        self.nodes: list[cst.CSTNode] = []
        self.ends: list[int] = []
        self.position: dict[int, int] = {}  # id(node) -> its index (the list keeps the nodes alive)
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
            self.position[id(node)] = index
            self.by_type[type(node)].append(index)
            pending.append((node, index))
            pending.extend((child, -1) for child in reversed(walk_children(node)))

    def subtree(self, root: cst.CSTNode, prune: tuple[type[cst.CSTNode], ...]) -> Iterator[cst.CSTNode]:
        start = self.position[id(root)]
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
        start = self.position[id(root)]
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
        if id(tree) in index.position:
            return index
    index = _Index(tree)
    if isinstance(tree, cst.Module):  # a subtree not in any module seen is a rule's own new node: not kept
        _INDEXES[id(tree)] = index
        while len(_INDEXES) > _KEPT:
            _INDEXES.popitem(last=False)
    return index


def forget(module: cst.Module) -> None:
    """Drop the index of `module`: the engine, when its file is done (a tree kept alive costs memory and every later
    collection of the oldest generation a walk through it)."""
    _INDEXES.pop(id(module), None)


def preorder(tree: cst.CSTNode, prune: tuple[type[cst.CSTNode], ...] = _NO_PRUNING) -> Iterator[cst.CSTNode]:
    """`tree` and its non-trivia descendants in visit order; nodes of a `prune` type below `tree` are not entered."""
    return _index_holding(tree).subtree(tree, prune)


def enclosing_statement(module: cst.Module, node: cst.CSTNode) -> cst.CSTNode | None:
    """The statement of `module.body` whose subtree holds `node`; None for the module itself and for whitespace,
    punctuation and comments, which the index leaves out."""
    index = _index_holding(module)
    where = index.position.get(id(node))
    if not where:  # not indexed, or the module (index 0)
        return None
    starts = index.child_starts(0)
    return index.nodes[starts[bisect_right(starts, where) - 1]]


def findall(tree: cst.CSTNode, matcher: m.BaseMatcherNode) -> list[cst.CSTNode]:
    """What `m.findall(tree, matcher)` finds, in the same order: `matcher` is one node matcher or a `|` of them."""
    types, test = _compiled(matcher)
    if types is None or types & TRIVIA:  # not about non-trivia node types: only libcst's own search knows
        return m.findall(tree, matcher)
    return [node for node in _index_holding(tree).of_types(tree, types) if test(node)]


def matches(node: object, matcher: m.BaseMatcherNode) -> bool:
    """`m.matches(node, matcher)`, compiled once per matcher into a plain function for the shapes rules use (node
    matchers, `|`, literal, empty and nested node fields, MatchIfTrue): libcst's general matching costs tens of
    microseconds a node, and rules test thousands of nodes. Any other shape is left to libcst."""
    return _compiled(matcher)[1](node)


class _Undecided(Exception):
    """A compiled matcher met what only libcst decides (a sequence where a node matcher stands)."""


_Compiled = tuple[frozenset[type[cst.CSTNode]] | None, Callable[[object], bool]]
_COMPILED: dict[object, _Compiled] = {}  # matcher's shape -> (the node types it can match, its test)
_BY_IDENTITY: dict[int, tuple[m.BaseMatcherNode, _Compiled]] = {}  # id(matcher) -> the matcher, its compiled form


def _compiled(matcher: m.BaseMatcherNode) -> _Compiled:
    """A matcher kept in a constant is found by identity (its shape costs more than the test, and rules test every
    call of a file); one made anew at each call by its shape."""
    known = _BY_IDENTITY.get(id(matcher))
    if known is not None and known[0] is matcher:
        return known[1]
    compiled = _compiled_by_shape(matcher)
    if len(_BY_IDENTITY) > 4096:  # the matchers made at each call, kept alive here so that ids stay theirs: bounded
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(matcher)] = (matcher, compiled)
    return compiled


def _compiled_by_shape(matcher: m.BaseMatcherNode) -> _Compiled:
    """Matchers are looked up by shape: rules build some of theirs anew at each call, and libcst's compare by
    identity."""
    key = _shape(matcher)
    try:
        compiled = _COMPILED.get(key)
    except TypeError:  # something unhashable inside: libcst's own matching
        return _node_types(matcher), _libcst(matcher)
    if compiled is None:
        if len(_COMPILED) > 4096:  # matchers holding a rule's lambdas, made at each call: bounded
            _COMPILED.clear()
        test = _compile(matcher)
        decide = _with_fallback(test, matcher) if test else _libcst(matcher)
        compiled = _COMPILED[key] = (_node_types(matcher), decide)
    return compiled


def _shape(value: object) -> object:
    """A hashable key equal for equal matchers: their type and fields, all the way down."""
    kind = type(value)
    if kind in _LITERALS or value is _DO_NOT_CARE:
        return value
    if kind is list or kind is tuple:
        return (list, tuple([_shape(item) for item in value]))  # type: ignore[attr-defined]
    if kind is m.OneOf:
        return (m.OneOf, tuple([_shape(option) for option in value.options]))  # type: ignore[attr-defined]
    names = _MATCHER_FIELDS.get(kind, ())
    if names == ():
        is_matcher = dataclasses.is_dataclass(value) and kind.__module__.startswith("libcst.matchers")
        names = _MATCHER_FIELDS[kind] = tuple(f.name for f in dataclasses.fields(value)) if is_matcher else None
    if names is None:
        return (id(value), value)  # a lambda's MatchIfTrue, say: itself (kept alive by the key)
    return (kind, tuple([_shape(getattr(value, name)) for name in names]))


_LITERALS = frozenset({str, bool, int, type(None)})
_MATCHER_FIELDS: dict[type, tuple[str, ...] | None] = {}


def _libcst(matcher: m.BaseMatcherNode) -> Callable[[object], bool]:
    return lambda node: m.matches(node, matcher)  # type: ignore[arg-type]


def _with_fallback(test: Callable[[object], bool], matcher: m.BaseMatcherNode) -> Callable[[object], bool]:
    def decide(node: object) -> bool:
        try:
            return test(node)
        except _Undecided:
            return m.matches(node, matcher)  # type: ignore[arg-type]

    return decide


def _compile(matcher: object) -> Callable[[object], bool] | None:
    """A test equal to libcst's `_matches(node, matcher)`, or None for a shape not compiled."""
    if isinstance(matcher, m.OneOf):
        options = [_compile(option) for option in matcher.options]
        if not all(options):
            return None
        return lambda node: any(test(node) for test in options)  # type: ignore[misc]
    if isinstance(matcher, m.MatchIfTrue):
        return lambda node: bool(matcher.func(node))
    if _node_types(matcher) is None:  # type: ignore[arg-type]
        return None
    fields: list[tuple[str, Callable[[object], bool]]] = []
    for field in dataclasses.fields(matcher):  # type: ignore[arg-type]
        desired = getattr(matcher, field.name)
        if field.name == "_metadata" or desired is _DO_NOT_CARE:
            continue
        test = None if field.name == "metadata" else _compile_field(desired)
        if test is None:
            return None
        fields.append((field.name, test))
    name = type(matcher).__name__  # libcst compares class names

    def node_matches(node: object) -> bool:
        return type(node).__name__ == name and all(test(getattr(node, field)) for field, test in fields)

    return node_matches


def _compile_field(desired: object) -> Callable[[object], bool] | None:
    """A test equal to libcst's `_attribute_matches(value, desired)`, or None."""
    if desired is None:
        return lambda value: value is None
    if isinstance(desired, bool):
        return lambda value: value is desired
    if isinstance(desired, str):
        return lambda value: value == desired
    if isinstance(desired, m.MatchIfTrue):
        return lambda value: bool(desired.func(value))
    if isinstance(desired, (list, tuple)) and not desired:  # `args=[]`: no element at all
        return _empty_sequence
    node_test = _compile(desired) if isinstance(desired, (m.OneOf, m.BaseMatcherNode)) else None
    if node_test is None:
        return None

    def field_matches(value: object) -> bool:
        if isinstance(value, (list, tuple)):
            raise _Undecided
        return node_test(value)

    return field_matches


def _empty_sequence(value: object) -> bool:
    if not isinstance(value, (list, tuple)):
        raise _Undecided
    return not value


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
