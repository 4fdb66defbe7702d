"""Statement editing for rules (no rule lives here): plan `Edit`s on the original tree, apply them to the updated
statement lists when the walk leaves them, through `PortRule.replace` so that suppressions, unsafe fixes and
findings work as for any other rewrite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, Union

import libcst as cst

from rules.framework.types import Severity

Body = Union[cst.Module, cst.IndentedBlock]


def statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


@dataclass(frozen=True)
class Edit:
    """A change to a statement list, at an index of the original list.

    `insert_after` statements go after `index`, `insert_before` ones before it, and `wrap_until` makes the
    statements `index..wrap_until` the body of `wrapper(statements)`.
    """

    index: int
    message: str
    insert_before: tuple[cst.BaseStatement, ...] = ()
    insert_after: tuple[cst.BaseStatement, ...] = ()
    wrap_until: int | None = None
    wrapper: Callable[[Sequence[cst.BaseStatement]], cst.BaseStatement] | None = None
    imports: tuple[tuple[str, str | None], ...] = ()  # what the new code needs imported, as PortRule.replace takes
    severity: Severity = Severity.INFO  # of the finding that records the change


Apply = Callable[[Body, Body, Edit], Body]


def apply_edits(original: Body, updated: Body, edits: Sequence[Edit], record: Apply) -> Body:
    """Apply `edits` to `updated`, last index first, finding each original statement in it.

    `record(updated, new, edit)` keeps or refuses each change, as `PortRule.replace` does. An edit whose statements
    cannot be found for sure (another rule restructured the list around them) is dropped.
    """
    where = _align(original.body, updated.body)
    for edit in sorted(edits, key=lambda e: e.index, reverse=True):
        first = where[edit.index]
        last = where[edit.wrap_until] if edit.wrap_until is not None else first
        if first is None or last is None:
            continue
        body = list(updated.body)
        if edit.wrapper is not None:
            body[first : last + 1] = [edit.wrapper(body[first : last + 1])]
        body[first + 1 : first + 1] = edit.insert_after
        body[first:first] = edit.insert_before
        updated = record(updated, updated.with_changes(body=body), edit)
    return updated


def _align(original: Sequence[cst.BaseStatement], updated: Sequence[cst.BaseStatement]) -> list[int | None]:
    """For each original statement, its index in `updated`, when other rules only inserted statements there.

    An unchanged statement is found as an equal node no further than the number of insertions away; a changed one
    only when it is alone between two found ones.
    """
    extra = len(updated) - len(original)
    if extra == 0:
        return list(range(len(original)))
    where: list[int | None] = []
    start = 0
    for index, node in enumerate(original):
        window = range(start, min(index + extra, len(updated) - 1) + 1) if extra > 0 else range(0)
        found = next((k for k in window if updated[k] is node or updated[k].deep_equals(node)), None)
        where.append(found)
        start = found + 1 if found is not None else start
    for index, position in enumerate(where):
        if position is None:
            before = max((w for w in where[:index] if w is not None), default=-1)
            after = min((w for w in where[index + 1 :] if w is not None), default=len(updated))
            where[index] = before + 1 if after - before == 2 else None
    return where


class StatementEdits:
    """Mixin for rules that plan `Edit`s on the original tree and apply them when leaving each statement list."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._edits: dict[Body, list[Edit]] = {}

    def edit(self, block: Body, edit: Edit) -> None:
        self._edits.setdefault(block, []).append(edit)

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return self._apply(original_node, updated_node)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self._apply(original_node, updated_node)

    def _apply(self, original: Body, updated: Body) -> Body:
        edits = self._edits.get(original)
        if not edits:
            return updated

        def record(current: Body, new: Body, edit: Edit) -> Body:
            at = original.body[edit.index]
            return self.replace(  # type: ignore[attr-defined]
                original, current, new, edit.message, imports=edit.imports, severity=edit.severity, at=at
            )

        return apply_edits(original, updated, edits, record)
