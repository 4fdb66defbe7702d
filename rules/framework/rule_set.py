"""Several rules in one walk of a module (migrate's engine runs every wanted rule this way).

It reads the rules' libcst internals (matcher decorators, visit_/leave_ functions) to offer each node only to the
rules that handle its type, so it lives beside PortRule, not in the engine.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import libcst as cst

from rules.framework.base import PortRule
from rules.framework.walk import TRIVIA, Walk


class RuleSet:
    """Runs several rules in one walk: each node is offered only to the rules that handle its type.

    Each rule sees the tree as if it ran alone, except that `updated_node` already holds the rewrites of the rules
    before it. A rule whose `visit_*` returns False skips that subtree alone; the others still walk it.
    """

    def __init__(self, rules: Sequence[PortRule]):
        self._rules = rules
        self._wide = [rule for rule in rules if _handled_types(rule) is None]
        self._by_type: dict[type, _TypeHandlers] = {}
        self._skipping: dict[int, cst.CSTNode] = {}  # id(rule) -> node whose subtree that rule skips

    def transform(self, module: cst.Module) -> cst.Module:
        handled = set().union(*(_handled_types(rule) or () for rule in self._rules))
        trivia_wanted = self._wide or any(kind.__name__ in handled for kind in TRIVIA)
        walk = Walk(self.on_visit, self.on_leave, self._wants, skip=frozenset() if trivia_wanted else TRIVIA)
        return walk.run(module)

    def _wants(self, node_type: type) -> bool:
        return bool(self._handlers(node_type).all)

    def _handlers(self, node_type: type) -> _TypeHandlers:
        handlers = self._by_type.get(node_type)
        if handlers is None:
            name = node_type.__name__
            every = [
                _Handlers.of(rule, name)
                for rule in self._rules
                if rule in self._wide or name in (_handled_types(rule) or ())
            ]
            visits = [(id(rule), visit) for rule, visit, _ in every if visit is not None]
            leaves = [h.leave for h in every if h.leave]
            handlers = self._by_type[node_type] = _TypeHandlers(every, visits, leaves, {id(h.rule) for h in every})
        return handlers

    def on_visit(self, node: cst.CSTNode) -> bool:
        skipping = self._skipping
        for rule_id, visit in self._handlers(type(node)).visits:
            if not (skipping and rule_id in skipping) and visit(node) is False:
                skipping[rule_id] = node
        return True

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> object:
        """The rules' leave_* functions in turn, each given what the one before returned."""
        handlers = self._handlers(type(original_node))
        if self._skipping and not handlers.rules.isdisjoint(self._skipping):
            return self._leave_while_skipping(handlers.all, original_node, updated_node)
        result: object = updated_node
        for leave in handlers.leaves:
            if not isinstance(result, type(original_node)):
                break  # an earlier rule replaced or removed the node: later rules' leave_* no longer apply
            result = leave(original_node, result)
        return result

    def _leave_while_skipping(
        self, handlers: list[_Handlers], original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> object:
        """on_leave while a rule that handles this node type skips a subtree: its leave_* runs only where it started
        skipping."""
        result: object = updated_node
        for rule, _, leave in handlers:
            skipped_at = self._skipping.get(id(rule))
            if skipped_at is not None:
                if skipped_at is not original_node:
                    continue
                del self._skipping[id(rule)]
            if not isinstance(result, type(original_node)):
                break
            if leave is not None:
                result = leave(original_node, result)
        return result


class _TypeHandlers(NamedTuple):
    """What the rules do at one node type: every rule's handlers, and the visit and leave functions among them
    (most rules that handle a type only visit it or only leave it)."""

    all: list[_Handlers]
    visits: list[tuple[int, Callable[[cst.CSTNode], object]]]  # (id(rule), its visit function)
    leaves: list[Callable[[cst.CSTNode, cst.CSTNode], object]]
    rules: set[int]  # id(rule) of each


class _Handlers(NamedTuple):
    """What a rule does at one node type: its visit and leave functions, None where it has none."""

    rule: PortRule
    visit: Callable[[cst.CSTNode], object] | None
    leave: Callable[[cst.CSTNode, cst.CSTNode], object] | None

    @classmethod
    def of(cls, rule: PortRule, type_name: str) -> _Handlers:
        if rule._matchers or rule._extra_visit_funcs or rule._extra_leave_funcs:
            return cls(rule, rule.on_visit, rule.on_leave)  # libcst's matcher bookkeeping runs at every node
        # Without matcher decorators libcst's on_visit/on_leave only look up visit_<type>/leave_<type>, on every
        # call (a third of migrate's time on real scripts): look them up once per node type instead.
        return cls(rule, getattr(rule, f"visit_{type_name}", None), getattr(rule, f"leave_{type_name}", None))


def _handled_types(rule: PortRule) -> frozenset[str] | None:
    """Names of the node types `rule` has visit/leave functions for; None when it must see every node."""
    cls = type(rule)
    cached = cls.__dict__.get("_handled_types_cache", False)
    if cached is not False:
        return cached  # type: ignore[return-value]
    names: set[str] | None = set()
    for klass in cls.__mro__:
        if klass is PortRule:
            break
        for attr in klass.__dict__:
            if attr.startswith(("visit_", "leave_")):
                names.add(attr.split("_")[1])
    matchers = list(rule._extra_visit_funcs) + list(rule._extra_leave_funcs)
    if rule._matchers:  # call_if_inside / call_if_not_inside must track every node
        names = None
    for matcher in matchers:
        matcher_type = type(matcher)
        if names is None or not matcher_type.__module__.startswith("libcst.matchers") or not hasattr(
            cst, matcher_type.__name__
        ):
            names = None
            break
        names.add(matcher_type.__name__)
    result = frozenset(names) if names is not None else None
    setattr(cls, "_handled_types_cache", result)
    return result
