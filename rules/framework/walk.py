"""A cheaper tree walk than `CSTNode.visit`, with the same visit/leave semantics.

libcst's own walk rebuilds every node of the tree, changed or not, and that costs about as much as parsing the file
again. Here a node is rebuilt only when one of its children changed, and whitespace and punctuation are not walked at
all unless a rule asks for them. The children are visited in the order libcst visits them (the source order), read
once from libcst's own `_visit_and_replace_children` code, so rules see the same sequence of calls.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Sequence

import libcst as cst
from libcst import CSTNode, FlattenSentinel, MaybeSentinel, RemovalSentinel

_VISIT_FUNCTIONS = ("visit_required", "visit_optional", "visit_sentinel", "visit_sequence", "visit_body_sequence")

# Whitespace, comments and punctuation: about half of all nodes, and no rule's business unless it says so.
TRIVIA: frozenset[type[CSTNode]] = frozenset(
    getattr(cst, name)
    for name in dir(cst)
    if isinstance(getattr(cst, name), type)
    and issubclass(getattr(cst, name), CSTNode)
    and getattr(cst, name).__module__ in ("libcst._nodes.whitespace", "libcst._nodes.op")
) | {cst.LeftParen, cst.RightParen, cst.LeftSquareBracket, cst.RightSquareBracket, cst.LeftCurlyBrace,
     cst.RightCurlyBrace}  # fmt: skip


@lru_cache(maxsize=None)
def child_fields(node_type: type[CSTNode]) -> tuple[tuple[str, str], ...]:
    """(field, libcst visit function) for each child field of `node_type`, in the order libcst visits them."""
    method = node_type._visit_and_replace_children
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    calls = sorted(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _VISIT_FUNCTIONS
        ),
        key=lambda call: (call.lineno, call.col_offset),
    )
    fields: dict[str, str] = {}
    for call in calls:
        fields.setdefault(call.args[1].value, call.func.id)  # type: ignore[attr-defined]
    return tuple(fields.items())


@lru_cache(maxsize=None)
def _field_values(node_type: type[CSTNode]) -> Callable[[CSTNode], tuple]:
    """A function giving the values of `node_type`'s child fields, in order, in one call."""
    names = [name for name, _ in child_fields(node_type)]
    if not names:
        return lambda node: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda node: (get(node),)
    return attrgetter(*names)


def walk_children(node: CSTNode, skip: frozenset[type[CSTNode]] = TRIVIA) -> list[CSTNode]:
    """The direct children of `node` in source order, without the `skip` types; nothing is rebuilt."""
    children: list[CSTNode] = []
    for value in _field_values(type(node))(node):
        kind = type(value)  # type tests, not isinstance: CSTNode is an ABC, and this runs for every node
        if kind is tuple or kind is list:
            children.extend(child for child in value if type(child) not in skip)
        elif value is not None and kind is not MaybeSentinel and kind not in skip:
            children.append(value)
    return children


class Walk:
    """Walk `module` once, calling `on_visit(node)` and `on_leave(original, updated)` as `node.visit` would.

    `wants(node_type)` says whether anything happens at nodes of that type; a node nobody wants costs only the walk
    through it. `skip` types are not entered at all.
    """

    def __init__(
        self,
        on_visit: Callable[[CSTNode], bool],
        on_leave: Callable[[CSTNode, CSTNode], object],
        wants: Callable[[type[CSTNode]], bool],
        skip: frozenset[type[CSTNode]] = frozenset(),
    ):
        self._on_visit, self._on_leave, self._wants, self._skip = on_visit, on_leave, wants, skip
        self._wanted: dict[type[CSTNode], bool] = {}

    def run(self, module: cst.Module) -> cst.Module:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))  # deeply nested expressions recurse as libcst's visit does
        try:
            result = self._node(module)
        finally:
            sys.setrecursionlimit(limit)
        if not isinstance(result, cst.Module):
            raise TypeError(f"a rule replaced the module with {type(result).__name__}")
        return result

    def _node(self, node: CSTNode) -> object:
        node_type = type(node)
        wanted = self._wanted.get(node_type)
        if wanted is None:
            wanted = self._wanted[node_type] = self._wants(node_type)
        enter = self._on_visit(node) if wanted else True
        updated = self._children(node) if enter else node
        if not wanted:
            return updated
        result = self._on_leave(node, updated)
        if not isinstance(result, (CSTNode, RemovalSentinel, FlattenSentinel)):
            raise cst.CSTValidationError(f"leave_{node_type.__name__} returned a {type(result).__name__}, not a node")
        return result

    def _children(self, node: CSTNode) -> CSTNode:
        changes: dict[str, object] = {}
        node_type = type(node)
        for (name, visit), value in zip(child_fields(node_type), _field_values(node_type)(node)):
            kind = type(value)
            if kind is tuple or kind is list:
                items = self._sequence(value, visit == "visit_body_sequence") if value else None
                if items is not None:
                    changes[name] = items
            elif value is not None and kind is not MaybeSentinel and kind not in self._skip:
                new = self._node(value)
                if new is not value:
                    changes[name] = _single(new, value, visit)
        return node.with_changes(**changes) if changes else node

    def _sequence(self, children: Sequence[CSTNode], is_body: bool) -> tuple[CSTNode, ...] | None:
        """The new children, or None when none changed; removals and flattening as libcst's visit_sequence."""
        result: list[CSTNode] = []
        changed = False
        for child in children:
            if type(child) in self._skip:
                result.append(child)
                continue
            new = self._node(child)
            if new is child:
                result.append(child)
                continue
            changed = True
            if isinstance(new, RemovalSentinel):
                continue
            for item in new if isinstance(new, FlattenSentinel) else (new,):
                # A body keeps no statement line that a rule emptied (libcst's visit_body_sequence).
                if not (is_body and not child._is_removable() and item._is_removable()):  # type: ignore[union-attr]
                    result.append(item)  # type: ignore[arg-type]
        return tuple(result) if changed else None


def _single(new: object, old: CSTNode, visit: str) -> object:
    """A replaced single child, with libcst's rules for removing it."""
    if isinstance(new, FlattenSentinel):
        raise TypeError(f"a {type(old).__name__} cannot be replaced with a sequence here")
    if isinstance(new, RemovalSentinel):
        if visit == "visit_optional":
            return None
        if visit == "visit_sentinel":
            return MaybeSentinel.DEFAULT
        raise TypeError(f"a {type(old).__name__} cannot be removed here: its parent requires it")
    return new
