"""Small helpers for rules that read and rebuild call arguments and string literals (no rule lives here)."""

from __future__ import annotations

import ast
from functools import lru_cache
from typing import Iterable

import libcst as cst


def string_value(node: cst.CSTNode | None) -> str | None:
    """The text of a plain (non-f, non-bytes) string literal, else None."""
    if isinstance(node, cst.SimpleString):
        value = _evaluated(node.value)
    elif isinstance(node, cst.ConcatenatedString):
        value = node.evaluated_value
    else:
        return None
    return value if isinstance(value, str) else None


@lru_cache(maxsize=4096)
def _evaluated(literal: str) -> str | bytes:
    """SimpleString.evaluated_value (ast.literal_eval of its text), once per text: rules read every string."""
    return ast.literal_eval(literal)


def same_quotes(literal: cst.SimpleString, text: str) -> cst.SimpleString:
    """A literal holding `text`, written with the prefix and quotes of `literal` (`r'...'` stays `r'...'`)."""
    return literal.with_changes(value=f"{literal.prefix}{literal.quote}{text}{literal.quote}")


def argument(call: cst.Call, position: int | None, keyword: str) -> cst.Arg | None:
    """The argument passed for a parameter, given its positional index (None: keyword-only) and its name."""
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg
    if position is not None and position < len(positional):
        return positional[position]
    return None


def keyword_names(call: cst.Call) -> set[str]:
    return {arg.keyword.value for arg in call.args if arg.keyword is not None}


def has_star_args(call: cst.Call) -> bool:
    return any(arg.star for arg in call.args)


def replace_argument_value(call: cst.Call, old: cst.Arg, value: cst.BaseExpression) -> cst.Call:
    """`call` with the value of its argument `old` (an element of `call.args`) replaced."""
    return call.with_changes(args=[arg.with_changes(value=value) if arg is old else arg for arg in call.args])


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value`, written without spaces around `=` as PEP 8 asks."""
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
    )


def dotted_name(node: cst.BaseExpression) -> str:
    """`a.b.c` for a Name/Attribute chain, "" for anything else."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted_name(node.value)
        return f"{base}.{node.attr.value}" if base else ""
    return ""


def attribute_chain(dotted: str) -> cst.BaseExpression:
    """The expression for `a.b.c`."""
    return cst.parse_expression(dotted)


def under(expression: cst.BaseExpression, names: Iterable[str], *prefixes: str) -> str | None:
    """The first of `names` (the qualified names of `expression`) that is one of the dotted `prefixes` or lies below
    one, else None. libcst names `f(x).decode` as `f.decode`, so only a plain dotted `expression` can match."""
    if not dotted_name(expression):
        return None
    for name in sorted(names):
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return name
    return None
