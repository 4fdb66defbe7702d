"""Qualified names at the cost of one light walk: what libcst's QualifiedNameProvider answers, about 10x cheaper.

libcst's provider runs the full ScopeProvider (a rebuilding walk that also records every access) and then computes
names for every node of the file. Rules ask about a few dozen nodes. So this module records only what name
resolution needs, the scopes and the assignments in them (imports, assignments, parameters, definitions, `global`
and `nonlocal`), in libcst's own Scope classes, and answers a node when it is asked, through libcst's own
`Scope.get_qualified_names_for`. Import aliases, shadowing by assignments and parameters, class scopes that
methods do not see, and comprehension scopes therefore resolve exactly as libcst resolves them
(tests/test_engine.py compares the two on every rule example and sample).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable, Iterator, Mapping

import libcst as cst
from libcst import CSTNode
from libcst.metadata import QualifiedName
from libcst.metadata.scope_provider import (
    _ASSIGNMENT_LIKE_NODES,
    AnnotationScope,
    BaseAssignment,
    ClassScope,
    ComprehensionScope,
    FunctionScope,
    GlobalScope,
    Scope,
)

from rules.framework.walk import TRIVIA, child_fields

_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_NOT_YET = object()
_STRINGS = (cst.SimpleString, cst.ConcatenatedString)  # what libcst reads a string annotation from
_ASSIGNMENT_LIKE = frozenset(_ASSIGNMENT_LIKE_NODES)
_NONE: frozenset[str] = frozenset()


def _imported_root(node: cst.Import | cst.ImportFrom, alias: cst.ImportAlias) -> str:
    """The first part of the qualified names of what `alias` imports: `torch` for `import torch.nn as tnn` and
    `from torch import nn`, "" for `from . import x` and `from .m import x` (libcst names them `.x`, `.m.x`)."""
    if isinstance(node, cst.ImportFrom):
        if node.relative:
            return ""
        return cst.helpers.get_full_name_for_node_or_raise(node.module).partition(".")[0]  # type: ignore[arg-type]
    return cst.helpers.get_full_name_for_node_or_raise(alias.name).partition(".")[0]


def _dotted_prefixes(attribute: cst.Attribute) -> Iterator[CSTNode]:
    """`a.b.c`, then `a.b`, then `a`: the nodes libcst tries, longest first."""
    node: CSTNode = attribute
    while isinstance(node, cst.Attribute):
        yield node
        node = node.value
    if isinstance(node, cst.Name):
        yield node


class QualifiedNames(Mapping[CSTNode, "set[QualifiedName]"]):
    """node -> the QualifiedName set libcst's QualifiedNameProvider gives it; scopes are found on first use."""

    def __init__(self, module: cst.Module):
        self._module = module
        self._scopes: dict[CSTNode, Scope] | None = None
        self._names: dict[CSTNode, set[QualifiedName]] = {}
        self._texts: dict[CSTNode, frozenset[str]] = {}
        # node -> its dotted name's first and last parts, and the name; None for a node without one
        self._dotted_parts: dict[CSTNode, tuple[str, str, str] | None] = {}
        # Resolutions shared by nodes that must resolve alike: a dotted name read in one scope, after the same
        # assignments (libcst walks every assignment of the name each time, hundreds for `model` in a long script).
        self._by_read: dict[tuple[int, str, int], set[QualifiedName]] = {}
        self._by_dotted: dict[tuple[int, str], set[QualifiedName]] = {}

    @property
    def scopes(self) -> dict[CSTNode, Scope]:
        if self._scopes is None:
            self._recorder = _ScopeRecorder()
            self._scopes = self._recorder.record(self._module)
        return self._scopes

    def release(self) -> None:
        """Break libcst's scope <-> assignment reference cycles, once the file is done: they hold every node, and
        a tree kept alive by a cycle is freed only by a collection that walks all of it (a tenth of a second on a
        long script) instead of as soon as the last reference goes."""
        for scope in set((self._scopes or {}).values()):
            scope._assignments.clear()
            scope._accesses_by_name.clear()
            scope._accesses_by_node.clear()
        self._scopes = None

    def __getitem__(self, node: CSTNode) -> set[QualifiedName]:
        names = self._names.get(node)
        if names is None:
            names = self._names[node] = self._resolve(node)
        return names

    def may_end_with(self, node: CSTNode, last_parts: frozenset[str]) -> bool:
        """False when no qualified name of `node` can end with one of `last_parts`, found without resolving it.

        libcst names a node by its dotted name (`a.b.c` for `a.b.c` or `a.b.c()`), replacing an imported prefix by
        what it imports, so the last part stays; unless the whole dotted name is an import's `as` name (`y` in
        `from m import x as y`), or the name's first part is a builtin or local name, which libcst gives alone
        (`builtins.str` for `str.join`). A node without a dotted name (a number, an operation) has no qualified name
        unless it is a string annotation (`x: "torch.Tensor"`). tests/test_engine.py holds every node of the corpus
        to that.
        """
        parts = self._parts(node)
        if parts is None:
            return isinstance(node, _STRINGS)
        first, last, dotted = parts
        return last in last_parts or first in last_parts or dotted in self.aliases

    def may_start_with(self, node: CSTNode, first_parts: frozenset[str]) -> bool:
        """False when no qualified name of `node` can start with one of `first_parts`, found without resolving it.

        libcst's name of a node starts with its dotted name's first part, unless an import binds that part (it
        stands for what it imports: `amp` of `from apex import amp` starts `apex.`), the name is a builtin
        (`builtins.`), or the node is local to a function or class (whose name starts its locals' names).
        tests/test_engine.py holds every node of the corpus to that.
        """
        parts = self._parts(node)
        if parts is None:
            return isinstance(node, _STRINGS)
        first = parts[0]
        self.scopes  # records the imported and defined names
        recorder = self._recorder
        return (
            first in first_parts
            or not recorder.imported.get(first, _NONE).isdisjoint(first_parts)
            or "builtins" in first_parts
            or not recorder.defined.isdisjoint(first_parts)
        )

    def _parts(self, node: CSTNode) -> tuple[str, str, str] | None:
        """The first and last parts of `node`'s dotted name, and the name; None for a node without one."""
        parts = self._dotted_parts.get(node, _NOT_YET)
        if parts is _NOT_YET:  # rules ask about the same call or attribute, dozens of them
            dotted = cst.helpers.get_full_name_for_node(node)
            parts = None if dotted is None else (dotted.partition(".")[0], dotted.rpartition(".")[2], dotted)
            self._dotted_parts[node] = parts
        return parts  # type: ignore[return-value]

    @property
    def aliases(self) -> set[str]:
        """The `as` names of the module's imports."""
        self.scopes  # records them
        return self._recorder.aliases

    def texts(self, node: CSTNode) -> frozenset[str]:
        """The names of `node`'s QualifiedNames; empty for a node not in the module (one a rule built)."""
        texts = self._texts.get(node)
        if texts is None:
            texts = self._texts[node] = frozenset(q.name for q in self.get(node, ()))
        return texts

    def _resolve(self, node: CSTNode) -> set[QualifiedName]:
        scope = self.scopes[node]  # records the scopes and reads on first use
        read = self._recorder.reads.get(node)
        if read is None:
            dotted = cst.helpers.get_full_name_for_node(node) if isinstance(node, cst.Attribute) else None
            if dotted is None or id(node) in self._recorder.import_names:  # libcst answers these by the node
                return set(scope.get_qualified_names_for(node))
            key = (id(scope), dotted)
            if key not in self._by_dotted:
                self._by_dotted[key] = set(scope.get_qualified_names_for(node))
            return set(self._by_dotted[key])
        read_key = (id(scope), *read)
        if read_key not in self._by_read:
            referents = self.referents(node)
            self._by_read[read_key] = {
                qualified for referent in referents for qualified in referent.get_qualified_names_for(referent.name)
            }
        return set(self._by_read[read_key])

    def referents(self, node: CSTNode) -> set[BaseAssignment]:
        """The assignments a read of `node` may refer to, as libcst's `Access.referents`; empty for no read."""
        scope = self.scopes.get(node)
        read = self._recorder.reads.get(node)
        if scope is None or read is None:
            return set()
        # A name read in its own scope before any assignment there refers to none of them (libcst's Access).
        name, index = read
        assignments = scope._resolve_scope_for_access(name, scope)
        earlier = {a for a in assignments if a.scope is not scope or a._index < index}
        if not earlier and assignments and scope.parent is not scope:
            earlier = set(scope.parent._resolve_scope_for_access(name, scope))
        return earlier

    def references(self, target: cst.Name) -> list[CSTNode]:
        """The reads that may refer to the assignment of `target`, as libcst's `Assignment.references`."""
        self.scopes  # records the reads
        return [
            node
            for node, (name, _) in self._recorder.reads.items()
            if name == target.value and any(getattr(a, "node", None) is target for a in self.referents(node))
        ]

    def __iter__(self) -> Iterator[CSTNode]:
        return iter(self.scopes)

    def __len__(self) -> int:
        return len(self.scopes)


