"""Source positions at a fraction of the cost of libcst's PositionProvider, with the same answers.

libcst's provider generates the code of the whole module while counting lines and columns at every token and
building a CodeRange for every node: about three parse-and-codegen round trips on a real script, paid as soon as a
rule records its first finding. Here the module's statements are generated in order only as far as the statement a
rule asks about: the ones before it as plain text, that one recording where each node's tokens start and end (a
statement passed as plain text is generated again with its spans only if a rule asks about it later). A token index
becomes a character offset, and an offset a line and column, only for the nodes asked about (tests/test_engine.py
compares the two on every rule example and sample). The statements' text is kept, and the ported module's code
reuses it for every statement no rule changed.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from typing import Iterator, Mapping

import libcst as cst
from libcst import CSTNode
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import NEWLINE_RE

from rules.framework.tree import enclosing_statement


class Positions(Mapping[CSTNode, CodeRange]):
    """node -> the CodeRange PositionProvider gives it; the module's code is generated as far as rules ask."""

    def __init__(self, module: cst.Module):
        self._module = module
        self._generated = 0  # how many of module.body's statements have been generated
        self._texts: dict[CSTNode, str] = {}  # generated statement -> its code
        self._starts: dict[CSTNode, int] = {}  # generated statement -> the character offset its code starts at
        self._length = 0  # characters generated so far
        self._line_starts: list[int] = [0]
        self._spans: dict[CSTNode, tuple[_SpanState, list[int]]] = {}  # statement -> its spans, their offsets
        self._whole: _SpanState | None = None  # the whole module's spans, for nodes outside its statements
        self._char_at: list[int] = []  # token index of the whole module's -> character offset

    def __getitem__(self, node: CSTNode) -> CodeRange:
        if self._whole is None:
            statement = enclosing_statement(self._module, node)
            if statement is not None:
                self._generate_through(statement)
                spans, char_at = self._statement_spans(statement)
                return self._range(spans.spans[id(node)], char_at)
        return self._range(self._whole_spans()[id(node)], self._char_at)

    def __iter__(self) -> Iterator[CSTNode]:
        return iter(self._whole_nodes())

    def __len__(self) -> int:
        return len(self._whole_nodes())

    def code(self, module: cst.Module) -> str:
        """`module.code`, where `module` is the ported module: its statements that are the original's and whose
        code is already known are not generated again."""
        same_layout = (module.default_indent, module.default_newline) == (
            self._module.default_indent,
            self._module.default_newline,
        )
        state = _PlainState(module.default_indent, module.default_newline)
        if not self._texts or not same_layout or not module.has_trailing_newline:
            module._codegen(state)  # Module.code, with the cheaper state
            return "".join(state.tokens)
        # Module._codegen_impl, with the kept text of each statement known.
        for line in module.header:
            line._codegen(state)
        for statement in module.body:
            text = self._texts.get(statement)
            if text is None:
                statement._codegen(state)
            else:
                state.tokens.append(text)
        for line in module.footer:
            line._codegen(state)
        return "".join(state.tokens) or module.default_newline

    def _generate_through(self, statement: CSTNode) -> None:
        """Generate the module's code on from where it stopped, up to and including `statement`: the statements
        before it as plain text, `statement` itself with its nodes' spans."""
        if statement in self._texts:
            return
        if self._generated == 0:
            state = _PlainState(self._module.default_indent, self._module.default_newline)
            for line in self._module.header:
                line._codegen(state)
            self._account("".join(state.tokens))
        body = self._module.body
        while self._generated < len(body):
            generated = body[self._generated]
            self._starts[generated] = self._length
            if generated is statement:
                text = "".join(self._statement_spans(generated)[0].tokens)
            else:
                state = _PlainState(self._module.default_indent, self._module.default_newline)
                generated._codegen(state)
                text = "".join(state.tokens)
            self._texts[generated] = self._account(text)
            self._generated += 1
            if generated is statement:
                return

    def _account(self, text: str) -> str:
        """Extend the line starts over `text`, the code generated next."""
        start = self._length
        self._line_starts.extend(start + match.end() for match in NEWLINE_RE.finditer(text))
        self._length += len(text)
        return text

    def _statement_spans(self, statement: CSTNode) -> tuple[_SpanState, list[int]]:
        """The token spans of the nodes of a top-level statement, and each token's character offset: a statement at
        the top level is generated alone as it is within the module (no indentation to carry over)."""
        found = self._spans.get(statement)
        if found is None:
            spans = _SpanState(self._module.default_indent, self._module.default_newline)
            statement._codegen(spans)
            char_at = list(accumulate(map(len, spans.tokens), initial=self._starts[statement]))
            found = self._spans[statement] = (spans, char_at)
        return found

    def _whole_spans(self) -> dict[int, tuple[int, int]]:
        if self._whole is None:
            whole = _SpanState(self._module.default_indent, self._module.default_newline)
            self._module._codegen(whole)
            self._char_at = list(accumulate(map(len, whole.tokens), initial=0))
            text = "".join(whole.tokens)
            self._line_starts = [0, *(match.end() for match in NEWLINE_RE.finditer(text))]
            self._whole = whole
        return self._whole.spans

    def _whole_nodes(self) -> list[CSTNode]:
        self._whole_spans()
        assert self._whole is not None
        return list(self._whole.nodes.values())

    def _range(self, span: tuple[int, int], char_at: list[int]) -> CodeRange:
        return CodeRange(self._position(char_at[span[0]]), self._position(char_at[span[1]]))

    def _position(self, offset: int) -> CodePosition:
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])


