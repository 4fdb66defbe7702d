"""The code the loss-scaling rules write, and how they edit statement lists (no rule lives here)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from rules.amp.step_analysis import Body, code
from rules.calls import same_quotes, string_value

# A file mentioning one of these already manages its precision: mixed precision is not inserted a second time.
PRECISION_MARKERS = ("autocast", "GradScaler", "apex", "scale_loss", ".half()", "float16", "bfloat16", "deepspeed")
# Libraries that run backward and the optimizer step themselves and bring their own mixed precision.
_OWN_BACKWARD = ("accelerator.backward", "self.manual_backward", "engine.backward")


def manages_precision(source: str) -> str | None:
    """The first marker showing that `source` already chooses its precision, else None."""
    return next((marker for marker in PRECISION_MARKERS + _OWN_BACKWARD if marker in source), None)


def free_name(module: cst.Module, *candidates: str) -> str:
    """The first of `candidates` that no name in `module` uses."""
    used = {node.value for node in m.findall(module, m.Name())}  # type: ignore[attr-defined]
    return next((name for name in candidates if name not in used), f"{candidates[-1]}_")


def statement(text: str) -> cst.BaseStatement:
    return cst.parse_statement(text + "\n")


def autocast(statements: Sequence[cst.BaseStatement], dtype: str) -> cst.With:
    """`with torch.autocast(...)` around `statements`; the comments above the first one move above the `with`."""
    header = statement(f'with torch.autocast(device_type="npu", dtype=torch.{dtype}):\n    pass')
    assert isinstance(header, cst.With)
    first = statements[0]
    inner = [first.with_changes(leading_lines=()), *statements[1:]]
    return header.with_changes(body=header.body.with_changes(body=inner), leading_lines=first.leading_lines)


def scaled(call: cst.Call, scaler: str) -> cst.Call:
    """`loss.backward(...)` -> `scaler.scale(loss).backward(...)`."""
    receiver = call.func.value.with_changes(lpar=(), rpar=())  # type: ignore[attr-defined]
    scale = cst.Call(func=cst.Attribute(cst.Name(scaler), cst.Name("scale")), args=[cst.Arg(receiver)])
    return call.with_changes(func=call.func.with_changes(value=scale))  # type: ignore[attr-defined]


def scaler_step(call: cst.Call, scaler: str) -> cst.Call:
    """`optimizer.step()` -> `scaler.step(optimizer)`."""
    optimizer = call.func.value  # type: ignore[attr-defined]
    return call.with_changes(func=cst.Attribute(cst.Name(scaler), cst.Name("step")), args=[cst.Arg(optimizer)])


def checkpoint_with_scaler(entries: cst.Dict, scaler: str) -> cst.Dict | None:
    """`{..., "optimizer": opt.state_dict(), ...}` with `"scaler": scaler.state_dict()` after the optimizer's entry.

    None when the dictionary holds no optimizer state or already holds a scaler's.
    """
    elements = list(entries.elements)
    optimizers = [i for i, element in enumerate(elements) if _is_optimizer_state(element)]
    if not optimizers or any("scaler" in code(element).lower() for element in elements):
        return None
    last = optimizers[-1]
    anchor = elements[last]
    assert isinstance(anchor, cst.DictElement)
    key = anchor.key
    text = string_value(key) or "optimizer"
    name = re.sub(r"^optimizer(?=_|$)", "scaler", text) if text.startswith("optimizer") else "scaler"
    new_key = same_quotes(key, name) if isinstance(key, cst.SimpleString) else cst.SimpleString(f'"{name}"')
    separator = _separator(elements)
    entry = cst.DictElement(
        key=new_key,
        value=cst.parse_expression(f"{scaler}.state_dict()"),
        whitespace_before_colon=anchor.whitespace_before_colon,
        whitespace_after_colon=anchor.whitespace_after_colon,
        comma=anchor.comma,
    )
    elements[last] = anchor.with_changes(comma=separator)
    elements.insert(last + 1, entry)
    return entries.with_changes(elements=elements)


def _is_optimizer_state(element: cst.BaseDictElement) -> bool:
    if not isinstance(element, cst.DictElement):
        return False
    value = element.value
    return m.matches(value, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[])) and "optim" in code(
        value.func.value  # type: ignore[attr-defined]
    ).lower()


def _separator(elements: Sequence[cst.BaseDictElement]) -> cst.Comma:
    """The comma between two entries as this dictionary writes it (one per line, or `, `)."""
    for element in elements[:-1]:
        if isinstance(element.comma, cst.Comma):
            return element.comma
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


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


Apply = Callable[[Body, Body, str, cst.CSTNode], Body]


def apply_edits(original: Body, updated: Body, edits: Sequence[Edit], record: Apply) -> Body:
    """Apply `edits` to `updated` (whose statements match `original` one to one), last index first.

    `record(updated, new, message, at)` keeps or refuses each change, as `PortRule.replace` does.
    """
    if len(original.body) != len(updated.body):
        return updated  # another rule added or removed statements here: indexes no longer line up
    for edit in sorted(edits, key=lambda e: e.index, reverse=True):
        body = list(updated.body)
        if edit.wrap_until is not None and edit.wrapper is not None:
            body[edit.index : edit.wrap_until + 1] = [edit.wrapper(body[edit.index : edit.wrap_until + 1])]
        body[edit.index + 1 : edit.index + 1] = edit.insert_after
        body[edit.index : edit.index] = edit.insert_before
        updated = record(updated, updated.with_changes(body=body), edit.message, original.body[edit.index])
    return updated
