"""How new code is laid out (no rule lives here): the line length a file keeps to, argument lists that grow in their
call's own layout, and the line breaks that keep the lines rules changed within that length.

`with_args` keeps a call's layout: a call laid out one argument a line stays so (same indentation, same trailing
comma); any other call keeps every line break and comment it has, and an added argument goes on its line with `, `.
A call is never joined onto one line. `reflow` then breaks each line the rules made that passes the limit, inside its
brackets: after a comma or before a comprehension's `for`, at the shallowest bracket where the line then fits, the
continuation indented as the bracket's other continuation lines, else aligned with its first element.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata.position_provider import NEWLINE_RE

from rules.framework.walk import walk_children

DEFAULT_LINE_LENGTH = 120
# PEP 8's limit: a file whose lines are all shorter says nothing of the width its author keeps to.
PEP8_LINE_LENGTH = 79


def source_lines(source: str) -> list[str]:
    """The lines of `source` as Python and libcst's positions count them (a form feed does not end a line)."""
    return NEWLINE_RE.split(source)


def line_limit(source: str, configured: int | None = None) -> int:
    """The line length new code keeps to: the project's configured one; else the file's longest line, where the file
    has one of PEP 8's 79 characters or more; else 120."""
    if configured:
        return configured
    longest = max(map(len, source_lines(source)), default=0)
    return longest if longest >= PEP8_LINE_LENGTH else DEFAULT_LINE_LENGTH


# ----- argument lists --------------------------------------------------------------------------------------------


def with_args(call: cst.Call, args: Iterable[cst.Arg]) -> cst.Call:
    """`call` with the arguments `args`, in the call's layout (see the module's docstring).

    An element of `args` that is, or carries the value of, one of `call.args` keeps the comma, line break and comment
    after it; the others are added.
    """
    args = list(args)
    if not args:
        return call.with_changes(args=[])
    old = list(call.args)
    origins = [next((was for was in old if was is arg or was.value is arg.value), None) for arg in args]
    exploded = one_per_line(call)
    laid_out = [_separated(arg, origin, old, exploded, call) for arg, origin in zip(args[:-1], origins[:-1])]
    laid_out.append(_closing(args[-1], origins[-1], old))
    return call.with_changes(args=laid_out)


def one_per_line(call: cst.Call) -> bool:
    """Every argument on a line of its own: the lines between them broken, and a single argument with a line break
    before and after it."""
    args = call.args
    if len(args) == 1:
        return _breaks(call.whitespace_before_args) and _breaks(_closing_whitespace(args[0]))
    return len(args) > 1 and all(_breaks(arg.comma.whitespace_after) for arg in args[:-1])  # type: ignore[union-attr]


def _breaks(whitespace: object) -> bool:
    return isinstance(whitespace, cst.ParenthesizedWhitespace)


def _closing_whitespace(arg: cst.Arg) -> cst.BaseParenthesizableWhitespace:
    """The whitespace between the last argument (and its trailing comma, if any) and the closing parenthesis."""
    return arg.comma.whitespace_after if isinstance(arg.comma, cst.Comma) else arg.whitespace_after_arg


def _separated(arg: cst.Arg, origin: cst.Arg | None, old: Sequence[cst.Arg], exploded: bool, call: cst.Call) -> cst.Arg:
    """`arg`, not the last, with the comma and whitespace that go after it."""
    if origin is not None and origin is not old[-1]:
        return arg.with_changes(comma=origin.comma, whitespace_after_arg=origin.whitespace_after_arg)
    line_break = _line_break(call)
    after: cst.BaseParenthesizableWhitespace = line_break if exploded and line_break else cst.SimpleWhitespace(" ")
    before = cst.SimpleWhitespace("")
    if origin is not None:  # the last argument no longer: a comment after it stays on its line
        closing = _closing_whitespace(origin)
        if isinstance(closing, cst.ParenthesizedWhitespace) and closing.first_line.comment is not None:
            after = (line_break or _bare(closing)).with_changes(first_line=closing.first_line)
        if isinstance(origin.comma, cst.Comma):
            before = origin.comma.whitespace_before
    return arg.with_changes(
        comma=cst.Comma(whitespace_before=before, whitespace_after=after), whitespace_after_arg=cst.SimpleWhitespace("")
    )


def _closing(arg: cst.Arg, origin: cst.Arg | None, old: Sequence[cst.Arg]) -> cst.Arg:
    """`arg`, the last, with the old last argument's trailing comma and closing whitespace (its comment left to it)."""
    if not old:
        return arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=cst.SimpleWhitespace(""))
    last = old[-1]
    if origin is last:
        return arg.with_changes(comma=last.comma, whitespace_after_arg=last.whitespace_after_arg)
    closing = _closing_whitespace(last)
    if isinstance(closing, cst.ParenthesizedWhitespace):
        closing = closing.with_changes(first_line=cst.TrailingWhitespace())
    if isinstance(last.comma, cst.Comma):
        comma = last.comma.with_changes(whitespace_after=closing)
        return arg.with_changes(comma=comma, whitespace_after_arg=last.whitespace_after_arg)
    return arg.with_changes(comma=cst.MaybeSentinel.DEFAULT, whitespace_after_arg=closing)


