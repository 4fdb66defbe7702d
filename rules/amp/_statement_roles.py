"""What each statement of a training iteration does, as far as the autocast block is concerned (no rule lives here).

The autocast block AMP101 inserts holds the forward and the loss and nothing else: a reader of the port sees at a
glance what runs in mixed precision. Data loading (`next(batches)` and its StopIteration handling), device moves,
logging and control flow stay outside it. Each statement between the first and the last one the loss needs gets a
role:

- FORWARD: it runs the model or the loss (a call that is none of the calls below);
- OUTSIDE: it loads data, moves it to the device, logs, or leaves the loop, and runs nothing: the block is split
  around it (a statement the loss does not need also counts when it reads a host value, `loss.item()`, for a
  metric);
- MIXED: a compound statement (`for`, `if`, `try`, ...) that the loss needs and that both runs the forward and does
  one of those: the block would have to wrap them too, and splitting them apart would move code;
- NEUTRAL: the rest (tensor factories, fills, re-typing, `optimizer.zero_grad()`, counters), which may sit inside
  a block but never starts one.
"""

from __future__ import annotations

import enum
from typing import Iterator

import libcst as cst
import libcst.matchers as m

from rules import Body, dotted_name, findall, method

# Calls that put data on a device.
DEVICE_MOVES = frozenset({"to", "cuda", "npu", "cpu"})
# Calls that re-type, fill or describe a tensor, tidy the gradients, or collect values in a python list: no model or
# loss runs in them (`returns.insert(0, R)`; `losses.append(criterion(out, y))` runs the criterion).
_HOUSEKEEPING = frozenset(
    {"float", "long", "int", "half", "double", "bool", "contiguous", "fill_", "zero_", "size", "dim", "numel",
     "keys", "values", "items", "parameters", "zero_grad", "append", "extend", "insert"}
)
_FACTORIES = frozenset(
    {"tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "eye", "arange", "linspace", "rand",
     "randn", "randint", "randperm", "normal", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like"}
)
_FETCHES = frozenset({"next", "iter"})
# Builtins that count or shape python values.
_BOOKKEEPING = frozenset(
    {"len", "range", "enumerate", "zip", "isinstance", "int", "float", "str", "list", "tuple", "dict", "set",
     "sorted", "reversed", "round", "getattr", "hasattr", "time.time", "time.perf_counter"}
)
_LOG_METHODS = frozenset(
    {"info", "debug", "warning", "log", "add_scalar", "add_scalars", "add_histogram", "set_postfix",
     "set_description"}
)
_HOST_VALUES = frozenset({"item", "tolist"})  # a value read back for a metric or a log line
_EXITS = m.Break() | m.Continue() | m.Return() | m.Raise()


class Role(enum.Enum):
    FORWARD = "forward"
    OUTSIDE = "outside"
    MIXED = "mixed"
    NEUTRAL = "neutral"


class _Does(enum.Flag):
    """What one statement line does."""

    NOTHING = 0
    RUNS = enum.auto()
    MOVES = enum.auto()
    FETCHES = enum.auto()
    LOGS = enum.auto()
    EXITS = enum.auto()
    READS_HOST = enum.auto()


_KEPT_OUT = _Does.MOVES | _Does.FETCHES | _Does.LOGS | _Does.EXITS


def runs_model(node: cst.CSTNode) -> bool:
    """Whether `node` calls something that may run a model or a loss."""
    return any(_call_does(call) is _Does.RUNS for call in findall(node, m.Call()))  # type: ignore[arg-type]


def role(statement: cst.BaseStatement, needed: bool) -> Role:
    """The role of `statement`; `needed`: the loss depends on what it computes."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return Role.NEUTRAL
    lines = _lines_does(statement)
    everything = _union(lines) | _header_does(statement)
    if not needed:
        return Role.OUTSIDE if everything & (_KEPT_OUT | _Does.READS_HOST) else Role.NEUTRAL
    if not any(_Does.RUNS in line for line in lines):
        return Role.OUTSIDE if everything & _KEPT_OUT else Role.NEUTRAL
    return Role.MIXED if _kept_out_beside_forward(statement, lines) else Role.FORWARD


def kept_out(statement: cst.BaseStatement) -> str:
    """What a MIXED `statement` does beside its forward, in words: "loads data and logs"."""
    found = _kept_out_beside_forward(statement, _lines_does(statement))
    return " and ".join(words for flag, words in _KEPT_OUT_WORDS.items() if flag in found)


_KEPT_OUT_WORDS = {
    _Does.FETCHES: "loads data",
    _Does.MOVES: "moves data to the device",
    _Does.LOGS: "logs",
    _Does.EXITS: "leaves the loop",
}


def _lines_does(statement: cst.BaseStatement) -> list[_Does]:
    if isinstance(statement, cst.SimpleStatementLine):
        return [_line_does(statement)]
    return [_line_does(line) for line in findall(statement, m.SimpleStatementLine())]  # type: ignore[arg-type]


def _kept_out_beside_forward(statement: cst.BaseStatement, lines: list[_Does]) -> _Does:
    """The kept-out things a statement does in its header (loading, logging) or in lines that run nothing."""
    found = _header_does(statement) & (_Does.FETCHES | _Does.LOGS)
    return found | _union(line & _KEPT_OUT for line in lines if _Does.RUNS not in line)


def forward_pieces(block: Body, first: int, last: int, needed: set[cst.BaseStatement]) -> Iterator[tuple[int, int]]:
    """The (first, last) spans of `block.body[first..last]` to run under autocast: split around each OUTSIDE
    statement, each from its first FORWARD statement to its last one the loss needs. The caller checks for MIXED."""
    start = end = None
    for index in range(first, last + 1):
        statement = block.body[index]
        current = role(statement, statement in needed)
        if current is Role.OUTSIDE:
            if start is not None:
                yield start, end  # type: ignore[misc]
            start = end = None
        elif current is Role.FORWARD or (start is not None and statement in needed):
            start = index if start is None else start
            end = index
    if start is not None:
        yield start, end  # type: ignore[misc]


def _line_does(line: cst.SimpleStatementLine) -> _Does:
    does = _union(_call_does(call) for call in findall(line, m.Call()))  # type: ignore[arg-type]
    if any(findall(small, _EXITS) for small in line.body):
        does |= _Does.EXITS
    if _Does.LOGS in does:  # `print(out.mean())` logs: what it computes is for the log line
        does &= ~_Does.RUNS
    return does


def _header_does(statement: cst.BaseStatement) -> _Does:
    """What the header of a compound statement does: `while next(...)`, `if print(...)` (its body aside)."""
    if isinstance(statement, cst.For):
        heads: list[cst.CSTNode] = [statement.iter]
    elif isinstance(statement, (cst.While, cst.If)):
        heads = [statement.test]
    elif isinstance(statement, cst.With):
        heads = list(statement.items)
    else:
        heads = []
    return _union(_call_does(call) for head in heads for call in findall(head, m.Call()))  # type: ignore[arg-type]


def _call_does(call: cst.Call) -> _Does:
    name, called = dotted_name(call.func), method(call)
    if called in DEVICE_MOVES:
        return _Does.MOVES
    if called in _HOST_VALUES:
        return _Does.READS_HOST
    if name in _FETCHES or called == "__next__":
        return _Does.FETCHES
    if name == "print" or name.startswith("logging.") or called in _LOG_METHODS:
        return _Does.LOGS
    if called in _HOUSEKEEPING or name in _BOOKKEEPING or _makes_something(name):
        return _Does.NOTHING
    return _Does.RUNS


def _makes_something(name: str) -> bool:
    """A tensor factory (`torch.zeros`) or a class being constructed (`nn.Linear`, `DDP`, `deque`)."""
    last = name.rsplit(".", 1)[-1]
    return (name.startswith("torch.") and last in _FACTORIES) or last[:1].isupper() or name == "deque"


def _union(flags) -> _Does:
    does = _Does.NOTHING
    for flag in flags:
        does |= flag
    return does