def excerpt(module: cst.Module, node: CSTNode, limit: int = 200) -> str:
    """`module.code_for_node(node)`, stripped and cut to `limit` characters (the last an ellipsis), generating no
    more of a long node than that takes: findings quote what they point at, and that can be a whole function."""
    state = _ExcerptState(module.default_indent, module.default_newline, limit)
    try:
        node._codegen(state)
    except _ExcerptState.Enough:
        pass
    code = "".join(state.tokens).strip()
    return code if len(code) <= limit else code[: limit - 1] + "…"


class _PlainState(CodegenState):
    """libcst's code generation, with a no-op syntactic-position context that costs one call instead of a
    generator's several (libcst enters one for most statements and expressions)."""

    def record_syntactic_position(
        self, node: CSTNode, *, start_node: CSTNode | None = None, end_node: CSTNode | None = None
    ) -> _NoPosition:
        return _NO_POSITION


class _NoPosition:
    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc_info: object) -> None:
        pass


_NO_POSITION = _NoPosition()


class _ExcerptState(_PlainState):
    """Stops the code generation once the text, without its leading whitespace, is longer than `limit`."""

    class Enough(Exception):
        pass

    def __init__(self, default_indent: str, default_newline: str, limit: int):
        super().__init__(default_indent, default_newline)
        self._limit = limit
        self._length = 0

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._length += len(value)
        if self._length > self._limit and len("".join(self.tokens).strip()) > self._limit:
            raise self.Enough


class _SpanState(CodegenState):
    """libcst's code generation, recording the tokens each node spans as PositionProvider's state records its lines
    and columns: a syntactic position recorded inside a node wins over the whole node's. Spans are token indexes
    keyed by id(node) (the module keeps the nodes alive): the hooks run at every node, so they stay this small."""

    def __init__(self, default_indent: str, default_newline: str):
        super().__init__(default_indent, default_newline)
        self.spans: dict[int, tuple[int, int]] = {}
        self.nodes: dict[int, CSTNode] = {}
        self._starts: list[int] = []

    def pop_trailing_newline(self) -> None:
        """Kept: the text only serves to find the line starts, and positions count the newline as libcst does."""

    def before_codegen(self, node: CSTNode) -> None:
        self._starts.append(len(self.tokens))

    def after_codegen(self, node: CSTNode) -> None:
        self.spans.setdefault(id(node), (self._starts.pop(), len(self.tokens)))
        self.nodes[id(node)] = node  # keeps the nodes libcst makes while generating alive: their ids stay theirs

    def record_syntactic_position(
        self, node: CSTNode, *, start_node: CSTNode | None = None, end_node: CSTNode | None = None
    ) -> _SyntacticPosition:
        return _SyntacticPosition(self, node, start_node, end_node)


class _SyntacticPosition:
    """The span of the tokens generated inside `with state.record_syntactic_position(node)` (a class, as
    _NoPosition)."""

    __slots__ = ("_state", "_node", "_start_node", "_end_node", "_start")

    def __init__(self, state: _SpanState, node: CSTNode, start_node: CSTNode | None, end_node: CSTNode | None):
        self._state, self._node, self._start_node, self._end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self._start = len(self._state.tokens)

    def __exit__(self, *exc_info: object) -> None:
        spans = self._state.spans
        start = self._start if self._start_node is None else spans[id(self._start_node)][0]
        end = len(self._state.tokens) if self._end_node is None else spans[id(self._end_node)][1]
        spans[id(self._node)] = (start, end)