class _ScopeRecorder:
    """One walk that records scopes and assignments the way libcst's ScopeVisitor does, and nothing else."""

    def __init__(self) -> None:
        self.scope_of: dict[CSTNode, Scope] = {}
        self.reads: dict[CSTNode, tuple[str, int]] = {}  # read node -> (name read, assignments in scope before it)
        self.import_names: set[int] = set()  # ids of the names in import statements (libcst's assignment nodes)
        self.aliases: set[str] = set()  # `y` of `import x as y` and `from m import x as y`
        # The first part of each name an import binds -> the first parts of what it stands for (`amp` -> {`apex`}
        # for `from apex import amp`; "" for a relative import, whose names libcst starts with a dot).
        self.imported: defaultdict[str, set[str]] = defaultdict(set)
        self.defined: set[str] = set()  # names of functions and classes; <locals> and <comprehension>
        self._pending_reads: list[tuple[cst.Name, cst.Attribute | None, int]] = []  # settled once scopes are known
        self._outermost_attribute: list[cst.Attribute | None] = [None]

    def record(self, module: cst.Module) -> dict[CSTNode, Scope]:
        self._visit(module, GlobalScope())
        for name, attribute, index in self._pending_reads:
            self._settle_read(name, attribute, index)
        return self.scope_of

    def _read(self, node: cst.Name, scope: Scope) -> None:
        self._pending_reads.append((node, self._outermost_attribute[-1], scope._assignment_count))

    def _settle_read(self, name: cst.Name, attribute: cst.Attribute | None, index: int) -> None:
        """As libcst's infer_accesses: `a.b.c` is read as its longest dotted prefix assigned in scope."""
        scope = self.scope_of[name]
        read_node, read_name = name, name.value
        if attribute is not None:
            for node in _dotted_prefixes(attribute):
                dotted = cst.helpers.get_full_name_for_node(node)
                if dotted is not None and dotted in scope:
                    read_node, read_name = node, dotted
                    break
        self.reads[read_node] = (read_name, index)

    def _visit(self, node: CSTNode | None, scope: Scope) -> None:
        if node is None or isinstance(node, cst.MaybeSentinel) or type(node) in TRIVIA:
            return
        self.scope_of[node] = scope
        special = _SPECIAL.get(type(node))
        if special is not None:
            special(self, node, scope)
        else:
            self._visit_children(node, scope)
        if type(node) in _ASSIGNMENT_LIKE:
            scope._assignment_count += 1  # the order that tells a read before an assignment from one after it

    def _visit_children(self, node: CSTNode, scope: Scope) -> None:
        for name, _ in child_fields(type(node)):
            value = getattr(node, name)
            if isinstance(value, CSTNode):
                self._visit(value, scope)
            elif isinstance(value, (tuple, list)):
                for child in value:
                    self._visit(child, scope)

    def _visit_all(self, nodes, scope: Scope) -> None:
        for node in nodes:
            self._visit(node, scope)

    def _bind(self, target: CSTNode, scope: Scope) -> None:
        """A store target: names in it are assigned; attributes and subscripts in it are read."""
        if isinstance(target, cst.Name):
            self.scope_of[target] = scope
            scope.record_assignment(target.value, target)
        elif isinstance(target, (cst.Tuple, cst.List)):
            self.scope_of[target] = scope
            for element in target.elements:
                self.scope_of[element] = scope
                self._bind(element.value, scope)
        elif isinstance(target, cst.StarredElement):
            self.scope_of[target] = scope
            self._bind(target.value, scope)
        else:
            self._visit(target, scope)

    def _import(self, node: cst.Import | cst.ImportFrom, scope: Scope) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            self.scope_of[alias] = scope
            self.import_names.add(id(alias.name))
            if alias.asname is not None:
                self.import_names.add(id(alias.asname.name))
                self.aliases.add(cst.helpers.get_full_name_for_node_or_raise(alias.asname.name))
            as_name = alias.asname.name if alias.asname is not None else alias.name
            dotted = cst.helpers.get_full_name_for_node_or_raise(as_name)
            parts = dotted.split(".")
            self.imported[parts[0]].add(_imported_root(node, alias))
            for end in range(len(parts), 0, -1):
                scope.record_import_assignment(".".join(parts[:end]), node, as_name)

    def _function(self, node: cst.FunctionDef, scope: Scope) -> None:
        scope.record_assignment(node.name.value, node)
        self.defined.add(node.name.value)
        self.scope_of[node.name] = scope
        outer = self._type_parameters(node, scope)
        inner = FunctionScope(outer, node, node.name.value)
        self._visit(node.params, inner)
        self._visit(node.body, inner)
        self._visit_all(node.decorators, outer)
        self._visit(node.returns, outer)

    def _type_parameters(self, node: cst.FunctionDef | cst.ClassDef, scope: Scope) -> Scope:
        if node.type_parameters is None:
            return scope
        annotation_scope = AnnotationScope(scope, node, None)
        self._visit(node.type_parameters, annotation_scope)
        return annotation_scope

    def _lambda(self, node: cst.Lambda, scope: Scope) -> None:
        inner = FunctionScope(scope, node)
        self.defined.add("<locals>")  # a lambda's locals are named so
        self._visit(node.params, inner)
        self._visit(node.body, inner)

    def _param(self, node: cst.Param, scope: Scope) -> None:
        scope.record_assignment(node.name.value, node)
        self.scope_of[node.name] = scope
        self._visit(node.default, scope.parent)
        self._visit(node.annotation, scope.parent)

    def _arg(self, node: cst.Arg, scope: Scope) -> None:
        self._visit(node.value, scope)

    def _class(self, node: cst.ClassDef, scope: Scope) -> None:
        scope.record_assignment(node.name.value, node)
        self.defined.add(node.name.value)
        self.scope_of[node.name] = scope
        self._visit_all(node.decorators, scope)
        outer = self._type_parameters(node, scope)
        self._visit_all(node.bases, outer)
        self._visit_all(node.keywords, outer)
        self._visit_all(node.body.body, ClassScope(outer, node, node.name.value))

    def _global(self, node: cst.Global, scope: Scope) -> None:
        for item in node.names:
            scope.record_global_overwrite(item.name.value)

    def _nonlocal(self, node: cst.Nonlocal, scope: Scope) -> None:
        for item in node.names:
            scope.record_nonlocal_overwrite(item.name.value)

    def _attribute(self, node: cst.Attribute, scope: Scope) -> None:
        outermost = self._outermost_attribute[-1] is None
        if outermost:
            self._outermost_attribute[-1] = node
        self._visit(node.value, scope)  # `.attr` is not a name in any scope
        if outermost:
            self._outermost_attribute[-1] = None

    def _call(self, node: cst.Call, scope: Scope) -> None:
        self._outermost_attribute.append(None)  # `f(a.b).c`: `a.b` is read on its own
        self._visit_children(node, scope)
        self._outermost_attribute.pop()

    def _assign(self, node: cst.Assign, scope: Scope) -> None:
        for target in node.targets:
            self.scope_of[target] = scope
            self._bind(target.target, scope)
        self._visit(node.value, scope)

    def _annotated_assign(self, node: cst.AnnAssign, scope: Scope) -> None:
        self._bind(node.target, scope)
        self._visit(node.annotation, scope)
        self._visit(node.value, scope)

    def _augmented_assign(self, node: cst.AugAssign, scope: Scope) -> None:
        self._bind(node.target, scope)
        self._visit(node.value, scope)

    def _for(self, node: cst.For, scope: Scope) -> None:
        self._bind(node.target, scope)
        scope._assignment_count += 1
        self._visit_all((node.iter, node.body, node.orelse), scope)

    def _comp_for(self, node: cst.CompFor, scope: Scope) -> None:
        self._bind(node.target, scope)
        self._visit(node.iter, scope)
        self._visit_all(node.ifs, scope)
        self._visit(node.inner_for_in, scope)

    def _comprehension(self, node, scope: Scope) -> None:
        # The first iterable is evaluated outside the comprehension's scope, everything else inside it.
        first = node.for_in
        self._visit(first.iter, scope)
        self.scope_of[first] = scope
        inner = ComprehensionScope(scope, node)
        self.defined.add("<comprehension>")
        self._bind(first.target, inner)
        inner._assignment_count += 1
        self._visit_all(first.ifs, inner)
        self._visit(first.inner_for_in, inner)
        elements = (node.key, node.value) if isinstance(node, cst.DictComp) else (node.elt,)
        self._visit_all(elements, inner)

    def _with_item(self, node: cst.WithItem, scope: Scope) -> None:
        self._visit(node.item, scope)
        if node.asname is not None:
            self._bind(node.asname.name, scope)
            scope._assignment_count += 1  # the AsName

    def _except(self, node: cst.ExceptHandler | cst.ExceptStarHandler, scope: Scope) -> None:
        self._visit(node.type, scope)
        if node.name is not None:
            self._bind(node.name.name, scope)
            scope._assignment_count += 1  # the AsName
        self._visit(node.body, scope)

    def _named_expr(self, node: cst.NamedExpr, scope: Scope) -> None:
        self._bind(node.target, scope)
        self._visit(node.value, scope)