def _line_break(container: cst.CSTNode) -> cst.ParenthesizedWhitespace | None:
    """A new line indented as the container's last line break before one of its elements is, without a comment."""
    breaks = [whitespace for whitespace in _breaks_before_elements(container) if _breaks(whitespace)]
    last = breaks[-1] if breaks else None
    return _bare(last) if last is not None else None


def _breaks_before_elements(container: cst.CSTNode) -> list[object]:
    elements = _elements(container)
    opening = container.whitespace_before_args if isinstance(container, cst.Call) else _opening(container)
    return [opening, *(getattr(element.comma, "whitespace_after", None) for element in elements[:-1])]


def _opening(container: cst.CSTNode) -> object:
    bracket = getattr(container, "lbracket", None) or getattr(container, "lbrace", None)
    if bracket is None and getattr(container, "lpar", None):
        bracket = container.lpar[0]  # type: ignore[attr-defined]
    return getattr(bracket, "whitespace_after", None)


def _bare(whitespace: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    return whitespace.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())


# ----- line breaks for the lines rules made ------------------------------------------------------------------------

_SEQUENCES = (cst.List, cst.Set, cst.Dict, cst.Tuple)
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)
_BLOCKS = (cst.BaseCompoundStatement, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally, cst.MatchCase)
_BODIES = (cst.IndentedBlock, cst.SimpleStatementSuite, *_BLOCKS)


def reflow(original: cst.Module, source: str, ported: cst.Module, limit: int) -> cst.Module:
    """`ported` with line breaks in each statement the rules changed or added (in a compound statement's header
    only: its body's statements are statements of their own) whose new lines pass `limit`.

    A statement is changed unless it is one of `original`'s own nodes at its own indentation (the walk rebuilds only
    what changed; a statement moved into a new block is not), and a line is new unless `source` (the code of
    `original`) has the same line.
    """
    kept = dict(_indentations(original, "", original.default_indent))
    return _reflow_block(ported, "", _Reflow(kept, set(source_lines(source)), limit, ported.default_indent))


@dataclass(frozen=True)
class _Reflow:
    kept: dict[int, str]  # id of each of the original's statements -> its indentation
    old_lines: set[str]
    limit: int
    default_indent: str


def _indentations(block: cst.CSTNode, indent: str, default_indent: str) -> Iterator[tuple[int, str]]:
    """(id, indentation) of each statement in `block`, nested ones included."""
    for child in walk_children(block):
        if isinstance(child, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            yield id(child), indent
        if isinstance(child, cst.IndentedBlock):
            yield from _indentations(child, indent + _indent_of(child, default_indent), default_indent)
        elif isinstance(child, _BLOCKS):
            yield from _indentations(child, indent, default_indent)


def _indent_of(block: cst.IndentedBlock, default_indent: str) -> str:
    return block.indent if block.indent is not None else default_indent


def _reflow_block(block: cst.CSTNode, indent: str, reflow: _Reflow) -> cst.CSTNode:
    """`block` (a module, an indented block or a compound statement's clause) with its changed statements fitted."""
    changes: dict[int, cst.CSTNode] = {}
    for child in walk_children(block):
        if reflow.kept.get(id(child)) == indent:
            continue
        if isinstance(child, cst.SimpleStatementLine):
            new = _fitted(child, indent, reflow)
        elif isinstance(child, cst.IndentedBlock):
            new = _reflow_block(child, indent + _indent_of(child, reflow.default_indent), reflow)
        elif isinstance(child, cst.BaseCompoundStatement):
            new = _fitted(_reflow_block(child, indent, reflow), indent, reflow)
        elif isinstance(child, _BLOCKS):
            new = _reflow_block(child, indent, reflow)
        else:
            continue
        if new is not child:
            changes[id(child)] = new
    return _with_children(block, changes) if changes else block


def _with_children(node: cst.CSTNode, changes: dict[int, cst.CSTNode]) -> cst.CSTNode:
    """`node` with the children whose ids `changes` holds replaced (deep_replace would walk the whole subtree)."""
    fields = {}
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, cst.CSTNode) and id(value) in changes:
            fields[field.name] = changes[id(value)]
        elif isinstance(value, (list, tuple)) and any(id(item) in changes for item in value):
            fields[field.name] = [changes.get(id(item), item) for item in value]
    return node.with_changes(**fields)


