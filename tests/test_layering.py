"""The import graph between the packages (ARCHITECTURE.md): migrate -> rules, never back; verify stands alone and
never loads libcst; verify's compare, report and store never load torch, so a report can be made on any laptop; what
migrate and verify agree on is verify/contract/, a leaf of the standard library, the one part of verify migrate imports.

Checked twice: every import statement in the package files, at any depth (so an import inside a function counts),
followed through the project's own modules; and a fresh interpreter's sys.modules after importing the module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("migrate", "rules", "verify")

# (importer, what it may never import, directly or through other project modules)
FORBIDDEN = [
    ("rules", {"migrate", "verify"}),
    ("verify", {"migrate", "rules", "libcst"}),
    ("migrate", {"torch", "pandas"}),  # its report tables are a few hundred rows: the csv module writes them
]
# verify's packages along the data's way, each with the packages it may import (ARCHITECTURE.md). The top-level
# modules (`errors`) and the contract import nothing else of verify and may be imported by any package.
VERIFY_LAYERS = {
    "contract": set(),
    "devices": set(),
    "frameworks": set(),
    "record": {"devices", "frameworks"},
    "compare": {"record", "devices"},
    "report": {"compare", "record", "devices"},
    "capture": {"record", "devices", "frameworks"},
    "launch": {"record", "devices", "frameworks"},
    "pair": {"launch", "report", "compare", "record", "devices"},
    "cli": {"pair", "launch", "report", "compare", "record", "devices"},
}
# Only what runs inside the training process imports torch: a report is made from two run folders on any laptop.
IMPORTS_TORCH = ("verify.capture", "verify.devices.setup")
# What the project knows of each framework: a leaf of the standard library that migrate, verify's packages and the
# rules import, the rules through one module of theirs alone.
FRAMEWORKS = "verify.frameworks"
RULES_DOOR_TO_FRAMEWORKS = "rules.framework.frameworks"
# What migrate and verify agree on (file names, the checklist, finding codes, the readers of a pair's result): every
# verify package may import it, migrate imports nothing else of verify, and it imports the standard library alone.
CONTRACT = "verify.contract"
# All migrate imports of verify: the contract, and what the project knows of each framework.
VERIFY_FOR_MIGRATE = (CONTRACT, FRAMEWORKS)
TOP_LEVEL_MODULES_AT_MOST = 13


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@lru_cache(maxsize=1)
def _modules() -> dict[str, Path]:
    return {
        _module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if "emulated" not in path.relative_to(ROOT).parts  # data for verify's child processes, never imported here
    }


@lru_cache(maxsize=None)
def _imports(module: str) -> frozenset[tuple[str, int]]:
    """(imported module, line) for every import statement in `module`'s file, relative imports resolved."""
    path = _modules()[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add((base, node.lineno))
            # `from verify.report import writers` imports the module verify.report.writers
            found.update((f"{base}.{alias.name}", node.lineno) for alias in node.names if f"{base}.{alias.name}" in _modules())
    return frozenset(found)


def _violations(start: str, forbidden: set[str]) -> list[str]:
    """Each import statement through which `start` reaches a forbidden package, directly or through project
    modules, as `path:line imports name (via a -> b -> ...)`."""
    via = {start: [start]}
    pending, found = [start], set()
    while pending:
        module = pending.pop()
        for imported, line in sorted(_imports(module)):
            where = f"{_modules()[module].relative_to(ROOT)}:{line}"
            if imported.split(".")[0] in forbidden:
                found.add(f"{where} imports {imported} (via {' -> '.join(via[module])})")
            elif imported in _modules() and imported not in via:
                via[imported] = [*via[module], imported]
                pending.append(imported)
    return sorted(found)


@pytest.mark.parametrize("importer, forbidden", FORBIDDEN, ids=[f"{p}-imports-no-{'-'.join(sorted(f))}" for p, f in FORBIDDEN])
def test_package_never_imports_the_layers_above_it(importer: str, forbidden: set[str]):
    modules = [name for name in _modules() if name.split(".")[0] == importer]
    assert modules
    # Every module of the package is checked, so its own direct imports are enough.
    violations = [
        f"{_modules()[module].relative_to(ROOT)}:{line} imports {imported}"
        for module in modules
        for imported, line in sorted(_imports(module))
        if imported.split(".")[0] in forbidden and not _through_the_door(module, imported)
    ]
    assert not violations, "\n".join(violations)


def _through_the_door(module: str, imported: str) -> bool:
    """Whether `module` may import `imported` as the frameworks leaf: outside the rules, or as the rules' one door."""
    return _within(imported, FRAMEWORKS) and (module.split(".")[0] != "rules" or module == RULES_DOOR_TO_FRAMEWORKS)


def _verify_package(module: str) -> str | None:
    """The package of verify a module belongs to (`verify.record.store` -> "record"), None for a top-level module."""
    parts = module.split(".")
    return parts[1] if parts[0] == "verify" and len(parts) > 1 and (ROOT / "verify" / parts[1]).is_dir() else None


def _torch_free_modules() -> list[str]:
    return [name for name in _modules()
            if name.startswith("verify.") and not name.startswith(IMPORTS_TORCH) and name != "verify.__main__"]


def test_verify_packages_import_only_the_layers_below_them():
    """Every import statement of a verify package, direct (every module is checked), against VERIFY_LAYERS."""
    assert set(VERIFY_LAYERS) == {path.name for path in (ROOT / "verify").iterdir()
                                  if (path / "__init__.py").is_file()}
    violations = []
    for module in (name for name in _modules() if name.startswith("verify.") and name != "verify.__main__"):
        package = _verify_package(module)
        for imported, line in sorted(_imports(module)):
            if not imported.startswith("verify.") or imported not in _modules() and _verify_package(imported) is None:
                continue
            target = _verify_package(imported)
            if package is None:  # a top-level module (errors) imports no other part of verify
                violations.append(f"{_modules()[module].relative_to(ROOT)}:{line}: {module} imports {imported}")
            elif target and target != package and target not in VERIFY_LAYERS[package] | {"contract"}:
                violations.append(f"{_modules()[module].relative_to(ROOT)}:{line}: {package} imports {imported}")
    assert not violations, "\n".join(violations)


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_migrate_imports_of_verify_only_its_leaves():
    violations = [f"{_modules()[module].relative_to(ROOT)}:{line} imports {imported}"
                  for module in _modules() if _within(module, "migrate")
                  for imported, line in sorted(_imports(module))
                  if _within(imported, "verify") and not any(_within(imported, leaf) for leaf in VERIFY_FOR_MIGRATE)]
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("leaf", [CONTRACT, FRAMEWORKS])
def test_a_leaf_of_verify_imports_only_the_standard_library(leaf: str):
    """migrate reads verify's files through the contract, and migrate, the rules and verify's packages read the
    frameworks, without loading verify's dependencies (pandas, torch, typer) or anything else of verify."""
    assert any(_within(module, leaf) for module in _modules())
    outside = {imported for module in _modules() if _within(module, leaf)
               for imported, _ in _imports(module) if not _within(imported, leaf)}
    assert {name.split(".")[0] for name in outside} <= {*sys.stdlib_module_names, "__future__"}, sorted(outside)


def test_no_import_circle_between_modules():
    """Strongly connected parts of the module graph (every import, those inside functions too): none has two
    modules."""
    graph = {module: {name for name, _ in _imports(module) if name in _modules() and name != module}
             for module in _modules()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(" <-> ".join(sorted(component)))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert not circles, "\n".join(circles)


def test_verify_top_level_stays_small():
    top = [path.name for path in (ROOT / "verify").iterdir()
           if path.suffix == ".py" or (path / "__init__.py").is_file()]
    assert len(top) <= TOP_LEVEL_MODULES_AT_MOST, sorted(top)


@pytest.mark.parametrize("module", _torch_free_modules())
def test_only_the_capture_and_the_device_setup_import_torch(module: str):
    violations = _violations(module, {"torch", "torch_npu"})
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize(
    "module, forbidden",
    [("rules", {"migrate", "verify"}), ("verify.cli", {"migrate", "rules", "libcst"}),
     (FRAMEWORKS, {"torch", "libcst", "pandas", "numpy", "typer"}),
     *((name, {"torch"}) for name in ("verify.cli", "verify.compare.runs", "verify.report.writers",
                                      "verify.record.msprobe", "verify.launch.runner"))],
)
def test_importing_loads_no_forbidden_package(module: str, forbidden: set[str]):
    """What a fresh interpreter holds after the import: catches imports made by code that runs at import time."""
    code = (
        f"import sys, importlib; m = importlib.import_module({module!r}); "
        f"getattr(m, 'all_rules', lambda: None)(); "  # the registry imports every rule module
        # the frameworks leaf, and the empty `verify` package above it, are no layer of verify's
        f"print(sorted({{n.split('.')[0] for n in sys.modules if n != 'verify' and not n.startswith({FRAMEWORKS!r})}}"
        f" & set({sorted(forbidden)!r})))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]", f"importing {module} loaded {loaded.stdout.strip()}"


def test_rules_and_the_engine_import_only_the_public_rules_module():
    """A rule imports from `rules` and its own family's helpers; migrate from `rules` alone (rules/__init__.py)."""
    violations = []
    for module in _modules():
        parts = module.split(".")
        is_rule = parts[0] == "rules" and len(parts) > 2 and parts[1] != "framework"
        if not (is_rule or parts[0] == "migrate"):
            continue
        for imported, line in sorted(_imports(module)):
            inside = imported.split(".")
            if inside[0] != "rules" or len(inside) == 1 or (is_rule and inside[1] == parts[1]):
                continue
            violations.append(f"{_modules()[module].relative_to(ROOT)}:{line} imports {imported}")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("package", PACKAGES)
def test_the_generic_package_names_resolve_to_this_project(package: str):
    """`migrate`, `rules` and `verify` are common names: the installed ones must be these."""
    found = subprocess.run([sys.executable, "-c", f"import {package}; print({package}.__file__)"], cwd=ROOT.parent,
                           capture_output=True, text=True, check=True)
    assert Path(found.stdout.strip()).resolve().parent == ROOT / package
