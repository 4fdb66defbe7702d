"""The names an import statement loads, as the file writes them: what the project rules look up in the settings'
`ported_modules` and `unported_modules` (migrate/project.py computes both, by the same spelling)."""

from __future__ import annotations

import libcst as cst

from rules import dotted_name


def from_module(node: cst.ImportFrom) -> str:
    """`from ..pkg import x` -> `..pkg`; `from . import x` -> `.`; `from pkg import x` -> `pkg`."""
    dots = "." * len(node.relative)
    return dots + (dotted_name(node.module) if node.module is not None else "")


def joined(module: str, name: str) -> str:
    """The module `from module import name` loads where `name` is a submodule: `.` + `m` -> `.m`, `p` + `m` -> `p.m`."""
    return module + name if module.endswith(".") else f"{module}.{name}"


def imported_names(node: cst.Import | cst.ImportFrom) -> list[str]:
    """Every module the statement may load, as written: `import a.b` -> [a.b]; `from .p import m` -> [.p, .p.m]."""
    if isinstance(node, cst.Import):
        return [dotted_name(alias.name) for alias in node.names]
    module = from_module(node)
    names = [] if isinstance(node.names, cst.ImportStar) else [dotted_name(alias.name) for alias in node.names]
    return [module, *(joined(module, name) for name in names)]
