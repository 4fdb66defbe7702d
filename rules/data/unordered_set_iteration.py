from __future__ import annotations

import re

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Severity, Unchanged, matches
from rules.data._loaders import assigned_calls, source

_SET = ("builtins.set", "builtins.frozenset")
_SET_METHODS = {"union", "intersection", "difference", "symmetric_difference", "copy"}
_SET_OPERATORS = m.BitOr() | m.BitAnd() | m.Subtract() | m.BitXor()
# Consumers that do not depend on the order of what they are given.
_ORDER_FREE = {f"builtins.{name}" for name in ("sorted", "len", "set", "frozenset", "sum", "min", "max", "any", "all")}
# Names whose elements are strings (or paths, which sort as well): their order in a set follows the hash seed.
_STRINGS = re.compile(r"file|path|name|dir|folder|url|key|class|label|categor|word|token|vocab|shard|split", re.I)


class UnorderedSetIteration(PortRule):
    """Sort sets of file names, paths or keys before turning them into an ordered list; report other set iteration.

    ## What it does
    Where the names involved say the elements are strings or paths (files, paths, names, dirs, urls, keys, classes,
    labels, words, tokens, shards...), rewrites `list(S)` to `sorted(S)` and reports `tuple(S)`, `for x in S` and
    comprehensions over `S` or `enumerate(S)`, where `S` is `set(...)`, `frozenset(...)` or a union, difference or
    intersection of them. A set handed to an order-free consumer (`sorted`, `len`, `sum`, `min`, `max`, `any`,
    `all`, another set) is left alone, as are sets of other elements.

    ## Why
    A set iterates in hash order, and the hash of a string is salted per process unless PYTHONHASHSEED is fixed.
    `list(set(files))`, or class indices built from `enumerate(set(labels))`, then differ between ranks of one run
    and between the GPU run and the NPU run, so the two trainings read different data or labels (checklist C7).

    ## Safety
    Safe: the replaced order was arbitrary and different in every process, so the sorted order is as correct and
    the same everywhere. Sort in the original script too. Names that do not say strings are left alone, since
    `sorted` fails on elements that cannot be compared.

    ## References
    Python data model, `object.__hash__` (the PYTHONHASHSEED note):
    <https://docs.python.org/3/reference/datamodel.html#object.__hash__>.
    """

    CODE = "DATA007"
    CHECKLIST = ("C7",)
    TRIGGERS = ("set(",)
    EXAMPLES = (
        Case(
            """
            files = list(set(os.listdir(root)))  # unique
            keep = list(set(all_paths) - set(bad_paths))
            classes = sorted(list(set(labels)))
            """,
            """
            files = sorted(set(os.listdir(root)))  # unique
            keep = sorted(set(all_paths) - set(bad_paths))
            classes = sorted(list(set(labels)))
            """,
            lines=[1, 2],
        ),
        Flag(
            """
            for path in set(paths):
                samples.append(load(path))
            class_to_idx = {name: i for i, name in enumerate(set(class_names))}
            shards = tuple(frozenset(urls))
            """,
            lines=[1, 3, 4],
        ),
        Unchanged(
            """
            count = len(set(files))
            ids = list(set(indices))
            names = {name.lower() for name in set(file_names)}
            total = sum(size for size in set(file_sizes))
            """
        ),
        Unchanged(
            """
            def main(set):
                files = list(set(paths))  # not the builtin
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._order_free: set[cst.CSTNode] = set()  # expressions consumed without regard to order
        self._assigned_to: dict[cst.Call, str] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        self._assigned_to.update(assigned_calls(node))

    def visit_Call(self, node: cst.Call) -> None:
        if self.refers_to(node.func, *_ORDER_FREE):
            self._order_free.update(arg.value for arg in node.args)
        elif self.refers_to(node.func, "builtins.tuple") and self._orders_strings(node):
            self._report_iteration(node, "tuple(...) of a set")

    def visit_For(self, node: cst.For) -> None:
        self._check_iteration(node.iter, node.target, "a for loop over a set")

    def visit_ListComp(self, node: cst.ListComp) -> None:
        self._check_comprehension(node)

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
        self._check_comprehension(node)

    def visit_DictComp(self, node: cst.DictComp) -> None:
        self._check_comprehension(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.refers_to(original_node.func, "builtins.list") or not self._orders_strings(original_node):
            return updated_node
        return self.replace(
            original_node,
            updated_node,
            updated_node.with_changes(func=cst.Name("sorted")),
            "sorted the set instead of listing it: a set of strings iterates in an order that changes per process",
            "Sort it in the original script too, so both sides see one order.",
        )

    def _check_comprehension(self, node: cst.ListComp | cst.GeneratorExp | cst.DictComp) -> None:
        if node in self._order_free:
            return
        loop: cst.CompFor | None = node.for_in
        while loop is not None:
            self._check_iteration(loop.iter, loop.target, "a comprehension over a set")
            loop = loop.inner_for_in

    def _check_iteration(self, iterable: cst.BaseExpression, target: cst.BaseExpression, what: str) -> None:
        if matches(iterable, m.Call(func=m.Name("enumerate"), args=[m.AtLeastN(n=1)])):
            iterable = iterable.args[0].value  # type: ignore[attr-defined]
        if self._is_set(iterable) and _holds_strings(iterable, source(target)):
            self._report_iteration(iterable, what)

    def _report_iteration(self, node: cst.CSTNode, what: str) -> None:
        self.report(
            node,
            f"{what}: a set of strings iterates in an order that changes per process (hash seed), "
            "so ranks and machines see different orders",
            "Iterate sorted(...) of the set, or drop duplicates with list(dict.fromkeys(items)), which keeps order.",
            Severity.WARNING,
        )

    def _orders_strings(self, call: cst.Call) -> bool:
        """`list(S)` / `tuple(S)`, whose order is used, where S is a set of what its names say are strings."""
        if call in self._order_free or len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            return False
        listed = call.args[0].value
        return self._is_set(listed) and _holds_strings(listed, self._assigned_to.get(call, ""))

    def _is_set(self, node: cst.BaseExpression) -> bool:
        """`set(...)`, `frozenset(...)`, `a.union(...)` of one, or `|`, `&`, `-`, `^` with one as an operand."""
        if isinstance(node, cst.BinaryOperation) and matches(node.operator, _SET_OPERATORS):
            return self._is_set(node.left) or self._is_set(node.right)
        if not isinstance(node, cst.Call):
            return False
        if isinstance(node.func, cst.Attribute) and node.func.attr.value in _SET_METHODS:
            return self._is_set(node.func.value)
        return self.refers_to(node.func, *_SET)


def _holds_strings(the_set: cst.BaseExpression, context: str) -> bool:
    """The set's source, or the name its elements or its list go to, says strings or paths."""
    return bool(_STRINGS.search(source(the_set) + " " + context))