def _fitted(statement: cst.CSTNode, indent: str, reflow: _Reflow) -> cst.CSTNode:
    """`statement` with a line break at the best place of each of its new lines (in its header, if compound) that
    passes the limit."""
    given_up: set[int] = set()
    while True:
        rendering = _Rendering.of(statement, indent, reflow.default_indent)
        line = next(
            (
                number
                for number, text in enumerate(rendering.lines)
                if len(text) > reflow.limit and text not in reflow.old_lines and number not in given_up
            ),
            None,
        )
        if line is None:
            return statement
        if _ends_with_new_comment(statement, rendering.lines[line], reflow):
            statement = _comment_above(statement)  # a comment of its own line rather than a broken statement
            continue
        place = rendering.best_break(line, reflow.limit)
        if place is None:
            given_up.add(line)
            continue
        moved = len(rendering.lines[line]) - place.column - 1  # what goes to the next line, less a space
        hanging = indent + reflow.default_indent * (2 if isinstance(statement, cst.BaseCompoundStatement) else 1)
        statement = statement.deep_replace(place.node, place.broken(indent, reflow, moved, hanging))


def _ends_with_new_comment(statement: cst.CSTNode, line: str, reflow: _Reflow) -> bool:
    """Whether `line` ends with the comment at the end of `statement`, and a rule wrote that comment (the source's own
    comments stay where their author put them)."""
    if not isinstance(statement, cst.SimpleStatementLine) or statement.trailing_whitespace.comment is None:
        return False
    comment = statement.trailing_whitespace.comment.value
    return line.endswith(comment) and not any(old.endswith(comment) for old in reflow.old_lines)


def _comment_above(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    """`statement` with the comment at the end of its line moved to a line of its own before it."""
    line_end = statement.trailing_whitespace
    comment = cst.EmptyLine(indent=True, comment=line_end.comment)
    return statement.with_changes(
        leading_lines=[*statement.leading_lines, comment],
        trailing_whitespace=line_end.with_changes(whitespace=cst.SimpleWhitespace(""), comment=None),
    )


@dataclass(frozen=True)
class _Place:
    """Where a line may break: after element `index` of `node` (a bracketed container), or before the `for` of
    `node` (a comprehension's CompFor); `column` is where the line would end, `align` where its first element starts."""

    node: cst.CSTNode
    index: int
    line: int
    column: int
    depth: int
    align: int
    container: cst.CSTNode

    def broken(self, indent: str, reflow: _Reflow, moved: int, hanging: str) -> cst.CSTNode:
        """`node` broken here. The new line takes the bracket's other continuation lines' indentation; else it is
        aligned with the first element, unless the `moved` characters would pass the limit there and a `hanging`
        indentation is shorter: then the bracket's first element goes on a new line too, as PEP 8's hanging indent."""
        node = self.node
        line_break = _line_break(self.container) if isinstance(self.container, (cst.Call, *_SEQUENCES)) else None
        if line_break is None:
            column = self.align if self.align - len(indent) > 0 else len(indent) + 2 * len(reflow.default_indent)
            hangs = column + moved > reflow.limit and len(hanging) < column and node is self.container
            line_break = _new_line(indent, len(hanging) if hangs else column)
            if hangs:
                node = _with_opening_break(node, line_break)
        if isinstance(node, cst.CompFor):
            return node.with_changes(whitespace_before=line_break)
        elements = list(_elements(node))
        element = elements[self.index]
        elements[self.index] = element.with_changes(comma=element.comma.with_changes(whitespace_after=line_break))
        field = "args" if isinstance(node, cst.Call) else "elements"
        return node.with_changes(**{field: elements})


def _new_line(indent: str, column: int) -> cst.ParenthesizedWhitespace:
    """A line break to `column`, in a statement indented by `indent`."""
    return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(" " * (column - len(indent))))


def _with_opening_break(container: cst.CSTNode, line_break: cst.ParenthesizedWhitespace) -> cst.CSTNode:
    """`container` (a call or a bracketed sequence) with `line_break` before its first element."""
    if isinstance(container, cst.Call):
        return container.with_changes(whitespace_before_args=line_break)
    for field in ("lbracket", "lbrace"):
        bracket = getattr(container, field, None)
        if bracket is not None:
            return container.with_changes(**{field: bracket.with_changes(whitespace_after=line_break)})
    lpar = list(container.lpar)  # type: ignore[attr-defined]  # a tuple, parenthesized (see _candidates)
    lpar[0] = lpar[0].with_changes(whitespace_after=line_break)
    return container.with_changes(lpar=lpar)


def _elements(container: cst.CSTNode) -> Sequence[cst.CSTNode]:
    return container.args if isinstance(container, cst.Call) else getattr(container, "elements", ())


