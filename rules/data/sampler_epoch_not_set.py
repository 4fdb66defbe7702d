from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from rules import Case, Flag, PortRule, Unchanged, dotted_name, findall, matches, visit

_SAMPLER = {"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"}
_EPOCH = re.compile(r"epoch", re.IGNORECASE)


@dataclass
class _Sampler:
    name: str  # "train_sampler", "self.sampler"
    node: cst.CSTNode  # the DistributedSampler(...) call, for the finding's position
    maybe_none: bool  # also assigned None somewhere (the non-distributed branch)


class SamplerEpochNotSet(PortRule):
    """Call `sampler.set_epoch(epoch)` at the top of the epoch loop when a DistributedSampler never gets it.

    ## What it does
    When a variable holds a `DistributedSampler` and the file never calls `.set_epoch(...)`, inserts
    `sampler.set_epoch(epoch)` as the first statement of the `for epoch in ...` loop of the same function (guarded by
    `if sampler is not None:` when the variable is None on the non-distributed path). A sampler with no epoch loop
    beside it, or created inline in a DataLoader, is reported.

    ## Why
    DistributedSampler shuffles with a generator seeded by `seed + epoch`; without `set_epoch` every epoch repeats the
    first epoch's order, so the port trains on a different data order than a correct original (checklist C7).

    ## Safety
    Safe: `set_epoch` only sets the epoch the sampler shuffles with. If the original also lacks it, fix both sides.

    ## References
    torch/utils/data/distributed.py (set_epoch docstring).
    """

    CODE = "DATA002"
    CHECKLIST = ("C7",)
    TRIGGERS = ("DistributedSampler",)
    EXAMPLES = (
        Case(
            """
            from torch.utils.data.distributed import DistributedSampler

            def main(args):
                train_sampler = DistributedSampler(dataset) if args.distributed else None
                for epoch in range(args.epochs):  # epochs
                    train(loader, epoch)
            """,
            """
            from torch.utils.data.distributed import DistributedSampler

            def main(args):
                train_sampler = DistributedSampler(dataset) if args.distributed else None
                for epoch in range(args.epochs):  # epochs
                    if train_sampler is not None:
                        train_sampler.set_epoch(epoch)
                    train(loader, epoch)
            """,
            lines=[5],
        ),
        Case(
            """
            import torch.utils.data as data
            sampler = data.distributed.DistributedSampler(dataset, shuffle=True)
            for ep in range(num_epochs): train(ep)
            """,
            """
            import torch.utils.data as data
            sampler = data.distributed.DistributedSampler(dataset, shuffle=True)
            for ep in range(num_epochs):
                sampler.set_epoch(ep)
                train(ep)
            """,
            lines=[3],
        ),
        Flag(
            """
            from torch.utils.data import DataLoader, DistributedSampler
            loader = DataLoader(dataset, sampler=DistributedSampler(dataset))
            """,
            lines=[2],
        ),
        Unchanged(
            """
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset)
            for epoch in range(3):
                loader.sampler.set_epoch(epoch)
            """
        ),
        Unchanged(
            """
            from torch.utils.data import DistributedSampler
            sampler = DistributedSampler(dataset, shuffle=False)  # no shuffling: the epoch changes nothing
            """
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._scopes: list[cst.CSTNode] = []  # enclosing functions, innermost last
        self._samplers: dict[cst.CSTNode, list[_Sampler]] = {}  # scope -> samplers assigned there
        self._handled: set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        self._scopes.append(node)
        if not findall(node, m.Call(func=m.Attribute(attr=m.Name("set_epoch")))):
            self._collect(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._scopes.pop()
        return updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        for samplers in self._samplers.values():
            for sampler in samplers:
                if sampler.name not in self._handled:
                    self.report(sampler.node, *_NO_LOOP)
        return updated_node

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if not _is_epoch_loop(original_node):
            return updated_node
        pending = [s for s in self._samplers.get(self._scopes[-1], []) if s.name not in self._handled]
        if not pending:
            return updated_node
        body = updated_node.body
        if isinstance(body, cst.SimpleStatementSuite):  # `for ep in r: train(ep)` on one line
            body = cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[statement]) for statement in body.body])
        return self._insert(original_node, updated_node, pending, body)

    def _insert(self, original: cst.For, updated: cst.For, pending: list[_Sampler], body: cst.IndentedBlock) -> cst.For:
        epoch = original.target.value  # type: ignore[attr-defined]
        calls = [_set_epoch(sampler, epoch) for sampler in pending]
        new = updated.with_changes(body=body.with_changes(body=[*calls, *body.body]))
        self._handled.update(sampler.name for sampler in pending)
        names = ", ".join(sampler.name for sampler in pending)
        return self.replace(original, updated, new, f"added {names}.set_epoch({epoch}) at the start of the epoch loop")

    def _collect(self, module: cst.Module) -> None:
        """Find `x = DistributedSampler(...)` assignments, grouped by enclosing function."""
        collector = _AssignmentCollector(self)
        visit(module, collector)
        self._samplers = collector.samplers
        for call in collector.inline:
            self.report(call, *_NO_LOOP)


