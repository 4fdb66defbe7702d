"""The public API of the rules, and their registry: every concrete `PortRule` under this package, found by walking it.

A rule module imports from `rules` (this module) and from its own family's `_helpers`, nothing else of this package,
and so does migrate's engine (tests/test_layering.py checks both); the machinery lives in rules/framework. Adding a
rule means adding one module in a family folder (`rules/device/cuda_tensor_method.py`); nothing here or in the engine
changes. Codes are a group prefix and three digits (`DEV003`) and are never reused.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # the registry's annotations; importing `rules` does not load the framework
    from rules.framework.base import PortRule

# Each public name and the framework module that defines it, imported on first use (PEP 562): `migrate --help` and
# `--version` read the settings' vocabulary (rules.framework.types) and nothing else, not libcst and its matchers.
_PUBLIC = {
    "rules.framework.base": ("Case", "CheapMatcherScan", "Example", "FileState", "Flag", "PortRule", "Unchanged"),
    "rules.framework.calls": (
        "argument", "attribute_chain", "dotted_name", "has_star_args", "keyword", "keyword_names",
        "replace_argument_value", "same_quotes", "string_value",
    ),
    "rules.framework.data_flow": ("names_read", "names_written"),
    "rules.framework.edits": ("Body", "Edit", "StatementEdits", "statement"),
    "rules.framework.frameworks": ("frameworks",),
    "rules.framework.layout": ("line_limit", "reflow", "with_args"),
    "rules.framework.loops": (
        "backward_receivers", "is_innermost_training_loop", "is_optimizer", "method", "own_calls", "training_step",
        "trains",
    ),
    "rules.framework.original": (
        "LOADER", "ReadsTheOriginal", "called_name", "keyed_calls", "loader_arguments", "mapped_line", "node_code",
        "parsed",
    ),
    "rules.framework.positions": ("Positions",),
    "rules.framework.rule_set": ("RuleSet",),
    "rules.framework.tree": ("findall", "forget", "matches", "stored_attributes", "visit"),
    "rules.framework.types": ("Action", "AmpPolicy", "Finding", "Mode", "Safety", "Settings", "Severity"),
    "rules.framework.walk": ("TRIVIA", "Walk"),
}  # fmt: skip
_HOME = {name: module for module, names in _PUBLIC.items() for name in names}


def __getattr__(name: str) -> object:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'rules' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups find it without this function
    return value


_CODE = re.compile(r"^[A-Z]{2,4}\d{3}$")


class RuleError(Exception):
    """A rule declaration is broken, or a selection names no rule."""


@lru_cache(maxsize=1)
def all_rules() -> tuple[type[PortRule], ...]:
    """Every rule class, sorted by code; raises RuleError on a duplicate or malformed code."""
    from rules.framework.base import PortRule  # the registry's own needs; importing `rules` does not load it

    found: dict[str, type[PortRule]] = {}
    for info in pkgutil.walk_packages(__path__, prefix=f"{__name__}."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if not issubclass(obj, PortRule) or obj is PortRule or inspect.isabstract(obj):
                continue
            if obj.__module__ != module.__name__:
                continue  # imported into this module, declared elsewhere
            code = getattr(obj, "CODE", "")
            if not _CODE.match(code):
                raise RuleError(f"{obj.__module__}.{obj.__name__}: CODE {code!r} is not PREFIX + 3 digits")
            if code in found and found[code] is not obj:
                raise RuleError(f"rule code {code} is declared twice: {found[code].__name__} and {obj.__name__}")
            found[code] = obj
    return tuple(found[code] for code in sorted(found))


def rule_by_code(code: str) -> type[PortRule]:
    for rule in all_rules():
        if rule.CODE == code.upper():
            return rule
    raise RuleError(f"no rule has the code {code!r} (see `migrate --list-rules`)")


def select_rules(select: Iterable[str] = (), ignore: Iterable[str] = ()) -> tuple[type[PortRule], ...]:
    """Rules whose code starts with one of `select` (all when empty) and with none of `ignore`."""
    select = tuple(s.strip().upper() for s in select if s.strip())
    ignore = tuple(s.strip().upper() for s in ignore if s.strip())
    known = all_rules()
    for prefix in select + ignore:
        if not any(rule.CODE.startswith(prefix) for rule in known):
            raise RuleError(f"--select/--ignore {prefix!r} matches no rule code (see `migrate --list-rules`)")
    return tuple(
        rule
        for rule in known
        if (not select or rule.CODE.startswith(select)) and not rule.CODE.startswith(ignore or ("\0",))
    )


__all__ = sorted([*_HOME, "RuleError", "all_rules", "rule_by_code", "select_rules"])
