"""The seed a script already has, for every seed migrate inserts (no rule lives here).

Where a script has a seed of its own, the seeds migrate adds use it, so that one value, the script's, decides every
generator; `migrate --seed N` supplies a seed only to a script that has none. The script's seed is, first found:
- the argument of its own seeding call (`torch.manual_seed(args.seed)`, `random.seed(SEED)`, `set_seed(42)`), with
  the `if` that call runs under where that tests the seed (`if args.seed is not None:`);
- a command-line option naming a seed (`--seed`, `--manualSeed`): `args.seed` for `args = parser.parse_args()`,
  tested `args.seed is not None` where the option has no default;
- a module-level `seed` or `SEED` variable.
A seed is used only where the names it reads are bound (`bound_where`); elsewhere the literal stands in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

import libcst as cst
import libcst.matchers as m

from rules import argument, dotted_name, findall, frameworks, matches, method, string_value

LineOf = Callable[[cst.CSTNode], int]


class Names(Protocol):
    """How a rule reads names (a PortRule is one)."""

    def qualified_names(self, node: cst.CSTNode) -> set[str]: ...

    def refers_to(self, node: cst.CSTNode, *names: str) -> bool: ...


# What seeds each random number generator a training script uses, by qualified name.
SEED_CALLS = {
    "random.seed": "random",
    "numpy.random.seed": "numpy",
    "torch.manual_seed": "torch",
    "torch.random.manual_seed": "torch",
    "torch.cuda.manual_seed": "device",
    "torch.cuda.manual_seed_all": "device",
    "torch.npu.manual_seed": "device",
    "torch.npu.manual_seed_all": "device",
    "torch_npu.npu.manual_seed": "device",
    "torch_npu.npu.manual_seed_all": "device",
}
# ... and the frameworks' helpers that seed every generator at once.
_SEEDERS = (*SEED_CALLS, *sorted(frameworks.SEED_EVERYTHING))


@dataclass(frozen=True)
class ScriptSeed:
    value: cst.BaseExpression  # `args.seed`, `SEED`, `0`
    origin: str  # where it comes from, for the report
    guard: cst.BaseExpression | None  # the test the script seeds under, where the seed may be None

    @property
    def text(self) -> str:
        return _code(self.value)

    @property
    def names(self) -> frozenset[str]:
        """The names the seed reads: `args` for `args.seed`."""
        attributes = {id(node.attr) for node in findall(self.value, m.Attribute())}  # type: ignore[attr-defined]
        return frozenset(
            name.value for name in findall(self.value, m.Name()) if id(name) not in attributes  # type: ignore
        )

    def described(self) -> str:
        """`args.seed` (the script's --seed option; only where `args.seed is not None`, as the script seeds)."""
        when = f"; only where `{_code(self.guard)}`, as the script seeds" if self.guard is not None else ""
        return f"`{self.text}` ({self.origin}{when})"

    def guarded(self, expression: str) -> str:
        """`expression`, or None where the script would not seed: `G.manual_seed(s) if s is not None else None`."""
        return expression if self.guard is None else f"{expression} if {_code(self.guard)} else None"


def seed_calls(module: cst.Module, names: Names) -> list[tuple[cst.Call, str]]:
    """The script's seeding calls and the generator each seeds ("random", "numpy", "torch", "device", "all")."""
    found = []
    for call in findall(module, m.Call()):
        if not names.refers_to(call.func, *_SEEDERS):  # type: ignore[attr-defined]
            continue  # most calls of a file: resolved only when their name could be a seeder's
        qualified = names.qualified_names(call.func)  # type: ignore[attr-defined]
        kinds = [SEED_CALLS[name] for name in qualified if name in SEED_CALLS]
        found.append((call, kinds[0] if kinds else "all"))  # else a framework's seed-everything helper
    return found  # type: ignore[return-value]


def seed_anchor(calls: list[tuple[cst.Call, str]]) -> cst.Call:
    """The seeding call whose seed counts: the one that seeds torch (or everything), else the last."""
    return next((call for call, kind in calls if kind in ("torch", "all")), calls[-1][0])


def script_seed(module: cst.Module, names: Names) -> ScriptSeed | None:
    """The seed the script has of its own, or None."""
    calls = [(call, kind) for call, kind in seed_calls(module, names) if call.args]
    if calls:
        call = seed_anchor(calls)
        value = call.args[0].value
        return ScriptSeed(value, f"the script's {_code(call.func)}(...)", _guard(module, call, value))
    return _option_seed(module) or _variable_seed(module)


def bound_where(seed: ScriptSeed, module: cst.Module, call: cst.Call, line_of: LineOf) -> bool:
    """Whether every name the seed reads is bound where `call` runs: a parameter of a function around it, a name
    that function binds before it, or a module-level name (bound before it where it runs at module level)."""
    functions = [f for f in findall(module, m.FunctionDef()) if _holds(f, call)]
    line = line_of(call)
    for name in seed.names:
        local = (name in _parameters(f) or _first_binding(_body(f), name, line_of) < line for f in functions)
        if any(local):
            continue
        at_module = _first_binding(module.body, name, line_of)
        if at_module < line or (functions and at_module < _NEVER):  # a function runs after the module bound it
            continue
        return False
    return True


_NEVER = float("inf")


def bound_at_start(seed: ScriptSeed, module: cst.Module, entry: cst.CSTNode, line_of: LineOf) -> bool:
    """Whether the seed's names are bound when `entry` (a function, the `__main__` block) starts: parameters of the
    function or names of the module (bound before the block)."""
    if isinstance(entry, cst.FunctionDef):
        return all(name in _parameters(entry) or _first_binding(module.body, name, line_of) < _NEVER
                   for name in seed.names)
    return isinstance(entry, cst.If) and all(
        _first_binding(module.body, name, line_of) < line_of(entry) for name in seed.names
    )


def last_binding(body: list[cst.BaseStatement], names: frozenset[str]) -> int | None:
    """The index of the last statement of `body` that binds one of `names` at its own level."""
    found = [index for index, statement in enumerate(body) if names & _bound_names(statement)]
    return found[-1] if found else None


def _guard(module: cst.Module, call: cst.Call, value: cst.BaseExpression) -> cst.BaseExpression | None:
    """The test of the innermost `if` whose body holds `call` and that tests the seed `value`."""
    text = _code(value)
    tests = [branch.test for branch in findall(module, m.If()) if _holds(branch.body, call)]  # type: ignore
    return next((test for test in reversed(tests) if text in _code(test)), None)


def _option_seed(module: cst.Module) -> ScriptSeed | None:
    options = [call for call in findall(module, m.Call()) if _is_seed_option(call)]  # type: ignore[arg-type]
    namespace = _parsed_arguments(module)
    if not options or namespace is None:
        return None
    exact = [call for call in options if string_value(call.args[0].value) == "--seed"]  # type: ignore[attr-defined]
    option = (exact or options)[0]
    flag = string_value(option.args[0].value) or ""  # type: ignore[attr-defined]
    dest = argument(option, None, "dest")  # type: ignore[arg-type]
    name = (string_value(dest.value) if dest else None) or flag.lstrip("-").replace("-", "_")
    value = cst.parse_expression(f"{namespace}.{name}")
    default = argument(option, None, "default")  # type: ignore[arg-type]
    guard = None
    if default is None or matches(default.value, m.Name("None")):
        guard = cst.parse_expression(f"{namespace}.{name} is not None")
    return ScriptSeed(value, f"the script's {flag} option", guard)


def _is_seed_option(call: cst.Call) -> bool:
    if method(call) != "add_argument" or not call.args:
        return False
    flag = string_value(call.args[0].value) or ""
    return flag.startswith("--") and "seed" in flag.lower()


def _parsed_arguments(module: cst.Module) -> str | None:
    """The name bound to `parser.parse_args()` (or the first of `parse_known_args()`), if any."""
    parse = m.Call(func=m.Attribute(attr=m.Name("parse_args") | m.Name("parse_known_args")))
    for assign in findall(module, m.Assign(value=parse)):
        target = assign.targets[0].target  # type: ignore[attr-defined]
        if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
            target = target.elements[0].value
        if isinstance(target, cst.Name):
            return target.value
    return None


def _variable_seed(module: cst.Module) -> ScriptSeed | None:
    for line in module.body:
        for assign in findall(line, m.Assign(targets=[m.AssignTarget(m.Name())])):
            name = assign.targets[0].target.value  # type: ignore[attr-defined]
            if name.lower() == "seed":
                return ScriptSeed(cst.Name(name), f"the script's {name} variable", None)
    return None


def _holds(node: cst.CSTNode, call: cst.Call) -> bool:
    return any(found is call for found in findall(node, m.Call()))


def _parameters(function: cst.FunctionDef) -> set[str]:
    params = function.params
    every = [*params.posonly_params, *params.params, *params.kwonly_params]
    every += [star for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)]
    return {param.name.value for param in every}


