"""Reading a file as Python: its size first, then Python's own parser, then libcst's, each failure named as whose.

libcst's native parser (Rust) has limits Python's does not share, and fails hard at some; measured with libcst 1.9
on CPython 3.11 (tests/test_bad_input.py holds them):
- memory: 0.45 GB per MB of source for a typical training script, 1.1 GB for dense one-line statements (1.3 GB for
  the whole port); a 50 MB file ended in a Rust out-of-memory abort (exit 134) that took the other files with it.
  `MAX_SOURCE_BYTES` is checked on the file's size, before it is read.
- its stack: 2,000 nested brackets or 7,000 chained operators overflow it (SIGSEGV, the whole run ends). Python's
  own parser refuses nesting far sooner (200 nested brackets; chains of `+`, `.`, calls, `not`, RecursionError near
  3,000), so it reads every file first (a tenth of libcst's time): what it refuses is the file's, as running it
  would say. Python reads `and`/`or` chains flat, libcst nests them: `MAX_BOOLEAN_CHAIN` operators in one
  expression at most, counted on Python's tree before libcst parses.
- `MAX_ADJACENT_STRINGS` string literals in one concatenation (its grammar's recursion limit): one more is a
  ParserSyntaxError on valid Python, named as libcst's limit, never as the user's syntax.
- its tree is walked in Python (codegen, visitors), one frame or more a level: Python's recursion limit (1000)
  stops a chain of about 490 adjacent strings, `and`s or `+`s. The RecursionError is named so (`too_deep`), not
  as a bug of migrate's.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import TYPE_CHECKING

from migrate.types import SourceError

if TYPE_CHECKING:
    import libcst as cst

MAX_SOURCE_BYTES = 2 * 1024 * 1024  # at most ~2.7 GB of memory for the port of the densest source measured
MAX_ADJACENT_STRINGS = 3000
MAX_BOOLEAN_CHAIN = 3000  # libcst 1.9 overflowed an 8 MiB stack between 7,000 and 8,000


def check_size(path: Path, shown: str) -> None:
    """SourceError where the file is past what libcst's parser can read in memory (before it is read at all)."""
    size = path.stat().st_size
    if size > MAX_SOURCE_BYTES:
        raise SourceError(shown, 1, 1, f"{size / 2**20:.1f} MiB is past migrate's limit of "
                                       f"{MAX_SOURCE_BYTES // 2**20} MiB a file: libcst's parser needs about 1 GB of "
                                       "memory a MiB; split the file (a large literal can be loaded from a data file)")


def python_tree(code: str, path: str) -> ast.Module:
    """Python's own parse of `code`; SourceError `path:line:col: syntax error: ...` where Python refuses it."""
    try:
        return compile(code, path, "exec", ast.PyCF_ONLY_AST)
    except SyntaxError as error:
        line, column = error.lineno or 1, error.offset or 1
        lines = code.splitlines()
        source_line = lines[line - 1] if 0 < line <= len(lines) else ""
        hint = "; this looks like Python 2, port it to Python 3 first" if _PYTHON2.search(source_line) else ""
        raise SourceError(path, line, column, f"syntax error: {error.msg}{hint}") from None
    except (RecursionError, MemoryError):
        raise SourceError(path, 1, 1, "syntax error: nested too deeply for Python's own parser (RecursionError): "
                                      "Python cannot run it either") from None


# Statements only Python 2 accepts: `print "x"`, `exec code`, `except E, e:`, `raise E, "m"`, `<>`, backquotes.
_PYTHON2 = re.compile(r"^\s*(print|exec)\s+[^\s(=.,)]|^\s*except\s+[\w.]+\s*,\s*\w+\s*:|^\s*raise\s+\w+\s*,|<>|`")


def parse(code: str, path: str) -> cst.Module:
    """libcst's tree of `code`, once Python's parser has read it; past one of libcst's limits, SourceError naming it."""
    import libcst as cst  # loaded when a file is ported: `migrate --help` loads nothing heavy

    _check_boolean_chains(python_tree(code, path), code, path)
    try:
        return cst.parse_module(code)
    except cst.ParserSyntaxError as error:
        raise _libcst_limit(error, code, path) from None


def too_deep(path: str) -> SourceError:
    """What a RecursionError while a file is ported means: libcst's tree nests deeper than Python walks."""
    return SourceError(path, 1, 1, f"nested deeper than libcst's tree walk can follow (Python's recursion limit, "
                                   f"{sys.getrecursionlimit()}: about 490 adjacent string literals or chained "
                                   "operators in one expression), not a syntax error; split the expression")


def _check_boolean_chains(tree: ast.Module, code: str, path: str) -> None:
    if len(_BOOLEAN.findall(code)) <= MAX_BOOLEAN_CHAIN:
        return  # no chain can be longer (strings and comments counted too): the tree is not walked
    for node in ast.walk(tree):
        operators = _boolean_operators(node)
        if operators > MAX_BOOLEAN_CHAIN:
            raise SourceError(path, node.lineno, node.col_offset + 1, f"{operators} chained `and`/`or` operators: "
                              f"libcst's parser takes at most {MAX_BOOLEAN_CHAIN} in one expression (Python reads the "
                              "file; not a syntax error): split it, e.g. with all([...]) or any([...])")


_BOOLEAN = re.compile(r"\b(?:and|or)\b")


def _boolean_operators(node: ast.AST) -> int:
    """The `and`/`or` operators of a chain, those of the chains directly in it included (libcst nests them all)."""
    if not isinstance(node, ast.BoolOp):
        return 0
    return len(node.values) - 1 + sum(_boolean_operators(value) for value in node.values)


def _libcst_limit(error: cst.ParserSyntaxError, code: str, path: str) -> SourceError:
    """Python read the file: what libcst's grammar refuses in it is libcst's limit, where libcst points."""
    run, start = _longest_string_run(code)
    if run > MAX_ADJACENT_STRINGS:
        return SourceError(path, start, 1, f"{run} adjacent string literals: libcst's parser takes at most "
                                           f"{MAX_ADJACENT_STRINGS} in one concatenation (Python reads the file; "
                                           "not a syntax error): join them, or build the text with ''.join([...])")
    text = error.message.strip() or "invalid syntax"
    where = _ERROR_AT.search(text)
    line, column = (int(where[1]), int(where[2]) + 1) if where else (error.raw_line, error.raw_column + 1)
    text = _ERROR_AT.sub("", text).split(": ", 1)[-1].strip()
    return SourceError(path, line, column, f"libcst's parser cannot read what Python reads here ({text}): a limit of "
                                           "libcst's, not a syntax error; please report it")


_ERROR_AT = re.compile(r"error at (\d+):(\d+):?")
_BETWEEN_STRINGS = {tokenize.NL, tokenize.COMMENT}


def _longest_string_run(code: str) -> tuple[int, int]:
    """The most string literals in a row (an implicit concatenation) and the line where that run starts."""
    best, start, run, first = 0, 1, 0, 1
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.STRING:
                run, first = run + 1, first if run else token.start[0]
                if run > best:
                    best, start = run, first
            elif token.type not in _BETWEEN_STRINGS:
                run = 0
    except (tokenize.TokenError, SyntaxError):  # Python's tokenizer and parser disagree: no run to name
        pass
    return best, start