class _Rendering(CodegenState):
    """A statement's code in place (a compound statement's up to its body), with the places its lines may break."""

    class Body(Exception):
        """The code generation reached a compound statement's body."""

    def __init__(self, default_indent: str, candidates: dict[int, tuple[cst.CSTNode, int, cst.CSTNode]]):
        super().__init__(default_indent, "\n")
        self._candidates = candidates  # id(comma or CompFor) -> (node to rebuild, element index, container)
        self._open: list[tuple[cst.CSTNode, int]] = []  # containers entered: (container, column of its first element)
        self._firsts: dict[int, cst.CSTNode] = {}
        self._offset = 0
        self._line = 0
        self._line_start = 0
        self.places: list[_Place] = []
        self.lines: list[str] = []

    @classmethod
    def of(cls, statement: cst.CSTNode, indent: str, default_indent: str) -> _Rendering:
        rendering = cls(default_indent, dict(_candidates(statement)))
        rendering.indent_tokens = [indent]
        try:
            statement._codegen(rendering)
        except _Rendering.Body:
            pass
        rendering.lines = "".join(rendering.tokens).split("\n")
        return rendering

    def add_token(self, value: str) -> None:
        super().add_token(value)
        self._advance(value)

    def add_indent_tokens(self) -> None:
        super().add_indent_tokens()
        self._advance("".join(self.indent_tokens))

    def _advance(self, text: str) -> None:
        newline = text.rfind("\n")
        if newline >= 0:
            self._line += text.count("\n")
            self._line_start = self._offset + newline + 1
        self._offset += len(text)

    def before_codegen(self, node: cst.CSTNode) -> None:
        if isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            raise _Rendering.Body
        container = self._firsts.pop(id(node), None)
        if container is not None:  # its first element: where its continuation lines align
            self._open = [(c, self._column() if c is container else align) for c, align in self._open]
        if isinstance(node, (cst.Call, *_SEQUENCES, *_COMPREHENSIONS)):
            elements = _elements(node)
            first = elements[0] if elements else getattr(node, "elt", None) or getattr(node, "key", None)
            self._open.append((node, -1))
            if first is not None:
                self._firsts[id(first)] = node
        if isinstance(node, cst.CompFor):
            self._place(node, self._column())  # the line would end before the whitespace before `for`

    def after_codegen(self, node: cst.CSTNode) -> None:
        if self._open and self._open[-1][0] is node:
            self._open.pop()
        if isinstance(node, cst.Comma):  # the line would end after the comma, before the whitespace after it
            self._place(node, self._column() - len(getattr(node.whitespace_after, "value", "")))

    def _column(self) -> int:
        return self._offset - self._line_start

    def _place(self, node: cst.CSTNode, column: int) -> None:
        candidate = self._candidates.get(id(node))
        if candidate is None:
            return
        owner, index, container = candidate
        align = next((align for open_, align in self._open if open_ is container), -1)
        self.places.append(_Place(owner, index, self._line, column, len(self._open), align, container))

    def best_break(self, line: int, limit: int) -> _Place | None:
        """At the shallowest bracket with a place on `line` where that line then fits, the rightmost such place;
        else the leftmost place of the shallowest bracket (the line gets shorter, if not short enough)."""
        places = [place for place in self.places if place.line == line and place.align > 0]
        if not places:
            return None
        fitting = [place for place in places if place.column <= limit]
        if fitting:
            depth = min(place.depth for place in fitting)
            return max((place for place in fitting if place.depth == depth), key=lambda place: place.column)
        depth = min(place.depth for place in places)
        return min((place for place in places if place.depth == depth), key=lambda place: place.column)


def _candidates(statement: cst.CSTNode) -> Iterator[tuple[int, tuple[cst.CSTNode, int, cst.CSTNode]]]:
    """(id of a comma or CompFor, (the node to rebuild, element index, the bracketed container)) for each place the
    statement's lines may break: after a non-last element's comma not followed by a line break already, and before
    a comprehension's first `for`. A tuple without parentheses is no bracket; a compound statement's body is left
    out."""
    pending = [statement]
    while pending:
        node = pending.pop()
        pending.extend(child for child in walk_children(node) if not isinstance(child, _BODIES))
        if isinstance(node, cst.Tuple) and not node.lpar:
            continue
        if isinstance(node, (cst.Call, *_SEQUENCES)):
            for index, element in enumerate(_elements(node)[:-1]):
                comma = element.comma
                if isinstance(comma, cst.Comma) and not _breaks(comma.whitespace_after):
                    yield id(comma), (node, index, node)
        elif isinstance(node, _COMPREHENSIONS) and not _breaks(node.for_in.whitespace_before):
            yield id(node.for_in), (node.for_in, 0, node)
