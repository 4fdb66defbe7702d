"""Source positions at a fraction of the cost of libcst's PositionProvider, with the same answers.

libcst's provider generates the code of the whole module while counting lines and columns at every token and
building a CodeRange for every node: about three parse-and-codegen round trips on a real script, paid as soon as a
rule records its first finding. Here the same code generation only adds up character offsets (each node's start and
end, with libcst's own syntactic-position hooks), and an offset becomes a line and column when a rule asks for that
node (tests/test_engine.py compares the two on every rule example and sample).
"""

from __future__ import annotations

from bisect import bisect_right
from contextlib import contextmanager
from typing import Iterator, Mapping

import libcst as cst
from libcst import CSTNode
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import NEWLINE_RE


class Positions(Mapping[CSTNode, CodeRange]):
    """node -> the CodeRange PositionProvider gives it; the module's offsets are computed on first use."""

    def __init__(self, module: cst.Module):
        self._module = module
        self._spans: dict[CSTNode, tuple[int, int]] | None = None
        self._line_starts: list[int] = []

    def _computed(self) -> dict[CSTNode, tuple[int, int]]:
        if self._spans is None:
            state = _OffsetState(self._module.default_indent, self._module.default_newline)
            self._module._codegen(state)
            text = "".join(state.tokens)
            self._line_starts = [0, *(match.end() for match in NEWLINE_RE.finditer(text))]
            self._spans = state.spans
        return self._spans

    def _position(self, offset: int) -> CodePosition:
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: CSTNode) -> CodeRange:
        start, end = self._computed()[node]
        return CodeRange(self._position(start), self._position(end))

    def __iter__(self) -> Iterator[CSTNode]:
        return iter(self._computed())

    def __len__(self) -> int:
        return len(self._computed())


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