def _first_binding(body: Iterable[cst.BaseStatement], name: str, line_of: LineOf) -> float:
    """The line of the first statement of `body` (compound statements included, function and class bodies left
    out) that binds `name`; infinity where none does."""
    lines = [line_of(statement) for statement in _statements(body) if name in _bound_names(statement)]
    return min(lines, default=_NEVER)


def _statements(body: Iterable[cst.BaseStatement]) -> Iterator[cst.BaseStatement]:
    """The statements of `body` and of the blocks of its `if`/`for`/`with`/`try`... (not of functions or classes)."""
    for statement in body:
        yield statement
        if not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in _blocks(statement):
                yield from _statements(block.body)


def _blocks(node: cst.CSTNode) -> Iterator[cst.IndentedBlock]:
    for child in node.children:
        if isinstance(child, cst.IndentedBlock):
            yield child
        elif isinstance(child, (cst.If, cst.Else, cst.ExceptHandler, cst.Finally)):
            yield from _blocks(child)


def _body(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    return list(function.body.body) if isinstance(function.body, cst.IndentedBlock) else []


def _bound_names(statement: cst.BaseStatement) -> set[str]:
    """The names a statement binds at its own level: assignments, imports, definitions, `for`/`with` targets."""
    if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
        return {statement.name.value}
    targets: list[cst.CSTNode] = []
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            if isinstance(small, cst.Assign):
                targets += [target.target for target in small.targets]
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                targets.append(small.target)
            elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                return {_imported_as(alias) for alias in small.names}
    elif isinstance(statement, cst.For):
        targets.append(statement.target)
    elif isinstance(statement, cst.With):
        targets += [item.asname.name for item in statement.items if item.asname is not None]
    return {name for target in targets for name in _target_names(target)}


def _imported_as(alias: cst.ImportAlias) -> str:
    """`np` for `import numpy as np`, `torch` for `import torch.nn`."""
    return alias.asname.name.value if alias.asname else dotted_name(alias.name).split(".")[0]  # type: ignore


def _target_names(target: cst.CSTNode) -> Iterator[str]:
    if isinstance(target, cst.Name):
        yield target.value
    elif isinstance(target, (cst.Tuple, cst.List)):
        for element in target.elements:
            yield from _target_names(element.value)


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)
