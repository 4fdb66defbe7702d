"""What an op was asked to compute besides its tensors: the attributes of a forward call that differ from its
schema's defaults, as one short string per call (ops.attrs), e.g. "approximate='tanh'" for aten.gelu or "eps=1e-06"
for aten.native_layer_norm.

A port that changes a layer's setting computes the same op on the same tensors with another attribute: GELU's tanh
approximation, a LayerNorm's epsilon, a dropout's probability, a batch norm left in training mode. Its numbers may
stay within the devices' noise (nanoGPT's GELU with approximate="tanh" moves its bf16 outputs less than one rounding),
so no statistic can tell; the attribute can (compare's changed-operator finding).

Recorded: arguments of types int, SymInt, bool, str, float and Scalar, optional or in lists, that are not the schema's
default. Never: tensors, devices, dtypes, layouts, memory formats, generators (they differ between devices or carry
no setting of the script's), nor the arguments named in `_NOT_A_SETTING`. Floats are written to 6 significant
digits: a setting is a constant of the script, and the rare scalar derived from data then rounds alike on both sides.
"""

from __future__ import annotations

from typing import Any

import torch

# Argument types that hold a setting of the script, as torch's schema types name them within Optional[...] and
# List[...] ("number" is a Scalar; a SymInt reads as int).
_SETTING_TYPES = frozenset({"int", "bool", "str", "float", "number"})
# Arguments that say where or how, not what, an op computes (a dtype reads as an int), or that follow the precision
# a side runs in: under autocast softmax takes its half input to float itself (half_to_float), an fp32 reference not.
_NOT_A_SETTING = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format", "non_blocking", "copy",
                            "half_to_float"})

# Per overload: (position, name, default) of each argument that may hold a setting (empty where none may).
_SETTINGS: dict[Any, tuple[tuple[int, str, Any], ...]] = {}


def _settings_of(func: Any) -> tuple[tuple[int, str, Any], ...]:
    found = _SETTINGS.get(func)
    if found is None:
        found = _SETTINGS[func] = tuple(
            (position, argument.name, argument.default_value if argument.has_default_value() else _NO_DEFAULT)
            for position, argument in enumerate(func._schema.arguments)
            if _base_type(str(argument.type)) in _SETTING_TYPES and argument.name not in _NOT_A_SETTING)
    return found


class _NoDefault:
    """A required argument: its value is always written."""


_NO_DEFAULT = _NoDefault()


def _base_type(name: str) -> str:
    """"int" of "Optional[List[int]]"."""
    return name.replace("Optional[", "").replace("List[", "").rstrip("]")


def attributes(func: Any, args: tuple, kwargs: dict) -> str:
    """The settings of one call that differ from the defaults of its schema, "name=value" joined by ", "."""
    settings = _settings_of(func)
    if not settings:
        return ""
    written = []
    for position, name, default in settings:
        value = args[position] if position < len(args) else kwargs.get(name, default)
        if value is not default and not _equal(value, default):
            if name in _DIMENSIONS:
                value = _counted_from_the_front(value, args)
            written.append(f"{name}={_text(value)}")
    return ", ".join(written)


# Arguments that name dimensions of the op's first tensor: dim=-1 and dim=1 of a 2-d tensor are the same setting.
_DIMENSIONS = frozenset({"dim", "dim0", "dim1", "start_dim", "end_dim"})


def _counted_from_the_front(value: Any, args: tuple) -> Any:
    rank = args[0].dim() if args and isinstance(args[0], torch.Tensor) else 0
    if not rank:
        return value
    if isinstance(value, int):
        return value % rank
    if isinstance(value, (list, tuple)) and all(isinstance(item, int) for item in value):
        return [item % rank for item in value]
    return value


def _equal(value: Any, default: Any) -> bool:
    if default is _NO_DEFAULT or isinstance(value, torch.Tensor):
        return False
    try:
        return bool(value == default)
    except (TypeError, RuntimeError):  # a SymInt list against a default of another kind
        return False


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):  # a list or a tuple alike: ints mostly (sizes, strides), written as str does
        return "[" + ", ".join(map(_text, value) if any(isinstance(item, float) for item in value)
                               else map(str, value)) + "]"
    if isinstance(value, torch.Tensor):  # a Scalar passed as a 0-d tensor: its value is data, not a setting
        return "tensor"
    return repr(value)