# How the recorder visits each node type that is not just walked through (a class-level table: bound methods kept
# on the recorder would make it a reference cycle, and the cycle would keep the whole tree alive).
_SPECIAL: dict[type, Callable[[_ScopeRecorder, CSTNode, Scope], None]] = {
    cst.Import: _ScopeRecorder._import,
    cst.ImportFrom: _ScopeRecorder._import,
    cst.FunctionDef: _ScopeRecorder._function,
    cst.Lambda: _ScopeRecorder._lambda,
    cst.Param: _ScopeRecorder._param,
    cst.Arg: _ScopeRecorder._arg,
    cst.ClassDef: _ScopeRecorder._class,
    cst.Global: _ScopeRecorder._global,
    cst.Nonlocal: _ScopeRecorder._nonlocal,
    cst.Attribute: _ScopeRecorder._attribute,
    cst.Call: _ScopeRecorder._call,
    cst.Name: _ScopeRecorder._read,
    cst.Assign: _ScopeRecorder._assign,
    cst.AnnAssign: _ScopeRecorder._annotated_assign,
    cst.AugAssign: _ScopeRecorder._augmented_assign,
    cst.For: _ScopeRecorder._for,
    cst.CompFor: _ScopeRecorder._comp_for,
    cst.WithItem: _ScopeRecorder._with_item,
    cst.ExceptHandler: _ScopeRecorder._except,
    cst.ExceptStarHandler: _ScopeRecorder._except,
    cst.NamedExpr: _ScopeRecorder._named_expr,
    **{kind: _ScopeRecorder._comprehension for kind in _COMPREHENSIONS},
}
