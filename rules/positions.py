"""Source positions at a fraction of the cost of libcst's PositionProvider, with the same answers.

libcst's provider generates the code of the whole module while counting lines and columns at every token and
building a CodeRange for every node: about three parse-and-codegen round trips on a real script, paid as soon as a
rule records its first finding. Here the module's top-level statements are generated once as plain text, which gives
where each one starts; a node's position is then found by generating only its own statement again while adding up
character offsets (with libcst's own syntactic-position hooks), and an offset becomes a line and column when asked
(tests/test_engine.py compares the two on every rule example and sample). The statements' text is kept, and the
ported module's code reuses it for every statement no rule changed.
"""

from __future__ import annotations

from bisect import bisect_right
from contextlib import contextmanager
from itertools import accumulate
from typing import Iterator, Mapping

import libcst as cst
from libcst import CSTNode
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import NEWLINE_RE

from rules.tree import enclosing_statement


class Positions(Mapping[CSTNode, CodeRange]):
    """node -> the CodeRange PositionProvider gives it, computed statement by statement as rules ask."""

    def __init__(self, module: cst.Module):
        self._module = module
        self._spans: dict[CSTNode, tuple[int, int]] = {}  # node -> (start, end) character offsets
        self._texts: dict[CSTNode, str] | None = None  # top-level statement -> its code, once laid out
        self._starts: dict[CSTNode, int] = {}  # top-level statement -> its offset in the module's code
        self._spanned: set[CSTNode] = set()  # statements whose nodes' spans are in _spans
        self._whole = False  # every node's span is in _spans
        self._length = 0
        self._line_starts: list[int] = []

    def __getitem__(self, node: CSTNode) -> CodeRange:
        span = self._spans.get(node)
        if span is None:
            span = self._span(node)
        start, end = span
        return CodeRange(self._position(start), self._position(end))

    def __iter__(self) -> Iterator[CSTNode]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def code(self, module: cst.Module) -> str:
        """`module.code`, where `module` is the ported module: its statements that are the original's are not
        generated again."""
        texts = self._texts
        same_layout = (module.default_indent, module.default_newline) == (
            self._module.default_indent,
            self._module.default_newline,
        )
        if not texts or not same_layout or not module.has_trailing_newline:
            return module.code
        state = CodegenState(module.default_indent, module.default_newline)
        # Module._codegen_impl, with the kept text of each unchanged statement.
        for line in module.header:
            line._codegen(state)
        for statement in module.body:
            text = texts.get(statement)
            if text is None:
                statement._codegen(state)
            else:
                state.tokens.append(text)
        for line in module.footer:
            line._codegen(state)
        return "".join(state.tokens) or module.default_newline

    def _span(self, node: CSTNode) -> tuple[int, int]:
        if self._lay_out():
            if node is self._module:
                return (0, self._length)
            statement = enclosing_statement(self._module, node)
            if statement is not None and statement not in self._spanned:
                self._spanned.add(statement)
                self._spans.update(_offsets(statement, self._module, self._starts[statement]))
                span = self._spans.get(node)
                if span is not None:
                    return span
        return self._all()[node]  # whitespace, punctuation, comments, the header and the footer

    def _lay_out(self) -> bool:
        """Generate each top-level statement's code once; False where that would not add up to the module's code."""
        if self._texts is None:
            module = self._module
            self._texts = {}
            if not module.has_trailing_newline or not module.body:  # Module.code adds or drops a newline there
                return False
            header = "".join(module.code_for_node(line) for line in module.header)
            self._texts = {statement: module.code_for_node(statement) for statement in module.body}
            footer = "".join(module.code_for_node(line) for line in module.footer)
            texts = list(self._texts.values())
            starts = accumulate(map(len, texts), initial=len(header))
            self._starts = dict(zip(module.body, starts))
            text = "".join([header, *texts, footer])
            self._length = len(text)
            self._line_starts = [0, *(match.end() for match in NEWLINE_RE.finditer(text))]
        return bool(self._texts)

    def _all(self) -> dict[CSTNode, tuple[int, int]]:
        if not self._whole:
            state = _OffsetState(self._module.default_indent, self._module.default_newline)
            self._module._codegen(state)
            text = "".join(state.tokens)
            self._line_starts = [0, *(match.end() for match in NEWLINE_RE.finditer(text))]
            self._spans = state.spans
            self._whole = True
        return self._spans

    def _position(self, offset: int) -> CodePosition:
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])


def _offsets(statement: CSTNode, module: cst.Module, start: int) -> dict[CSTNode, tuple[int, int]]:
    """The spans of `statement` and the nodes in it, for a top-level statement that starts at offset `start`."""
    state = _OffsetState(module.default_indent, module.default_newline)
    state.offset = start
    statement._codegen(state)
    return state.spans


class _OffsetState(CodegenState):
    """libcst's code generation, recording each node's (start, end) character offsets as PositionProvider's state
    records its lines and columns: a syntactic position recorded inside a node wins over the whole node's."""

    def __init__(self, default_indent: str, default_newline: str):
        super().__init__(default_indent, default_newline)
        self.offset = 0
        self.spans: dict[CSTNode, tuple[int, int]] = {}
        self._starts: list[int] = []

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        self.offset += sum(map(len, self.indent_tokens))

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def pop_trailing_newline(self) -> None:
        """Kept: the text only serves to find the line starts, and positions count the newline as libcst does."""

    def before_codegen(self, node: CSTNode) -> None:
        self._starts.append(self.offset)

    def after_codegen(self, node: CSTNode) -> None:
        start = self._starts.pop()
        if node not in self.spans:
            self.spans[node] = (start, self.offset)

    @contextmanager
    def record_syntactic_position(
        self, node: CSTNode, *, start_node: CSTNode | None = None, end_node: CSTNode | None = None
    ) -> Iterator[None]:
        start = self.offset
        try:
            yield
        finally:
            end = self.offset
            if start_node is not None:
                start = self.spans[start_node][0]
            if end_node is not None:
                end = self.spans[end_node][1]
            self.spans[node] = (start, end)
