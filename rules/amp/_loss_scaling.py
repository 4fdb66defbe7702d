"""The code the loss-scaling rules write, and the edits that put it in place (no rule lives here)."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Sequence

import libcst as cst
import libcst.matchers as m

from rules.amp._step_analysis import Step, code
from rules import Body, Edit, argument, findall, frameworks, matches, same_quotes, statement, string_value

TORCH = (("torch", None),)
# A file mentioning one of these already manages its precision: mixed precision is not inserted a second time.
# bfloat16 before float16, which it holds
PRECISION_MARKERS = ("autocast", "GradScaler", "apex", "scale_loss", ".half()", "bfloat16", "float16")


def manages_precision(source: str) -> str | None:
    """The first marker showing that `source` already chooses its precision (its own, or a framework's that runs
    backward itself: `frameworks.own_amp`), else None. Only code counts: a comment or a docstring that mentions
    float16 or autocast does not."""
    if not any(marker in source for marker in PRECISION_MARKERS) and frameworks.own_amp(source) is None:
        return None
    code = _without_comments_and_strings(source)
    # a framework's first: DeepSpeed's config does the fp16 its script's `.half()` inputs are cast for
    return frameworks.own_amp(code) or next((marker for marker in PRECISION_MARKERS if marker in code), None)


@lru_cache(maxsize=8)
def _without_comments_and_strings(source: str) -> str:
    """`source` with its comments and string literals blanked out, the newlines inside them too, as blanking the
    tokens that `tokenize` finds would; a regular expression costs a tenth of tokenize (which cost 5% of a port)."""
    return _COMMENT_OR_STRING.sub(lambda match: " " * len(match.group()), source)


# Scanned from the left, so a quote inside a comment and a `#` inside a string belong to the token around them; a
# string's prefix (r, b, f, u) is part of it. An f-string is blanked whole, replacement fields included, as Python
# 3.11's tokenize does.
_COMMENT_OR_STRING = re.compile(
    r"#[^\r\n]*"
    r"|(?:(?<!\w)[rRbBuUfF]{1,2})?(?:'''(?:[^\\]|\\.)*?'''"
    r'|"""(?:[^\\]|\\.)*?"""'
    r"|'(?:[^'\\\n]|\\.)*'"
    r'|"(?:[^"\\\n]|\\.)*")',
    re.DOTALL,
)


def free_name(module: cst.Module, *candidates: str) -> str:
    """The first of `candidates` that no name in `module` uses."""
    used = {node.value for node in findall(module, m.Name())}  # type: ignore[attr-defined]
    return next((name for name in candidates if name not in used), f"{candidates[-1]}_")


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


def float32_inputs(call: cst.Call) -> cst.Call:
    """`criterion(output, target)` -> `criterion(output.float(), target.float())`: a loss left after autocast may get
    a float16 output, and binary_cross_entropy wants its input and target of one dtype."""
    inputs = {argument(call, 0, "input"), argument(call, 1, "target")}
    return call.with_changes(
        args=[arg.with_changes(value=_as_float(arg.value)) if arg in inputs else arg for arg in call.args]
    )


def _as_float(value: cst.BaseExpression) -> cst.BaseExpression:
    if matches(value, m.Call(func=m.Attribute(attr=m.Name("float")), args=[])):
        return value
    receiver = value if isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) else _parenthesized(value)
    return cst.Call(func=cst.Attribute(receiver, cst.Name("float")))


def _parenthesized(value: cst.BaseExpression) -> cst.BaseExpression:
    return value if value.lpar else value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


def checkpoint_with_scaler(entries: cst.Dict, scaler: str) -> cst.Dict | None:
    """`{..., "optimizer": opt.state_dict(), ...}` with `"scaler": scaler.state_dict()` after the optimizer's entry.

    None when the dictionary holds no optimizer state or already holds a scaler's.
    """
    last = _optimizer_entry(entries)
    if last is None:
        return None
    elements = list(entries.elements)
    anchor = elements[last]
    assert isinstance(anchor, cst.DictElement)
    key = anchor.key
    name = _scaler_key(string_value(key) or "optimizer")
    new_key = same_quotes(key, name) if isinstance(key, cst.SimpleString) else cst.SimpleString(f'"{name}"')
    separator = _separator(entries)
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


def _optimizer_entry(entries: cst.Dict) -> int | None:
    """Index of the last optimizer state in a checkpoint dictionary that holds nothing of a scaler, else None."""
    elements = entries.elements
    optimizers = [i for i, element in enumerate(elements) if _is_optimizer_state(element)]
    if not optimizers or any("scaler" in code(element).lower() for element in elements):
        return None
    return optimizers[-1]


def _scaler_key(optimizer_key: str) -> str:
    """The key of the scaler's state beside the optimizer's ("scaler_state_dict" for "optimizer_state_dict")."""
    suffix = re.match(r"^optimizer(_\w*)?$", optimizer_key)
    return "scaler" + (suffix.group(1) or "" if suffix else "")


def resume_edits(reach: cst.CSTNode, scaler: str) -> list[tuple[Body, Edit]]:
    """After each `optimizer.load_state_dict(checkpoint["optimizer"])` in `reach` whose key names the optimizer in a
    checkpoint that `checkpoint_with_scaler` completes: the scaler's state loaded back, when the checkpoint has it.

    The guard keeps checkpoints saved before mixed precision loadable. Nothing when `reach` loads the scaler already.
    """
    if _loads_scaler(reach, scaler):
        return []
    keys = set()
    for entries in findall(reach, m.Dict()):
        last = _optimizer_entry(entries)  # type: ignore[arg-type]
        if last is not None:
            keys.add(string_value(entries.elements[last].key) or "optimizer")  # type: ignore[attr-defined]
    edits = []
    for block in _blocks(reach):
        for index, line in enumerate(block.body):
            loaded = _loaded_optimizer_state(line, keys)
            if loaded is not None:
                checkpoint, key = loaded
                edits.append((block, Edit(index, _RESUMED, insert_after=(_load_scaler(checkpoint, key, scaler),))))
    return edits


_RESUMED = "the scaler's state loaded back next to the optimizer's, when the checkpoint has it"


def _loads_scaler(reach: cst.CSTNode, scaler: str) -> bool:
    loads = findall(reach, m.Call(func=m.Attribute(attr=m.Name("load_state_dict"))))
    return any(code(call.func.value) == scaler for call in loads)  # type: ignore[attr-defined]


def _blocks(reach: cst.CSTNode) -> list[Body]:
    inner: list[Body] = findall(reach, m.IndentedBlock())  # type: ignore[assignment]
    return [reach, *inner] if isinstance(reach, cst.Module) else inner


def _loaded_optimizer_state(
    line: cst.BaseStatement, keys: set[str]
) -> tuple[cst.BaseExpression, cst.SimpleString] | None:
    """(checkpoint, key) for a line `<optimizer>.load_state_dict(<checkpoint>[<key>])` with a key of `keys`."""
    found = m.extract(line, _LOAD_STATE_LINE)
    if found is None or string_value(found["key"]) not in keys:  # type: ignore[arg-type]
        return None
    optimizer = line.body[0].value.func.value  # type: ignore[attr-defined]
    if "optim" not in code(optimizer).lower():
        return None
    return found["checkpoint"], found["key"]  # type: ignore[return-value]


# `<optimizer>.load_state_dict(<checkpoint>[<key>])` alone on a line, capturing the checkpoint and the key.
_LOAD_STATE_LINE = m.SimpleStatementLine(
    body=[
        m.Expr(
            m.Call(
                func=m.Attribute(attr=m.Name("load_state_dict")),
                args=[
                    m.Arg(
                        m.Subscript(
                            value=m.SaveMatchedNode(m.Name() | m.Attribute(), "checkpoint"),
                            slice=[m.SubscriptElement(m.Index(m.SaveMatchedNode(m.SimpleString(), "key")))],
                        )
                    )
                ],
            )
        )
    ]
)


def _load_scaler(checkpoint: cst.BaseExpression, optimizer_key: cst.SimpleString, scaler: str) -> cst.BaseStatement:
    key = code(same_quotes(optimizer_key, _scaler_key(string_value(optimizer_key) or "")))
    source = code(checkpoint)
    return statement(
        f"if {key} in {source}:  # older checkpoints have no scaler state\n"
        f"    {scaler}.load_state_dict({source}[{key}])"
    )


def _is_optimizer_state(element: cst.BaseDictElement) -> bool:
    if not isinstance(element, cst.DictElement):
        return False
    value = element.value
    return matches(value, m.Call(func=m.Attribute(attr=m.Name("state_dict")), args=[])) and "optim" in code(
        value.func.value  # type: ignore[attr-defined]
    ).lower()


def _separator(entries: cst.Dict) -> cst.Comma:
    """The comma between two entries as this dictionary writes it (one per line, or `, `)."""
    for element in entries.elements[:-1]:
        if isinstance(element.comma, cst.Comma):
            return element.comma
    opening = entries.lbrace.whitespace_after
    multiline = isinstance(opening, cst.ParenthesizedWhitespace)
    return cst.Comma(whitespace_after=opening if multiline else cst.SimpleWhitespace(" "))


def update_edits(step: Step, scaler: str) -> list[tuple[Body, Edit]]:
    """`scaler.update()` after the last optimizer step of each block: once per iteration, only where a step ran."""
    last_in_block: dict[Body, int] = {}
    for site in step.steps:
        place = step.places[site.line]
        last_in_block[place.block] = max(last_in_block.get(place.block, -1), place.index)
    update = statement(f"{scaler}.update()")
    message = f"{scaler}.update() after the optimizer step"
    return [(block, Edit(index, message, insert_after=(update,))) for block, index in last_in_block.items()]


def unscale_edits(step: Step, scaler: str) -> list[tuple[Body, Edit]]:
    """`scaler.unscale_(optimizer)` before the first gradient clipping of each optimizer in a block."""
    edits: dict[tuple[Body, str], Edit] = {}
    for line in step.clips:
        optimizer = step.optimizer_before(line)
        place = step.places[line]
        if optimizer is not None and (place.block, code(optimizer)) not in edits:
            unscale = statement(f"{scaler}.unscale_({code(optimizer)})")
            edit = Edit(place.index, "gradients unscaled before clipping", insert_before=(unscale,))
            edits[(place.block, code(optimizer))] = edit
    return [(block, edit) for (block, _), edit in edits.items()]


class SavesScalerState:
    """Mixin for the rules that save the scaler's state in checkpoints: each dictionary among `_checkpoints` (the
    original nodes the rule planned to change) that holds an optimizer's state gets `_scaler`'s state next to it."""

    _scaler: str
    _checkpoints: set[cst.Dict]

    def leave_Dict(self, original_node: cst.Dict, updated_node: cst.Dict) -> cst.BaseExpression:
        if original_node not in self._checkpoints:
            return updated_node
        new = checkpoint_with_scaler(updated_node, self._scaler)
        if new is None:
            return updated_node
        return self.replace(  # type: ignore[attr-defined]
            original_node, updated_node, new, "the scaler's state saved next to the optimizer's")


GRAD_SCALERS = frozenset(
    {
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.npu.amp.GradScaler",
        "torch_npu.npu.amp.GradScaler",
        "torch.cpu.amp.GradScaler",
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    }
)


# Every spelling of autocast a port may hold, and the device a namespaced one computes on.
AUTOCASTS = (
    "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast", "torch.cuda.amp.autocast",
    "torch.npu.amp.autocast", "torch.cpu.amp.autocast", "torch_npu.npu.amp.autocast",
)
_NAMESPACE_DEVICE = {
    "torch.cuda.amp.autocast": "cuda", "torch.npu.amp.autocast": "npu", "torch.cpu.amp.autocast": "cpu",
    "torch_npu.npu.amp.autocast": "npu",
}
_CALL = m.Call()


def autocast_device(call: cst.Call, refers_to: Callable[..., bool],
                    qualified_names: Callable[[cst.CSTNode], set[str]]) -> str | None:
    """The device a call of autocast names: its device_type, or its namespace's (torch.cuda.amp.autocast); None for
    any other call. `refers_to` and `qualified_names` are the rule's."""
    if not refers_to(call.func, *AUTOCASTS):
        return None
    if (device := argument(call, 0, "device_type")) is not None:
        return string_value(device.value)
    return next((_NAMESPACE_DEVICE[name] for name in qualified_names(call.func) if name in _NAMESPACE_DEVICE), None)


def port_device(module: cst.Module, refers_to: Callable[..., bool],
                qualified_names: Callable[[cst.CSTNode], set[str]]) -> str:
    """The device of the file's first autocast: the one its fixes compute on ("npu" in a file without one)."""
    devices = (autocast_device(call, refers_to, qualified_names) for call in findall(module, _CALL))
    return next(filter(None, devices), "npu")


def switched_off(call: cst.Call) -> bool:
    """Whether an autocast or GradScaler call says `enabled=False` (a region a fix keeps in fp32, or AMP off)."""
    enabled = argument(call, None, "enabled")
    return enabled is not None and isinstance(enabled.value, cst.Name) and enabled.value.value == "False"


def existing_scaler(module: cst.Module, refers_to: Callable[..., bool]) -> str | None:
    """The name (`scaler`, `self.scaler`) of the file's one GradScaler; None when there is none or several.
    `refers_to(node, *names)` is the rule's."""
    names = {
        code(target.target)
        for assign in findall(module, m.Assign(value=m.Call()))
        if refers_to(assign.value.func, *GRAD_SCALERS)  # type: ignore[attr-defined]
        for target in assign.targets  # type: ignore[attr-defined]
    }
    return names.pop() if len(names) == 1 else None