_NO_LOOP = (
    "DistributedSampler without set_epoch(): every epoch repeats the first epoch's shuffle",
    "Call `sampler.set_epoch(epoch)` at the start of each epoch (e.g. `loader.sampler.set_epoch(epoch)`).",
)


def _is_epoch_loop(loop: cst.For) -> bool:
    """`for epoch in ...`, or `for ep in range(args.epochs)`: the loop variable or the iterable says epoch."""
    if not isinstance(loop.target, cst.Name):
        return False
    return bool(_EPOCH.search(loop.target.value) or _EPOCH.search(cst.Module([]).code_for_node(loop.iter)))


def _set_epoch(sampler: _Sampler, epoch: str) -> cst.BaseStatement:
    code = f"{sampler.name}.set_epoch({epoch})\n"
    if sampler.maybe_none:
        code = f"if {sampler.name} is not None:\n    {code}"
    return cst.parse_statement(code)


class _AssignmentCollector(cst.CSTVisitor):
    """Samplers assigned to a name or attribute, per enclosing function; inline ones (no name) apart."""

    def __init__(self, rule: SamplerEpochNotSet):
        super().__init__()
        self.rule = rule
        self.scopes: list[cst.CSTNode] = []
        self.samplers: dict[cst.CSTNode, list[_Sampler]] = {}
        self.assigned: set[cst.CSTNode] = set()
        self.inline: list[cst.Call] = []
        self.none_names: set[str] = set()

    def visit_Module(self, node: cst.Module) -> None:
        self.scopes.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()

    def visit_Assign(self, node: cst.Assign) -> None:
        name = dotted_name(node.targets[0].target) if len(node.targets) == 1 else ""
        if matches(node.value, m.Name("None")):
            self.none_names.add(name)
        call = self._sampler_call(node.value)
        if name and call is not None:
            self.assigned.add(call)
            maybe_none = isinstance(node.value, cst.IfExp)
            self.samplers.setdefault(self.scopes[-1], []).append(_Sampler(name, call, maybe_none))

    def visit_Call(self, node: cst.Call) -> None:
        if self.rule.refers_to(node.func, *_SAMPLER) and node not in self.assigned and _shuffles(node):
            self.inline.append(node)

    def leave_Module(self, original_node: cst.Module) -> None:
        for samplers in self.samplers.values():
            for sampler in samplers:
                sampler.maybe_none = sampler.maybe_none or sampler.name in self.none_names
        for scope, samplers in list(self.samplers.items()):
            self.samplers[scope] = [s for s in samplers if _shuffles(s.node)]  # type: ignore[arg-type]

    def _sampler_call(self, value: cst.BaseExpression) -> cst.Call | None:
        for candidate in (value, getattr(value, "body", None), getattr(value, "orelse", None)):
            if isinstance(candidate, cst.Call) and self.rule.refers_to(candidate.func, *_SAMPLER):
                return candidate
        return None


def _shuffles(call: cst.Call) -> bool:
    return not any(
        arg.keyword is not None and arg.keyword.value == "shuffle" and matches(arg.value, m.Name("False"))
        for arg in call.args
    )
